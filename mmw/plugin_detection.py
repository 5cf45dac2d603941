"""A plugin's detector inside mmw's sizes (no torch): per-token pivots under a declared null give the exact p-value
of every prefix, E, the checkpoint size and the anytime size (``mmw.size``); per-prefix p-values give E and the
checkpoint size only (the anytime size is null, with the reason in ``anytime_unavailable``). A detector that breaks
its contract is refused with one line naming the plugin (``SpecError``, exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmw.detector import DetectionResult, Detector
from mmw.errors import SpecError
from mmw.plugins import (Pivots, PluginDetector, PrefixPValues, check_pivots, check_pvalues, plugin_params,
                         prefix_pvalues)
from mmw.scheme import SchemeSpec
from mmw.size import anytime_log_evalues, anytime_size, first_crossing, pivot_bets, valid_size

#: Tokens of the random text the preflight detects.
PREFLIGHT_TEXT = 48


class PluginSchemeDetector:
    """mmw's detector interface (``detect``, ``detect_text``) over a plugin's detector."""

    def __init__(self, spec: SchemeSpec, key: int, vocab_size: int):
        plugin, params = plugin_params(spec)
        self.name, self.spec, self.vocab_size = spec.plugin, spec, vocab_size
        self.inner: PluginDetector = plugin.detector(params, key, vocab_size)
        #: Why a text got no anytime size (None: it has one), from the last ``detect``.
        self.anytime_unavailable: str | None = None

    def detect(self, texts: Sequence[np.ndarray]) -> list[DetectionResult]:
        arrays = [np.asarray(t, dtype=np.int64) for t in texts]
        for t in arrays:
            if t.size and (t.min() < 0 or t.max() >= self.vocab_size):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got {t.min()}..{t.max()}")
        return [self._one(t) for t in arrays]

    def detect_text(self, tokenizer, texts: Sequence[str]) -> list[DetectionResult]:
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        return self.detect([np.array(i, dtype=np.int64) for i in ids])

    def _one(self, tokens: np.ndarray) -> DetectionResult:
        n, alpha = len(tokens), self.spec.alpha
        out = self.inner.score(tokens)
        log_e = anytime = None
        if isinstance(out, Pivots):
            check_pivots(out, n, self.name)
            total = np.cumsum(np.asarray(out.values, dtype=np.float64))
            count = np.cumsum(np.asarray(out.units, dtype=np.int64))
            p = prefix_pvalues(total, count, out.null, out.gamma)  # type: ignore[arg-type]
            log_e = anytime_log_evalues(total, count.astype(np.float64), pivot_bets(out.null, out.gamma))
            anytime = anytime_size(log_e, alpha)
            n_scored, score = (int(count[-1]), float(total[-1])) if n else (0, 0.0)
        elif isinstance(out, PrefixPValues):
            check_pvalues(out, n, self.name)
            p = np.asarray(out.pvalues, dtype=np.float64)
            self.anytime_unavailable = out.reason
            n_scored, score = n, float(p[-1]) if n else 1.0
        else:
            raise SpecError(f"scheme.plugin ({self.name})", f"the detector returned {type(out).__name__}",
                            "mmw.plugins.Pivots or mmw.plugins.PrefixPValues")
        pvalue = float(p[-1]) if n else 1.0
        return DetectionResult(n_tokens=n, n_scored=n_scored, score=score, pvalue=pvalue, pvalues=p,
                               size=first_crossing(p, alpha), detected=pvalue <= alpha,
                               size_valid=valid_size(p, alpha), size_anytime=anytime, log_evalues=log_e)




def build_detector(spec: SchemeSpec, key: int, vocab_size: int, device: str = "auto") -> Detector | PluginSchemeDetector:
    """The detector of a scheme: mmw's own (``device``: its backend) or a plugin's (which brings its own)."""
    if spec.sampler == "plugin":
        return PluginSchemeDetector(spec, key, vocab_size)
    return Detector(spec, key, vocab_size, device=device)


def preflight_detector(spec: SchemeSpec, key: int, vocab_size: int) -> None:
    """Detect one random text, so a detector that breaks its contract fails with one line before any work."""
    rng = np.random.default_rng(0)
    PluginSchemeDetector(spec, key, vocab_size).detect([rng.integers(0, vocab_size, PREFLIGHT_TEXT)])
