"""Detector: token ids (or text) -> score, p-value per prefix, watermark size.

The detector composes the three design blocks: a randomness source re-derives the seeds, the sampler supplies
the per-token statistic and the exact null of its sum, and the score (sum / align / edit) is computed by a backend:
numba on the CPU or CUDA (``mmw.kernels``) or the numpy reference (``mmw.scores``). ``device='auto'`` picks CUDA when
a GPU is visible, else the numba CPU twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mmw import nulls
from mmw.errors import SpecError
from mmw.params import DETECT_DEVICES
from mmw.randomness import RandomnessSource
from mmw.samplers import build_sampler
from mmw.scheme import SchemeSpec
from mmw.scores import ReferenceBackend
from mmw.size import (anytime_bets, anytime_log_evalues, anytime_size, anytime_threshold, check_statistics,
                      first_crossing, valid_size)

#: The devices a detector runs on: params ``detect.device``'s values (declared once, in mmw.params).
DEVICES = DETECT_DEVICES


@dataclass
class DetectionResult:
    """One text's verdict. ``pvalues[n-1]`` is the p-value of the first n tokens; ``size`` is the shortest
    prefix with p <= alpha (the paper's E, a first crossing; None when no prefix is detected) and ``size_valid``
    the FPR-controlled size (``mmw.size.valid_size``: checkpoint grid, alpha split across checkpoints).
    ``size_anytime`` is the first prefix whose e-value reaches 1 / alpha (``mmw.size.anytime_bets``: valid at every
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


class Detector:
    def __init__(self, spec: SchemeSpec, key: int, vocab_size: int, device: str = "auto"):
        if device not in DEVICES:
            raise SpecError("detect.device", f"unknown device {device!r}", DEVICES)
        self.spec = spec
        self.vocab_size = vocab_size
        self.sampler = build_sampler(spec, key, vocab_size)
        self.source = RandomnessSource.from_spec(spec)
        self.reference = ReferenceBackend(spec, self.sampler, self.source, key)
        self.backend = self.reference if device == "reference" else _kernel_backend(self, key, device)
        self.bets = anytime_bets(spec) if spec.exact_null else None

    def detect(self, texts: Sequence[np.ndarray]) -> list[DetectionResult]:
        """texts: token-id arrays (int64, any lengths, empty allowed)."""
        arrays = [np.asarray(t, dtype=np.int64) for t in texts]
        for t in arrays:
            if t.size and (t.min() < 0 or t.max() >= self.vocab_size):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got {t.min()}..{t.max()}")
        if self.spec.exact_null:
            outs = self.backend.sum_prefix_batch(arrays)
            results = []
            for t, (total, count), (log_e, anytime) in zip(arrays, outs, self._anytime(outs)):
                p = self.sampler.pvalue_sum(total, count)
                results.append(self._result(t, p, total, count, anytime, log_e))
            return results
        outs = self.backend.empirical_prefix_batch(arrays)
        results = []
        for t, (observed, n_le) in zip(arrays, outs):
            p = nulls.empirical(n_le, self.spec.trials)
            results.append(self._result(t, p, observed, None))
        return results

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

    def detect_text(self, tokenizer, texts: Sequence[str]) -> list[DetectionResult]:
        """Tokenize without special tokens (the detector sees only the text) and detect."""
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        return self.detect([np.array(i, dtype=np.int64) for i in ids])

    def _result(self, tokens: np.ndarray, p: np.ndarray, score: np.ndarray, count: np.ndarray | None,
                size_anytime: int | None = None, log_evalues: np.ndarray | None = None):
        n = len(tokens)
        if count is not None:
            n_scored = int(count[-1]) if n else 0
        else:
            n_scored = max(n - (self.source.context if self.spec.randomness != "fixed" else 0), 0)
        pvalue = float(p[-1]) if n else 1.0
        alpha = self.spec.alpha
        return DetectionResult(
            n_tokens=n, n_scored=n_scored, score=float(score[-1]) if n else 0.0, pvalue=pvalue,
            pvalues=p, size=first_crossing(p, alpha), detected=pvalue <= alpha,
            size_valid=valid_size(p, alpha, None if self.spec.exact_null else self.spec.trials),
            size_anytime=size_anytime, log_evalues=log_evalues,
        )


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
