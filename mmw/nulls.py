"""Null distributions: what a score looks like on text that was not watermarked with this key.

Exact where the law is known (every unit statistic independent after deduplication, docs/PRF.md):
- ``erlang_upper``: sum of N statistics that are -Exp(1) (C1, C2): P(-Gamma(N, 1) <= total).
- ``erlang_lower``: sum of N statistics that are +Exp(1) and shrink when marked (C3): P(Gamma(N, 1) <= total).
- ``binomial_upper``: number of green tokens among N (C4): P(Binomial(N, gamma) >= greens).
Otherwise (align and edit scores) the permutation test of Kuditipudi et al.:
- ``empirical``: p = (1 + #{trial <= observed}) / (T + 1) — never 0, valid at every level.
"""

from __future__ import annotations

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


def empirical(n_le: np.ndarray, trials: int) -> np.ndarray:
    return (1.0 + np.asarray(n_le, dtype=np.float64)) / (trials + 1.0)
