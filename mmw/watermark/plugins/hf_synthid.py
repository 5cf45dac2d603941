"""transformers' SynthID-Text (``SynthIDTextWatermarkLogitsProcessor``) as a plugin, unmodified, with the exact null.

Generation runs transformers' processor: a tournament over ``depth`` layers of keyed g-values from the n-gram
context, repeated contexts left unwatermarked. Detection uses the same processor's own functions — its g-values
(``compute_g_values``), its repeated-context mask (``compute_context_repetition_mask``) and its EOS mask
(``compute_eos_token_mask``) — and no trained Bayesian detector: under H0 (text not written with these keys) each
g-value of an unmasked n-gram is a fair bit, independent across layers and distinct contexts, so the count of ones
among the unmasked units is Binomial(depth * n, 1/2): SynthID's mean score with an exact null. Each token is one
pivot of ``depth`` units (null "green", gamma 1/2), so every size works.

Approximation, measured in tests/test_plugins.py: the g-values are read from a fixed table of
``sampling_table_size`` random bits at hashed indices, so two units can share an entry (about
units^2 / (2 * table size) collisions); the FPR tests bound the effect.

The depth keys are derived one-way from mmw's key.
"""

from __future__ import annotations

import numpy as np

from mmw.watermark import prf
from mmw.watermark.plugins import Pivots, PluginDetector, WatermarkPlugin
from mmw.validation import Integer, Section, allowed

#: The PRF tag of the layer keys derived from mmw's key.
KEY_TAG = 0x5359_4E54  # "SYNT"


class SynthIDParams(Section):
    ngram_len: Integer = allowed("an integer >= 2 (SynthID: 5)", default=5, ge=2, le=64)
    depth: Integer = allowed("an integer >= 1 (tournament layers m; SynthID: 30)", default=30, ge=1, le=256)
    sampling_table_size: Integer = allowed("an integer >= 2", default=1 << 16, ge=2, le=1 << 24)
    sampling_table_seed: Integer = allowed("an integer >= 0", default=0, ge=0, le=(1 << 63) - 1)
    context_history_size: Integer = allowed("an integer >= 1", default=1024, ge=1, le=1 << 20)
    eos_token_id: Integer | None = allowed("a token id, or null (mmw's stored tokens end before EOS)", default=None,
                                           ge=0)


def layer_keys(key: int, depth: int) -> list[int]:
    """``depth`` keys of 31 bits (SynthID's hashing multiplies them in int64)."""
    return [prf.prf_int(key & prf.MASK64, KEY_TAG + i) & 0x7FFF_FFFF for i in range(depth)]


def reference_processor(params: SynthIDParams, key: int, device):
    from transformers.generation import SynthIDTextWatermarkLogitsProcessor

    return SynthIDTextWatermarkLogitsProcessor(
        ngram_len=params.ngram_len, keys=layer_keys(key, params.depth),
        sampling_table_size=params.sampling_table_size, sampling_table_seed=params.sampling_table_seed,
        context_history_size=params.context_history_size, device=device)


class _LazyDevice:
    """transformers' processor for one batch, built on the device of the first scores it sees."""

    def __init__(self, params: SynthIDParams, key: int):
        self.params, self.key, self.inner = params, key, None

    def __call__(self, input_ids, scores):
        if self.inner is None:
            self.inner = reference_processor(self.params, self.key, scores.device)
        return self.inner(input_ids, scores)


class SynthIDDetector(PluginDetector):
    def __init__(self, params: SynthIDParams, key: int, vocab_size: int):
        import torch

        self.params = params
        self.reference = reference_processor(params, key, torch.device("cpu"))

    def score(self, tokens: np.ndarray) -> Pivots:
        import torch

        n, m, depth = len(tokens), self.params.ngram_len, self.params.depth
        values, units = np.zeros(n), np.zeros(n, dtype=np.int64)
        if n >= m:
            ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64)).unsqueeze(0)
            g = self.reference.compute_g_values(ids)[0].numpy()  # [n - m + 1, depth]: the n-gram ending at m-1+i
            fresh = self.reference.compute_context_repetition_mask(ids)[0].numpy().astype(bool)
            eos = -1 if self.params.eos_token_id is None else self.params.eos_token_id
            not_eos = self.reference.compute_eos_token_mask(ids, eos)[0, m - 1:].numpy().astype(bool)
            keep = fresh & not_eos
            values[m - 1:] = np.where(keep, -g.sum(axis=1), 0.0)
            units[m - 1:] = np.where(keep, depth, 0)
        return Pivots(values=values, units=units, null="green", gamma=0.5)


class SynthID(WatermarkPlugin):
    """SynthID-Text's tournament as transformers ships it (non-distortionary mode)."""

    label = "SynthID-Text (transformers)"
    distortion_free = True
    Params = SynthIDParams

    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return _LazyDevice(params, key)

    def detector(self, params, key, vocab_size):
        return SynthIDDetector(params, key, vocab_size)
