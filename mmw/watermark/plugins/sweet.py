"""SWEET-style entropy-thresholded detection over transformers' KGW (lefthash) generation: a model-aware detector.

Generation is the ``hf_kgw`` adapter's: transformers' ``WatermarkLogitsProcessor``, unmodified. Detection
(SWEET, Lee et al. 2024, "Who Wrote this Code?") scores only the tokens at which the generator's next-token
distribution has entropy >= ``entropy_threshold`` nats: low-entropy tokens carry little watermark and dilute the
count. The entropies need the language model at detection, so the plugin declares ``needs_model`` and reads the
generator's logits per position from :class:`mmw.watermark.plugins.DetectionModel`.

The null stays exact: under H0 the green verdict of each distinct n-gram is Bernoulli(gamma) over the key, and
the entropy mask is a function of the text alone (not of the key), so the count over the kept units is
Binomial(kept, gamma) as for plain KGW; every size works. Measured on real null text: bench/plugins.py --sweet.
"""

from __future__ import annotations

import numpy as np

from mmw.watermark.plugins import DetectionModel, Pivots, PluginDetector, WatermarkPlugin
from mmw.watermark.plugins.hf_kgw import KGW, KGWDetector, KGWParams
from mmw.validation import allowed


class SweetParams(KGWParams):
    entropy_threshold: float = allowed("a number >= 0 (nats; SWEET's tau)", default=0.9, ge=0.0, le=100.0)


def entropies(logits: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of softmax(logits) per row: float64 [N] from float [N, V]."""
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)


class SweetDetector(PluginDetector):
    def __init__(self, params: SweetParams, key: int, vocab_size: int, model: DetectionModel):
        self.params, self.model = params, model
        self.kgw = KGWDetector(params, key, vocab_size)

    def score(self, tokens: np.ndarray) -> Pivots:
        tokens = np.asarray(tokens, dtype=np.int64)
        green, units = self.kgw.greens(tokens)
        high = entropies(self.model.logits(tokens)) >= self.params.entropy_threshold if len(tokens) else units > 0
        units = np.where(high, units, 0)
        return Pivots(values=-green * units, units=units, null="green", gamma=float(self.kgw.gamma))


class SweetKGW(WatermarkPlugin):
    """KGW as transformers ships it, detected SWEET's way (high-entropy tokens only)."""

    label = "KGW + SWEET detection (transformers)"
    distortion_free = False
    needs_model = True
    Params = SweetParams

    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return KGW().processor(params, key, vocab_size, temperature, row_seeds)

    def detector(self, params, key, vocab_size, model=None):
        return SweetDetector(params, key, vocab_size, model)
