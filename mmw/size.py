"""Watermark size with a controlled false-positive rate (design and measurements: docs/SIZE.md).

The paper's size E is the *first crossing*: the shortest prefix whose p-value is <= alpha. Looking at every prefix
is a sequential test that never stops, so on unwatermarked text the share with *some* prefix at p <= alpha is far
above alpha (9-17% at alpha = 2% over 200 tokens). ``valid_size`` looks only at a fixed checkpoint grid chosen
before the text is seen -- prefix lengths 16, 32, 64, ... (doubling) below the text's length, plus the full text --
and tests each checkpoint at level alpha / m (Bonferroni over the m checkpoints). By the union bound

    P_null(some checkpoint has p <= alpha / m) <= m * alpha / m = alpha,

for every score whose per-prefix p-value is valid (super-uniform) under the null: the exact Gamma/Binomial nulls
of the sum scores and the permutation p-values of align/edit alike, whatever the dependence between prefixes.

A permutation p-value is never below 1 / (T + 1) (T trial keys), so a level alpha / m below that could never be
reached. For those scores the grid keeps only its last ``floor(alpha (T + 1))`` checkpoints (the longest prefixes,
where such tests have power); with T = 99 and alpha = 0.02 that is {longest doubling point, full text}.
"""

from __future__ import annotations

import math

import numpy as np

#: The first checkpoint (tokens) and the grid's growth factor. Doubling keeps the number of checkpoints
#: logarithmic in the length (5 for 200 tokens, 7 for 1,024), so the Bonferroni price grows slowly, and
#: neighbouring checkpoints are strongly correlated only pairwise, so the union bound is not far from tight.
FIRST_CHECKPOINT = 16
GROWTH = 2

#: Relative slack when comparing a p-value with alpha / m: permutation p-values are exact fractions k / (T + 1)
#: that should pass a level equal to them even when alpha / m rounds one ulp below.
_LEVEL_SLACK = 1e-12


def checkpoint_grid(n_tokens: int, alpha: float, trials: int | None = None) -> np.ndarray:
    """Prefix lengths (tokens, 1-based, ascending, int64 [m]) at which the valid size tests a text of
    ``n_tokens`` tokens: ``16, 32, 64, ... < n_tokens`` then ``n_tokens``; empty for an empty text.

    ``trials``: the permutation test's trial count T for align/edit scores (None for the exact sum nulls); it
    thins the grid to its last ``floor(alpha (T + 1))`` checkpoints so that alpha / m >= 1 / (T + 1).
    """
    if n_tokens <= 0:
        return np.zeros(0, dtype=np.int64)
    grid = []
    point = FIRST_CHECKPOINT
    while point < n_tokens:
        grid.append(point)
        point *= GROWTH
    grid.append(n_tokens)
    if trials is not None:
        reachable = max(1, math.floor(alpha * (trials + 1) * (1 + _LEVEL_SLACK)))
        grid = grid[-reachable:]
    return np.asarray(grid, dtype=np.int64)


def valid_size(pvalues: np.ndarray, alpha: float, trials: int | None = None) -> int | None:
    """The FPR-controlled size of one text: the first checkpoint of :func:`checkpoint_grid` whose prefix p-value
    is <= alpha / m, in tokens; None when no checkpoint passes.

    Args:
        pvalues: float64 [N], ``pvalues[n - 1]`` = p-value of the first n tokens (``DetectionResult.pvalues``).
        alpha: the family-wise false-positive rate over all checkpoints of the text.
        trials: T of the permutation test (align/edit), None for exact nulls.
    """
    grid = checkpoint_grid(len(pvalues), alpha, trials)
    if grid.size == 0:
        return None
    level = alpha / len(grid) * (1 + _LEVEL_SLACK)
    passed = np.flatnonzero(np.asarray(pvalues)[grid - 1] <= level)
    return int(grid[passed[0]]) if passed.size else None


def first_crossing(pvalues: np.ndarray, alpha: float) -> int | None:
    """The paper's size E of one text: the shortest prefix (tokens) with p <= alpha, None if there is none.

    ``pvalues``: float64 [N] per prefix. Its any-prefix false-positive rate is *not* alpha (see the module doc)."""
    hit = np.flatnonzero(np.asarray(pvalues) <= alpha)
    return int(hit[0]) + 1 if hit.size else None
