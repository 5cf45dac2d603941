"""Power: every combination SchemeSpec accepts detects synthetic watermarked text of moderate length.

A combination whose detector can never fire (the binary x edit defect: p = 1 for every text, while every
false-positive test passes) cannot hide here: ``test_every_accepted_combination_has_a_power_case`` walks the
whole sampler x randomness x score space, and any triple SchemeSpec accepts must appear in ``POWER_GRID``,
where it has to detect >= ``MIN_RATE`` of its watermarked texts — and, so that "always detected" cannot pass,
at most the binomial band of the same model's unwatermarked texts.

Synthetic model: at every step, uniform over a random subset of 16 of 1,000 tokens (entropy log 16 = 2.8 nats,
well above real chat models' ~1 nat at temperature 1, so "moderate length" can stay short and the test fast).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mmw.calibration import binomial_band, generate_synthetic, uniform_subset_model
from mmw.watermark.detector import Detector
from mmw.errors import SpecError
from mmw.watermark.prf import key_from_string
from mmw.watermark.scheme import RANDOMNESS, SAMPLERS, SCORES, SchemeSpec

KEY = key_from_string("power-test key")
VOCAB = 1000
ROWS = 24
LENGTH = 100  # tokens of watermarked text: "moderate length"
ALPHA = 0.02
MIN_RATE = 0.9  # share of watermarked texts detected at alpha (full-text p-value)

SAMPLER_PARAMS = {
    "distribution_shift": dict(sampler="distribution_shift", delta=2.0, gamma=0.5),
    "exponential": dict(sampler="exponential"),
    "inverse_transform": dict(sampler="inverse_transform"),
    "binary": dict(sampler="binary"),
    "tournament": dict(sampler="tournament", layers=30),
    "reweight": dict(sampler="reweight", reweight_alpha=0.5),
    "permute_flip": dict(sampler="permute_flip"),
}
# Representative randomness x score settings (constant randomness, short and longer windows, min-hash, a fixed key).
SOURCE_PARAMS = {
    "sum": [dict(randomness="window", window=0), dict(randomness="window", window=1),
            dict(randomness="window", window=3), dict(randomness="minhash", window=3),
            dict(randomness="selfhash", window=3)],
    "align": [dict(randomness="fixed", key_length=16)],
    "edit": [dict(randomness="fixed", key_length=16, psi=0.5), dict(randomness="window", window=1, psi=0.5),
             dict(randomness="minhash", window=1, psi=0.0)],
}
# Per-sampler variants on top: the binary code choice and the skip probability of the distortion-free samplers.
EXTRA = {
    "binary": [dict(binary_code="huffman"), dict(binary_code="fixed"), dict(skip_prob=0.2)],
    "exponential": [dict(), dict(skip_prob=0.2)],
    "inverse_transform": [dict(), dict(skip_prob=0.2)],
    "distribution_shift": [dict(), dict(delta=4.0, gamma=0.25)],
    "tournament": [dict()],
    "reweight": [dict()],
    "permute_flip": [dict(), dict(mask_repeated=True)],
}


def params_of(sampler: str, source: dict, score: str, extra: dict) -> dict:
    params = {**SAMPLER_PARAMS[sampler], **source, **extra, "score": score, "alpha": ALPHA}
    if score != "sum":
        params["trials"] = 99
    return params


def accepted(params: dict) -> bool:
    try:
        SchemeSpec.from_params(params)
    except SpecError:
        return False
    return True


def case_id(params: dict) -> str:
    skip = {"sampler", "score", "randomness", "alpha", "trials"}
    rest = ",".join(f"{k}={v}" for k, v in params.items() if k not in skip)
    return f"{params['sampler']}-{params['randomness']}-{params['score']}[{rest}]"


POWER_GRID = [params_of(a, src, score, extra)
              for a in SAMPLER_PARAMS for score in SOURCE_PARAMS for src in SOURCE_PARAMS[score] for extra in EXTRA[a]]
POWER_GRID = [p for p in POWER_GRID if accepted(p)]


def test_every_accepted_combination_has_a_power_case():
    """Any (sampler, randomness, score) that SchemeSpec accepts with some window/key length/psi is covered."""
    covered = {(p["sampler"], p["randomness"], p["score"]) for p in POWER_GRID}
    own = [s for s in SAMPLERS if s != "plugin"]  # a plugin brings its own randomness and detector (test_plugins.py)
    for sampler, randomness, score in itertools.product(own, RANDOMNESS, SCORES):
        probes = ([dict(key_length=n) for n in (2, 16, 256)] if randomness == "fixed"
                  else [dict(window=h) for h in (0, 1, 2, 3)])
        for probe in probes:
            extra = {"psi": 0.5} if score == "edit" else {}
            params = params_of(sampler, {"randomness": randomness, **probe, **extra}, score, {})
            if accepted(params):
                assert (sampler, randomness, score) in covered, f"no power case for accepted {case_id(params)}"
    assert len(covered) >= 15  # 4 samplers x (window, minhash) sum + 4 align + 3 samplers x 3 edit sources


MODEL = uniform_subset_model(VOCAB, support=16, rows=ROWS, seed=21)


@pytest.fixture(scope="module")
def unwatermarked() -> list[np.ndarray]:
    """The same synthetic model sampled without a watermark."""
    return list(generate_synthetic(None, None, MODEL, rows=ROWS, length=LENGTH, vocab_size=VOCAB, seed=5))


@pytest.mark.parametrize("params", POWER_GRID, ids=case_id)
def test_accepted_combination_detects_watermarked_text(params, unwatermarked):
    spec = SchemeSpec.from_params(params)
    marked = generate_synthetic(spec, KEY, MODEL, rows=ROWS, length=LENGTH, vocab_size=VOCAB, seed=5)
    detector = Detector(spec, KEY, VOCAB)
    rate = np.mean([r.detected for r in detector.detect(list(marked))])
    assert rate >= MIN_RATE, f"{spec.describe()}: detected {rate:.2f} of {ROWS} watermarked texts of {LENGTH} tokens"
    # A detector that always fires would pass the line above; the unwatermarked texts keep it honest. Constant and
    # fixed randomness share their draws across texts (correlated verdicts), so the band gets a generous margin.
    false_alarms = np.mean([r.detected for r in detector.detect(unwatermarked)])
    assert false_alarms <= binomial_band(ROWS, ALPHA, level=0.999)[1] + 1 / ROWS, (spec.describe(), false_alarms)
