"""A plugin's processor inside mmw's generation (torch).

The plugin's processor sees the temperature-scaled logits of a step (transformers runs its watermark processors
after the warpers the same way) and mmw samples the next token from the softmax of what it returns, with the same
per-row PRF uniforms as plain sampling (``mmw.watermark.processor``): the baseline and a plugin's texts differ only by the
plugin, and a run is reproducible from its seed and key. A processor that already picks the token (-inf everywhere
else, as vLLM's Gumbel-max sampler does) passes through unchanged. A processor that changes the batch's shape or
returns NaN/+inf is refused with one line naming the plugin (``SpecError``, exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mmw.errors import SpecError
from mmw.watermark import prf
from mmw.watermark.plugins import plugin_params
from mmw.watermark.processor import (
    RecordingLogitsProcessor,
    choice_logits,
    entropies,
    row_state,
)
from mmw.watermark.samplers.base import inverse_cdf
from mmw.watermark.scheme import SchemeSpec

#: What the preflight feeds a plugin: rows, prompt tokens and decoding steps of a random batch.
PREFLIGHT_ROWS, PREFLIGHT_PROMPT, PREFLIGHT_STEPS = 2, 8, 3


class PluginProcessor(RecordingLogitsProcessor):
    """mmw's recording processor around a plugin's: one batch of rows (``row_seeds``), as ``WatermarkProcessor``.

    Returns logits that are -inf except at the chosen token (the engine decodes greedily over them)."""

    def __init__(self, spec: SchemeSpec, key: int, vocab_size: int, row_seeds: Sequence[int], temperature: float):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        super().__init__()
        plugin, params = plugin_params(spec)
        self.name, self.vocab_size, self.temperature = spec.plugin, vocab_size, float(temperature)
        self.inner = plugin.processor(params, key, vocab_size, self.temperature, [int(s) for s in row_seeds])
        self.sample_base = row_state(None, row_seeds)["sample_base"]
        self.steps: torch.Tensor | None = None

    def _check(self, out: object, shape: torch.Size) -> torch.Tensor:
        setting = f"scheme.plugin ({self.name})"
        if not isinstance(out, torch.Tensor) or out.shape != shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise SpecError(setting, f"the processor changed the batch's shape from {tuple(shape)} to {got}",
                            "a processor returning scores of the shape it is given")
        if torch.isnan(out).any() or torch.isposinf(out).any() or torch.isneginf(out).all(-1).any():
            raise SpecError(setting, "the processor returned NaN or +inf scores (or a row that is -inf everywhere)",
                            "finite scores (-inf only to exclude tokens)")
        return out

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: int64 [B, S] (prompt + generated so far); scores: float [B, V'] raw logits."""
        logits = scores[:, : self.vocab_size]
        if self.steps is None:  # the transformers engine: one call a step from step 0 (the vLLM engine sets it)
            self.steps = torch.zeros(scores.shape[0], dtype=torch.int64, device=scores.device)
        self.sample_base = self.sample_base.to(scores.device)
        entropy, spike = entropies(logits)
        self.entropy.append(entropy)
        self.spike_entropy.append(spike)
        scaled = logits / self.temperature if self.temperature > 0 else logits
        out = self._check(self.inner(input_ids, scaled.clone()), scaled.shape)
        if self.temperature == 0:
            chosen = out.argmax(dim=-1)
        else:
            u = prf.unit_t(prf.prf_t(self.sample_base, self.steps))
            chosen = inverse_cdf(torch.softmax(out.to(torch.float64), dim=-1), u)
        self.steps += 1
        return choice_logits(scores, chosen)


def preflight(spec: SchemeSpec, key: int, vocab_size: int, temperature: float) -> None:
    """Run the plugin's processor on a small random batch before any real work, so a processor that changes the
    batch's shape or returns NaN/inf fails with one line at once (the detect stage checks the detector the same
    way: ``mmw.watermark.plugin_detection.preflight_detector``)."""
    rng = np.random.default_rng(0)
    proc = PluginProcessor(spec, key, vocab_size, list(range(PREFLIGHT_ROWS)), temperature)
    ids = torch.from_numpy(rng.integers(0, vocab_size, (PREFLIGHT_ROWS, PREFLIGHT_PROMPT)))
    for _ in range(PREFLIGHT_STEPS):
        scores = torch.from_numpy(rng.normal(size=(PREFLIGHT_ROWS, vocab_size)).astype(np.float32))
        ids = torch.cat([ids, proc(ids, scores).argmax(-1, keepdim=True)], dim=1)
