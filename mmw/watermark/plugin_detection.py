"""A plugin's detector as an mmw :class:`~mmw.watermark.detector.Detector` (no torch): the plugin's detector
scores, mmw's sizes do the rest. Per-token pivots under a declared null give the exact p-value of every prefix, E,
the checkpoint size and the anytime size (``mmw.watermark.size``); per-prefix p-values give E and the checkpoint
size only (the anytime size is null, with the reason in ``anytime_unavailable``). A detector that breaks its
contract is refused with one line naming the plugin (``SpecError``, exit 2).

A detector that declares ``needs_model`` gets a :class:`mmw.watermark.plugins.DetectionModel`: the generator in
the detect stage (``mmw.stages.common.generator_model``, loaded once a process), a :class:`SyntheticModel` in the
preflight, so the contract check loads no weights.
"""

from __future__ import annotations

import numpy as np

from mmw.errors import SpecError
from mmw.watermark.detector import Detector, Scored
from mmw.watermark.plugins import (
    DetectionModel,
    Pivots,
    PluginDetector,
    PrefixPValues,
    check_pivots,
    check_pvalues,
    plugin_params,
    prefix_pvalues,
)
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import anytime_log_evalues, anytime_size, pivot_bets

#: Tokens of the random text the preflight detects.
PREFLIGHT_TEXT = 48


class SyntheticModel:
    """A :class:`mmw.watermark.plugins.DetectionModel` without a model: random logits (normal, sd 3) per position, a function
    of the position and the previous token, so a model-aware detector can be checked without loading weights."""

    model = None
    tokenizer = None

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size, self.seed = vocab_size, seed

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        rows = [np.zeros(self.vocab_size, dtype=np.float32)]
        for n in range(1, len(tokens)):
            rng = np.random.default_rng([self.seed, n, int(tokens[n - 1])])
            rows.append((rng.normal(size=self.vocab_size) * 3.0).astype(np.float32))
        return np.stack(rows)[: len(tokens)] if len(tokens) else np.zeros((0, self.vocab_size), np.float32)


class PluginSchemeDetector(Detector):
    """A plugin's detector as an mmw :class:`Detector`: the plugin's detector scores, mmw's sizes do the rest."""

    def __init__(self, spec: SchemeSpec, key: int, vocab_size: int, model: DetectionModel | None = None):
        """``model``: what a detector that ``needs_model`` receives (required then, ignored otherwise)."""
        self.model = model
        super().__init__(spec, key, vocab_size)

    def setup(self, key: int, device: str) -> None:
        """The plugin's detector (the plugin brings its own scoring: ``device`` does not apply)."""
        plugin, params = plugin_params(self.spec)
        self.name = self.spec.plugin
        self.expects_pivots = plugin.no_pivot_reason(params) is None
        if plugin.needs_model:
            if self.model is None:
                raise SpecError(f"scheme.plugin ({self.name})", "the detector needs the generator (needs_model) and "
                                "none was given", "a DetectionModel")
            self.inner: PluginDetector = plugin.detector(params, key, self.vocab_size, model=self.model)
        else:
            self.inner = plugin.detector(params, key, self.vocab_size)
        #: Why a text got no anytime size (None: it has one), from the last ``detect``.
        self.anytime_unavailable: str | None = None

    def score(self, arrays: list[np.ndarray]) -> list[Scored]:
        return [self._one(t) for t in arrays]

    def _one(self, tokens: np.ndarray) -> Scored:
        n, alpha = len(tokens), self.spec.alpha
        out = self.inner.score(tokens)
        if isinstance(out, Pivots):
            check_pivots(out, n, self.name)
            total = np.cumsum(np.asarray(out.values, dtype=np.float64))
            count = np.cumsum(np.asarray(out.units, dtype=np.int64))
            p = prefix_pvalues(total, count, out.null, out.gamma)  # type: ignore[arg-type]
            log_e = anytime_log_evalues(total, count.astype(np.float64), pivot_bets(out.null, out.gamma))
            n_scored, score = (int(count[-1]), float(total[-1])) if n else (0, 0.0)
            return Scored(p, score, n_scored, anytime_size(log_e, alpha), log_e)
        if isinstance(out, PrefixPValues):
            check_pvalues(out, n, self.name)
            if self.expects_pivots:  # the summary would promise an anytime size that cannot be computed
                raise SpecError(f"scheme.plugin ({self.name})", "the detector returned PrefixPValues while the "
                                "plugin's no_pivot_reason says it returns Pivots",
                                "Pivots, or a no_pivot_reason that names why not")
            p = np.asarray(out.pvalues, dtype=np.float64)
            self.anytime_unavailable = out.reason
            return Scored(p, float(p[-1]) if n else 1.0, n)
        raise SpecError(f"scheme.plugin ({self.name})", f"the detector returned {type(out).__name__}",
                        "mmw.watermark.plugins.Pivots or mmw.watermark.plugins.PrefixPValues")


def needs_model(spec: SchemeSpec) -> bool:
    """Whether a scheme's detector needs the generator (a plugin that declares ``needs_model``)."""
    return spec.sampler == "plugin" and plugin_params(spec)[0].needs_model


def preflight_detector(spec: SchemeSpec, key: int, vocab_size: int) -> None:
    """Detect one random text (a model-aware detector over a :class:`SyntheticModel`), so a detector that breaks
    its contract fails with one line before any work."""
    rng = np.random.default_rng(0)
    detector = PluginSchemeDetector(spec, key, vocab_size, SyntheticModel(vocab_size))
    detector.detect([rng.integers(0, vocab_size, PREFLIGHT_TEXT)])
