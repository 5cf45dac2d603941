"""C1's repeated-context mask (``scheme.mask_repeated``, vLLM's gumbel behaviour): a context seen before in the
generation is sampled plainly, so the exponential sampler cannot lock a text into a loop; detection is unchanged
(the deduplicated sum counts each seed once), and the mask refuses randomness that has no per-step seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from mmw.watermark import prf
from mmw.errors import SpecError
from mmw.watermark.processor import WatermarkStep, row_state
from mmw.watermark.samplers.base import Plain
from mmw.watermark.scheme import DETECTION_KEYS, SchemeSpec

KEY = 20240607
LOGITS = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))


def c1(**extra) -> SchemeSpec:
    return SchemeSpec.from_params({"sampler": "exponential", "randomness": "window", "window": 1, "score": "sum",
                                   **extra})


def two_steps_on_one_context(spec: SchemeSpec, rows: int = 4000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every row sees context token 7 twice (window 1: the same seed at both steps). Returns the choices of the
    two steps and plain sampling's choice at the second (the row's own uniform)."""
    v = LOGITS.shape[0]
    step = WatermarkStep(spec, KEY, v, 1.0, compiled=False)
    state = row_state(spec, list(range(rows)))
    history = step.new_history(rows, "cpu")
    context = torch.full((rows, 1), 7, dtype=torch.int64)
    logits = LOGITS.expand(rows, v).clone()
    chosen = [step(logits, context, torch.full((rows,), k, dtype=torch.int64), **state, history=history)[0]
              for k in range(2)]
    plain_u = prf.unit_t(prf.prf_t(state["sample_base"], torch.ones(rows, dtype=torch.int64)))
    return chosen[0], chosen[1], Plain(None, 0, v).choose(logits, None, 1.0, plain_u)


def test_with_the_mask_a_repeated_context_is_sampled_plainly() -> None:
    first, second, plain = two_steps_on_one_context(c1(mask_repeated=True))
    # Gumbel-max with one seed shared by every row and the same logits: one token everywhere (the watermark).
    assert len(torch.unique(first)) == 1
    assert torch.equal(second, plain)
    # ... which follows the model's law across rows (it would be a point mass if the seed were used again)
    counts = np.bincount(second.numpy(), minlength=LOGITS.shape[0])
    assert stats.chisquare(counts, torch.softmax(LOGITS.double(), -1).numpy() * len(second)).pvalue > 1e-3


def test_without_the_mask_a_repeated_context_repeats_its_watermarked_choice() -> None:
    """The behaviour the mask removes: the same seed and logits give C1 the same token again (the loop)."""
    first, second, plain = two_steps_on_one_context(c1())
    assert torch.equal(second, first)
    assert not torch.equal(second, plain)


def test_the_mask_changes_generation_only() -> None:
    assert "mask_repeated" not in DETECTION_KEYS
    assert c1(mask_repeated=True).describe() == "exponential window H=1 repeats plain sum"
    assert c1().mask_repeated is None and "mask_repeated" not in c1().to_dict()  # old configurations keep their ids


@pytest.mark.parametrize(("extra", "blamed", "allowed"), [
    ({"randomness": "selfhash", "window": 4}, "scheme.mask_repeated", "randomness=window / minhash"),
    ({"randomness": "fixed", "window": None, "key_length": 256, "score": "align"}, "scheme.mask_repeated",
     "randomness=window / minhash"),
    ({"window": 0}, "scheme.window", "an integer >= 1"),
])
def test_the_mask_refuses_randomness_without_a_seed_per_step(extra, blamed, allowed) -> None:
    with pytest.raises(SpecError, match=allowed) as err:
        c1(mask_repeated=True, **extra)
    assert err.value.key == blamed


def test_another_sampler_is_told_the_key_is_not_its_own() -> None:
    with pytest.raises(SpecError, match="not used by sampler=distribution_shift"):
        SchemeSpec.from_params({"sampler": "distribution_shift", "randomness": "window", "window": 1, "delta": 2.0,
                                "score": "sum", "mask_repeated": True})
