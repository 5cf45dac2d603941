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
from dataclasses import dataclass

import numpy as np

from mmw.errors import SpecError
from mmw.watermark.samplers import DECLARED, WATERMARKING

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


# ---------------------------------------------------------------------------------------------------- anytime size
#: Signal strengths rho of the mixture's alternatives (see :func:`anytime_bets`): a geometric grid from weak to
#: strong evidence per unit, uniform weights. Chosen by measured power at 16-200 tokens (docs/SIZE.md).
ANYTIME_GRID = (0.1, 0.3, 0.6, 0.9)

#: Samplers with a per-unit pivot, and how the running sum S of the unit statistics moves under the watermark
#: (each sampler declares its own: ``mmw.watermark.samplers.parts.SamplerPart.pivot``).
PIVOTS = {cls.name: cls.pivot for cls in WATERMARKING if cls.pivot is not None}


@dataclass(frozen=True)
class Bets:
    """A mixture of K constant-bet test martingales, each a function of the running unit count C and sum S:
    ``M_n = sum_j exp(log_weights[j] + a[j] C_n + b[j] S_n)`` (float64 [K] each, weights summing to one)."""

    a: np.ndarray
    b: np.ndarray
    log_weights: np.ndarray


def _check_alpha(alpha: float) -> float:
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and 0.0 < alpha < 1.0):
        raise SpecError("scheme.alpha", f"{alpha!r} is not a level for the anytime size", "a number in (0, 1)")
    return float(alpha)


def anytime_threshold(alpha: float) -> float:
    """log(1 / alpha): the anytime size is the first prefix whose log e-value reaches it (Ville's inequality)."""
    return -math.log(_check_alpha(alpha))


def anytime_bets(spec, grid: tuple[float, ...] = ANYTIME_GRID) -> Bets:
    """The e-process of a sum-score scheme: the uniform mixture over ``grid`` of likelihood ratios of one unit's
    pivot, each a nonnegative martingale under the null (the units are i.i.d. after deduplication):

    - exp_up (C1, C2; X = -unit ~ Exp(1)): Exp(rate 1 - rho) against Exp(1), factor (1 - rho) e^{rho X};
    - exp_down (C3; X = unit ~ Exp(1)): Exp(rate 1 / (1 - rho)), factor e^{-(r - 1) X} r with r = 1 / (1 - rho);
    - green (C4, reweight; G = -unit ~ Bernoulli(gamma)): Bernoulli(q), q = gamma + rho (1 - gamma);
    - bits (tournament; -unit = the number of ones among a unit's m fair g-values): each g-value Bernoulli(q)
      against Bernoulli(1/2), q = (1 + rho) / 2, factor (1 + rho)^ones (1 - rho)^(m - ones). With layer weights w
      (-unit = sum_l w_l g_l) the alternative tilts layer l in proportion to its weight: log-odds lambda w_l,
      lambda = log((1 + rho) / (1 - rho)) / mean(w), so the factor depends on the weighted count alone:
      exp(lambda sum_l w_l g_l) prod_l 2 / (1 + e^{lambda w_l}) (equal weights: the factor above).

    A product of constant factors depends only on (C_n, S_n), so the mixture needs no per-unit state. Align and
    edit scores have no per-unit pivot (their nulls are permutation tests): asking raises ``SpecError``.
    """
    if spec.score != "sum" or not spec.exact_null:
        raise SpecError("scheme.score", f"{spec.score!r} has no per-token pivot, so no anytime (e-process) size; "
                        "its valid size is the checkpoint size `size_valid`", ("sum",))
    if spec.sampler not in PIVOTS:
        raise SpecError("scheme.sampler", f"{spec.sampler!r} has no per-unit pivot", tuple(PIVOTS))
    weights = DECLARED[spec.sampler].weights_of(spec) if PIVOTS[spec.sampler] == "bits" else None
    return pivot_bets(PIVOTS[spec.sampler], spec.gamma, grid, spec.layers, weights)


