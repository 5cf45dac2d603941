"""Detector: token ids (or text) -> score, p-value per prefix, watermark size.

The detector composes the three design blocks: a randomness source re-derives the seeds, the sampler supplies
the per-token statistic and the exact null of its sum, and the score (sum / align / edit) is computed by a backend:
numba on the CPU or CUDA (``mmw.kernels``) or the numpy reference (``mmw.watermark.scores``). ``device='auto'`` picks CUDA when
a GPU is visible, else the numba CPU twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mmw.errors import SpecError
from mmw.model_fields import DETECT_DEVICES
from mmw.watermark import nulls
from mmw.watermark.randomness import RandomnessSource
from mmw.watermark.samplers import build_sampler
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.scores import ReferenceBackend
from mmw.watermark.size import (
    anytime_bets,
    anytime_log_evalues,
    anytime_size,
    anytime_threshold,
    check_statistics,
    first_crossing,
    valid_size,
)

#: The devices a detector runs on: params ``detect.device``'s values (declared once, in mmw.model_fields).
DEVICES = DETECT_DEVICES


@dataclass
class DetectionResult:
    """One text's verdict. ``pvalues[n-1]`` is the p-value of the first n tokens; ``size`` is the shortest
    prefix with p <= alpha (the paper's E, a first crossing; None when no prefix is detected) and ``size_valid``
    the FPR-controlled size (``mmw.watermark.size.valid_size``: checkpoint grid, alpha split across checkpoints).
    ``size_anytime`` is the first prefix whose e-value reaches 1 / alpha (``mmw.watermark.size.anytime_bets``: valid at every
    prefix, token resolution) and ``log_evalues`` the log e-value per prefix; both None for align/edit scores,
    which have no per-token pivot.
    ``detected`` uses the whole text only: taking the best prefix would be a sequential test whose
    false-positive rate exceeds alpha."""

    n_tokens: int
    n_scored: int
    score: float
    pvalue: float
    pvalues: np.ndarray
    size: int | None
    detected: bool
    size_valid: int | None
    size_anytime: int | None = None
    log_evalues: np.ndarray | None = None


@dataclass
class Scored:
    """What a detector's score gives of one text: the p-value of every prefix (float64 [n]), the final score, the
    tokens the statistic used, and the anytime size with its log e-values (None without a per-token pivot)."""

    pvalues: np.ndarray
    score: float
    n_scored: int
    size_anytime: int | None = None
    log_evalues: np.ndarray | None = None


class Detector:
    """The detector of a scheme: token ids -> :class:`DetectionResult`. ``detect`` checks the ids, asks
    :meth:`score` for each text's per-prefix p-values and turns them into the verdict and the sizes. mmw's own
    blocks score here; a plugin's adapter (``mmw.watermark.plugin_detection``) overrides :meth:`setup` and
    :meth:`score` only."""

    def __init__(self, spec: SchemeSpec, key: int, vocab_size: int, device: str = "auto"):
        if device not in DEVICES:
            raise SpecError("detect.device", f"unknown device {device!r}", DEVICES)
        self.spec = spec
        self.vocab_size = vocab_size
        self.setup(key, device)

    def setup(self, key: int, device: str) -> None:
        """Build what :meth:`score` needs: the sampler, the randomness source and the scoring backend."""
        spec = self.spec
        self.sampler = build_sampler(spec, key, self.vocab_size)
        self.source = RandomnessSource.from_spec(spec)
        self.reference = ReferenceBackend(spec, self.sampler, self.source, key)
        self.backend = self.reference if device == "reference" else _kernel_backend(self, key, device)
        self.bets = anytime_bets(spec) if spec.exact_null else None

    def detect(self, texts: Sequence[np.ndarray]) -> list[DetectionResult]:
        """texts: token-id arrays (int64, any lengths, empty allowed)."""
        arrays = self._checked(texts)
        return [self._result(t, scored) for t, scored in zip(arrays, self.score(arrays), strict=True)]

    def detect_text(self, tokenizer, texts: Sequence[str]) -> list[DetectionResult]:
        """Tokenize without special tokens (the detector sees only the text) and detect."""
        return self.detect(tokenize(tokenizer, texts))

    def full_text_pvalues(self, texts: Sequence[np.ndarray]) -> np.ndarray:
        """Each text's whole-text p-value -> float64 [texts]: :meth:`detect`'s ``pvalue``, the same bits, without
        the per-prefix p-values, sizes and e-values (what an audit key needs: one null evaluation a text, not one a
        token). A score without an exact null (align, edit) or a subclass's own :meth:`score` detects in full."""
        arrays = self._checked(texts)
        if not self.spec.exact_null or type(self).score is not Detector.score:
            return np.array([r.pvalue for r in self.detect(arrays)], dtype=np.float64)
        out = np.ones(len(arrays))
        kept = [i for i, t in enumerate(arrays) if len(t)]
        if kept:
            outs = self.backend.sum_prefix_batch([arrays[i] for i in kept])
            out[kept] = self.sampler.pvalue_sum(np.array([total[-1] for total, _ in outs]),
                                                np.array([count[-1] for _, count in outs]))
        return out

    def score(self, arrays: list[np.ndarray]) -> list[Scored]:
        """Each text's p-value per prefix and score: the exact null of the sum (with the anytime e-process), or the
        permutation test of align/edit."""
        if self.spec.exact_null:
            outs = self.backend.sum_prefix_batch(arrays)
            return [Scored(pvalues, float(total[-1]) if len(t) else 0.0, int(count[-1]) if len(t) else 0, anytime,
                           log_e)
                    for t, (total, count), pvalues, (log_e, anytime)
                    in zip(arrays, outs, self._prefix_pvalues(outs), self._anytime(outs))]
        context = self.source.context if self.spec.randomness != "fixed" else 0
        return [Scored(nulls.empirical(n_le, self.spec.trials), float(observed[-1]) if len(t) else 0.0,
                       max(len(t) - context, 0))
                for t, (observed, n_le) in zip(arrays, self.backend.empirical_prefix_batch(arrays))]

    def _checked(self, texts: Sequence[np.ndarray]) -> list[np.ndarray]:
        arrays = [np.asarray(t, dtype=np.int64) for t in texts]
        for t in arrays:
            if t.size and (t.min() < 0 or t.max() >= self.vocab_size):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got {t.min()}..{t.max()}")
        return arrays

    def _prefix_pvalues(self, outs: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """Every prefix's p-value of every text, from one call of the sampler's null over all texts' prefixes (the
        null is elementwise: the same numbers as a call a text, without the per-call overhead of scipy)."""
        if not outs:
            return []
        lengths = [len(total) for total, _ in outs]
        pvalues = self.sampler.pvalue_sum(np.concatenate([total for total, _ in outs]),
                                          np.concatenate([count for _, count in outs]))
        return np.split(np.asarray(pvalues, dtype=np.float64), np.cumsum(lengths)[:-1])

    def _anytime(self, outs: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, int | None]]:
        """The e-process of each text from its running sum and unit count -> (log e-values, anytime size)."""
        threshold = anytime_threshold(self.spec.alpha)
        if self.backend is not self.reference:
            return self.backend.anytime_batch(outs, self.bets, threshold)
        out = []
        for total, count in outs:
            check_statistics(total)
            log_e = anytime_log_evalues(total, count, self.bets)
            out.append((log_e, anytime_size(log_e, self.spec.alpha)))
        return out

    def _result(self, tokens: np.ndarray, scored: Scored) -> DetectionResult:
        n, p, alpha = len(tokens), scored.pvalues, self.spec.alpha
        pvalue = float(p[-1]) if n else 1.0
        return DetectionResult(
            n_tokens=n, n_scored=scored.n_scored, score=scored.score, pvalue=pvalue,
            pvalues=p, size=first_crossing(p, alpha), detected=pvalue <= alpha,
            size_valid=valid_size(p, alpha, None if self.spec.exact_null else self.spec.trials),
            size_anytime=scored.size_anytime, log_evalues=scored.log_evalues,
        )


def tokenize(tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Texts -> their token ids (int64 arrays), without special tokens: the detector sees only the text. One batch
    call: a fast tokenizer encodes the texts on all cores (the same ids as a call a text)."""
    if not len(texts):
        return []
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [np.array(i, dtype=np.int64) for i in ids]


def _kernel_backend(detector: Detector, key: int, device: str):
    """The numba backend for this device. A failed import is an error, never a silent switch to the numpy
    reference: that would hide a broken install (or a bug in the kernels) behind a 100x slower detector."""
    try:
        from mmw.kernels.backend import NumbaBackend
    except ImportError as err:
        raise SpecError("detect.device", f"{device!r} needs the numba kernels, which cannot be imported "
                        f"({type(err).__name__}: {err}); fix the install (numba) or choose the slow numpy reference",
                        ("reference",)) from err
    return NumbaBackend(detector.spec, detector.sampler, detector.source, key, device=device)
