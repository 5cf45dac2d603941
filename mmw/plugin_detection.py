"""A plugin's detector inside mmw's sizes (no torch): per-token pivots under a declared null give the exact p-value
of every prefix, E, the checkpoint size and the anytime size (``mmw.size``); per-prefix p-values give E and the
checkpoint size only (the anytime size is null, with the reason in ``anytime_unavailable``). A detector that breaks
its contract is refused with one line naming the plugin (``SpecError``, exit 2).

A detector that declares ``needs_model`` gets the generator (:class:`GeneratorModel`, loaded once a process) and
its tokenizer; the preflight gives it a :class:`SyntheticModel` instead, so the contract check loads no weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from mmw.detector import DetectionResult, Detector
from mmw.errors import SpecError
from mmw.params import ModelParams
from mmw.plugins import (DetectionModel, Pivots, PluginDetector, PrefixPValues, check_pivots, check_pvalues,
                         plugin_params, prefix_pvalues)
from mmw.scheme import SchemeSpec
from mmw.size import anytime_log_evalues, anytime_size, first_crossing, pivot_bets, valid_size

#: Tokens of the random text the preflight detects.
PREFLIGHT_TEXT = 48


class SyntheticModel:
    """A :class:`mmw.plugins.DetectionModel` without a model: random logits (normal, sd 3) per position, a function
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


class GeneratorModel:
    """The :class:`mmw.plugins.DetectionModel` of a transformers causal LM: next-token logits per position."""

    def __init__(self, model: Any, tokenizer: Any, vocab_size: int):
        self.model, self.tokenizer, self.vocab_size = model, tokenizer, vocab_size

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        import torch

        tokens = np.asarray(tokens, dtype=np.int64)
        if not len(tokens):
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        bos = self.tokenizer.bos_token_id
        ids = tokens if bos is None else np.concatenate([[bos], tokens])
        with torch.inference_mode():
            out = self.model(torch.as_tensor(ids[None], device=self.model.device)).logits[0, :, : self.vocab_size]
        out = out.float().cpu().numpy()
        if bos is not None:  # row n: given BOS + tokens[:n]
            return out[: len(tokens)]
        return np.vstack([np.zeros((1, self.vocab_size), dtype=np.float32), out[: len(tokens) - 1]])


@lru_cache(maxsize=2)
def generator_model(name: str, device: str, dtype: str) -> GeneratorModel:
    """The generator for model-aware detectors, loaded once a process (the baseline's audit keys reuse it)."""
    from mmw.engines.models import load_model
    from mmw.stages.common import generator_vocab_size

    tokenizer, model = load_model(name, device, dtype)
    return GeneratorModel(model.eval(), tokenizer, generator_vocab_size(tokenizer, model))


class PluginSchemeDetector:
    """mmw's detector interface (``detect``, ``detect_text``) over a plugin's detector."""

    def __init__(self, spec: SchemeSpec, key: int, vocab_size: int, model: DetectionModel | None = None):
        """``model``: what a detector that ``needs_model`` receives (required then, ignored otherwise)."""
        plugin, params = plugin_params(spec)
        self.name, self.spec, self.vocab_size = spec.plugin, spec, vocab_size
        self.expects_pivots = plugin.no_pivot_reason(params) is None
        if plugin.needs_model:
            if model is None:
                raise SpecError(f"scheme.plugin ({self.name})", "the detector needs the generator (needs_model) and "
                                "none was given", "a DetectionModel")
            self.inner: PluginDetector = plugin.detector(params, key, vocab_size, model=model)
        else:
            self.inner = plugin.detector(params, key, vocab_size)
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
            if self.expects_pivots:  # the summary would promise an anytime size that cannot be computed
                raise SpecError(f"scheme.plugin ({self.name})", "the detector returned PrefixPValues while the "
                                "plugin's no_pivot_reason says it returns Pivots",
                                "Pivots, or a no_pivot_reason that names why not")
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


def needs_model(spec: SchemeSpec) -> bool:
    """Whether a scheme's detector needs the generator (a plugin that declares ``needs_model``)."""
    return spec.sampler == "plugin" and plugin_params(spec)[0].needs_model


def build_detector(spec: SchemeSpec, key: int, vocab_size: int, device: str = "auto",
                   generator: ModelParams | None = None) -> Detector | PluginSchemeDetector:
    """The detector of a scheme: mmw's own (``device``: its backend) or a plugin's (which brings its own;
    ``generator``: the model a plugin that ``needs_model`` gets, loaded here once a process)."""
    if spec.sampler == "plugin":
        model = (generator_model(generator.name, generator.device, generator.dtype)
                 if generator is not None and needs_model(spec) else None)
        return PluginSchemeDetector(spec, key, vocab_size, model)
    return Detector(spec, key, vocab_size, device=device)


def preflight_detector(spec: SchemeSpec, key: int, vocab_size: int) -> None:
    """Detect one random text (a model-aware detector over a :class:`SyntheticModel`), so a detector that breaks
    its contract fails with one line before any work."""
    rng = np.random.default_rng(0)
    detector = PluginSchemeDetector(spec, key, vocab_size, SyntheticModel(vocab_size))
    detector.detect([rng.integers(0, vocab_size, PREFLIGHT_TEXT)])