def pivot_bets(pivot: str, gamma: float | None, grid: tuple[float, ...] = ANYTIME_GRID,
               layers: int | None = None, weights: np.ndarray | None = None) -> Bets:
    """The e-process mixture of :func:`anytime_bets` for one pivot kind ("exp_up", "exp_down", "green" with its
    ``gamma``, "bits" with its ``layers`` and optional per-layer integer ``weights``, default all ones): also what
    a plugin's declared null gets (``mmw.watermark.plugins``)."""
    rho = np.asarray(grid, dtype=np.float64)
    if rho.ndim != 1 or rho.size == 0 or not np.all((rho > 0) & (rho < 1)):
        raise SpecError("anytime grid", f"{list(grid)!r} is not a list of signal strengths", "numbers in (0, 1)")
    if pivot == "exp_up":  # log factor = c log(1 - rho) + rho X, X = -S
        a, b = np.log1p(-rho), -rho
    elif pivot == "exp_down":  # rate r: c log r - (r - 1) X, X = S
        r = 1.0 / (1.0 - rho)
        a, b = np.log(r), -(r - 1.0)
    elif pivot == "bits":  # ones = -S among the m c fair g-values: g log(1 + rho) + (m c - g) log(1 - rho)
        w = np.ones(int(layers)) if weights is None else np.asarray(weights, dtype=np.float64)
        mean = w.mean()
        # Layer l's alternative is Bernoulli((1 + rho_l) / 2) with rho_l = tanh(atanh(rho) w_l / mean(w)); a layer
        # of mean weight keeps rho itself, so equal weights give exactly the unweighted bet.
        value, count = np.unique(w, return_counts=True)
        rho_l = np.where(value[None, :] == mean, rho[:, None],
                         np.tanh(np.arctanh(rho)[:, None] * (value / mean)[None, :]))
        a = (count[None, :] * np.log1p(-rho_l)).sum(axis=1)
        b = -(np.log1p(rho) - np.log1p(-rho)) / mean
    else:  # greens g = -S among c: g log(q / gamma) + (c - g) log((1 - q) / (1 - gamma))
        gamma = float(gamma)
        q = gamma + rho * (1.0 - gamma)
        a = np.log1p(-q) - math.log1p(-gamma)
        b = -(np.log(q / gamma) - a)
    log_w = np.full(rho.size, -math.log(rho.size))
    return Bets(np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64), log_w)


def check_statistics(total: np.ndarray, setting: str = "scheme.sampler") -> None:
    """A NaN or infinite running sum makes every later e-value (and p-value) meaningless: refuse it."""
    bad = ~np.isfinite(np.asarray(total, dtype=np.float64))
    if bad.any():
        raise SpecError(setting, f"non-finite unit statistic at token {int(np.flatnonzero(bad)[0]) + 1} "
                        "(NaN or inf): no size is computed from an invalid process", "finite statistics")


def anytime_log_evalues(total: np.ndarray, count: np.ndarray, bets: Bets) -> np.ndarray:
    """log M_n for every prefix (numpy reference of the kernels): float64 [N] from the running sum and unit count
    of the sum score (``sum_prefix``). log M_n = 0 before the first unit."""
    from scipy.special import logsumexp

    total = np.asarray(total, dtype=np.float64)
    check_statistics(total)
    count = np.asarray(count, dtype=np.float64)
    terms = (bets.log_weights[:, None] + bets.a[:, None] * count[None, :]) + bets.b[:, None] * total[None, :]
    return logsumexp(terms, axis=0) if total.size else np.zeros(0)


def anytime_size(log_evalues: np.ndarray, alpha: float) -> int | None:
    """The anytime-valid size: the first prefix (tokens) whose e-value reaches 1 / alpha; None if none does.

    P_null(some prefix reaches 1 / alpha) <= alpha (Ville), at every prefix and under any stopping rule."""
    hit = np.flatnonzero(np.asarray(log_evalues) >= anytime_threshold(alpha))
    return int(hit[0]) + 1 if hit.size else None
