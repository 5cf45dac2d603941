"""Null distributions: what a score looks like on text that was not watermarked with this key.

Exact where the law is known (every unit statistic independent after deduplication, docs/PRF.md):
- ``erlang_upper``: sum of N statistics that are -Exp(1) (C1, C2): P(-Gamma(N, 1) <= total).
- ``erlang_lower``: sum of N statistics that are +Exp(1) and shrink when marked (C3): P(Gamma(N, 1) <= total).
- ``binomial_upper``: number of green tokens among N (C4): P(Binomial(N, gamma) >= greens).
- ``weighted_bits_upper``: weighted count of ones among N units of m fair bits (the tournament's weighted score):
  its exact discrete law, by convolution.
Otherwise (align and edit scores) the permutation test of Kuditipudi et al.:
- ``empirical``: p = (1 + #{trial <= observed}) / (T + 1) — never 0, valid at every level.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from scipy import stats


def erlang_upper(total: np.ndarray, n_units: np.ndarray) -> np.ndarray:
    n = np.asarray(n_units, dtype=np.float64)
    p = stats.gamma.sf(-np.asarray(total, dtype=np.float64), np.maximum(n, 1.0))
    return np.where(n > 0, p, 1.0)


def erlang_lower(total: np.ndarray, n_units: np.ndarray) -> np.ndarray:
    n = np.asarray(n_units, dtype=np.float64)
    p = stats.gamma.cdf(np.asarray(total, dtype=np.float64), np.maximum(n, 1.0))
    return np.where(n > 0, p, 1.0)


def binomial_upper(greens: np.ndarray, n_units: np.ndarray, gamma: float) -> np.ndarray:
    n = np.asarray(n_units)
    return np.where(n > 0, stats.binom.sf(np.asarray(greens) - 1, n, gamma), 1.0)


class WeightedBits:
    """The exact law of X_N = sum over N units of sum_l w_l g_l, with the g's i.i.d. fair bits and integer weights
    w (int64 [m], W = sum w), for every N: what the tournament's weighted score is under H0.

    One unit's law comes from a dynamic programme over the layers (each step halves and shifts: exact in binary
    floating point), N units' from N - 1 convolutions with it (direct sums of positive terms, so the far tail keeps
    its relative precision, unlike an FFT or a normal approximation). The survival function P(X_N >= s) of each N
    is kept only where it is strictly between 0 and 1 in float64 -- below that window it is exactly 1.0, above it
    it has underflowed to 0.0 -- so the tables cost about 47 standard deviations per N, not N W entries.
    Cost: ~W^2 N^2 / 2 multiply-adds up to the longest N asked (0.25 s for m = 30 decreasing weights and N = 200 on
    one CPU core), paid once per process and weights."""

    def __init__(self, weights: tuple[int, ...]):
        unit = np.ones(1)
        for w in weights:  # one more layer: the bit is 0 or 1 with probability 1/2 each
            step = np.zeros(unit.size + w)
            step[:unit.size] += unit
            step[w:] += unit
            unit = 0.5 * step
        self.unit = unit
        self._pmf = np.ones(1)  # the law of X_n for the largest n tabulated
        # Per n: where its window starts (s below it: P = 1) and its entries, kept flat for vectorised lookups.
        self._lo, self._windows = [1], [np.zeros(0)]  # X_0 = 0: P(X_0 >= s) = 1 for s <= 0, 0 above
        self._flat = np.zeros(0)
        self._start = np.zeros(1, dtype=np.int64)

    def _grow(self, n: int) -> None:
        if len(self._lo) > n:
            return
        while len(self._lo) <= n:
            self._pmf = np.convolve(self._pmf, self.unit)
            survival = np.cumsum(self._pmf[::-1])[::-1]  # P(X >= s), summed from the far tail up
            inside = np.flatnonzero((survival < 1.0) & (survival > 0.0))
            lo = int(inside[0]) if inside.size else survival.size
            hi = int(inside[-1]) + 1 if inside.size else lo
            self._lo.append(lo)
            self._windows.append(survival[lo:hi].copy())
        self._flat = np.concatenate(self._windows)
        self._start = np.concatenate([[0], np.cumsum([w.size for w in self._windows])[:-1]]).astype(np.int64)

    def upper(self, score: np.ndarray, n_units: np.ndarray) -> np.ndarray:
        """P(X_N >= score) for aligned integer-valued ``score`` (float64) and ``n_units`` (int) -> float64."""
        score, n_units = np.broadcast_arrays(np.rint(np.asarray(score, dtype=np.float64)),
                                             np.asarray(n_units, dtype=np.int64))
        if n_units.size == 0:
            return np.zeros(score.shape)
        self._grow(int(n_units.max()))
        lo = np.asarray(self._lo, dtype=np.float64)[n_units]
        size = np.asarray([w.size for w in self._windows], dtype=np.int64)[n_units]
        offset = np.clip(score - lo, 0, np.maximum(size - 1, 0)).astype(np.int64)
        value = self._flat[np.minimum(self._start[n_units] + offset, max(self._flat.size - 1, 0))] \
            if self._flat.size else np.zeros(score.shape)
        return np.where(score < lo, 1.0, np.where(score >= lo + size, 0.0, value))


@cache
def _weighted_bits(weights: tuple[int, ...]) -> WeightedBits:
    return WeightedBits(weights)


def weighted_bits_upper(score: np.ndarray, n_units: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """P(X_N >= score) with X_N the weighted count of ones among N units of fair bits, weights int64 [m]
    (:class:`WeightedBits`; the tables are built once per process and weights)."""
    return _weighted_bits(tuple(int(w) for w in weights)).upper(score, n_units)


def empirical(n_le: np.ndarray, trials: int) -> np.ndarray:
    return (1.0 + np.asarray(n_le, dtype=np.float64)) / (trials + 1.0)
