"""One-sided tests and confidence bounds for the mean of bounded variables that need no distributional assumption
and hold for independent observations that are NOT identically distributed: a final-time betting test with bets
fixed before the data (the capital of Waudby-Smith & Ramdas, 2023, "Estimating means of bounded random variables
by betting", JRSS-B, with a fixed mixture of constant bets in place of their predictable plug-in).

**The test.** For observations ``x_i`` in ``[0, 1]``, ``i = 1..N``, independent, with means ``mu_i``, the
hypothesis tested is about the pooled mean: "``(1/N) sum_i mu_i <= m``" — each ``mu_i`` may lie on either side of
``m``. For a constant bet ``lambda`` in ``[0, 1/m]`` the capital ``K(lambda) = prod_i (1 + lambda (x_i - m))`` is
non-negative, and by independence

    E[K(lambda)] = prod_i (1 + lambda (mu_i - m)) <= (1 + lambda (mean mu - m))^N <= 1,

the middle step the AM-GM inequality on the non-negative factors ``1 + lambda (mu_i - m)``, the last the
hypothesis. A mixture ``K = sum_j w_j K(lambda_j)`` over a grid of bets and weights fixed before the data
(:data:`BETS`, :data:`WEIGHTS`, summing to 1) has ``E[K] <= 1`` too, so by Markov's inequality rejecting when
``K >= 1/alpha`` at the final observation errs with probability at most ``alpha``, whatever the order of the
observations and however their means differ.

Why not the sequential test (a predictable plug-in bet, rejecting as soon as the running capital crosses
``1/alpha``): Ville's inequality needs every observation's *conditional* mean at or below ``m``, not their
average. A setting's prompts in a fixed order grouped by task — a better task first, a worse one later — break
it: the capital grows on the first task and the test confirms before the later ones are seen (at ``q = 0.9``, a
pooled ratio exactly at the limit, task ratios .95/.90/.85 over 999 prompts, K = 5 runs: 99.7 % false
confirmations at a nominal 2.5 %; this test 0.03 %; bench/results/confirm_validity.md). A data-dependent bet (a
running variance) has the same flaw, since the AM-GM step needs one bet for every factor. The price of the fixed
bets is power at small margins with many prompts, where the best bet is well below the largest (the mixture
tracks the best of its bets up to ``log(1 / weight)``): a constant bet ``c / m`` grows the capital only while the
mean exceeds ``m`` by more than about ``c var / (2 m)``, so the bound settles that far below the mean rather than
reaching it as ``N`` grows (docs/SWEEP.md: below the floor of any confirmation the tasks' prompts allow).

**Bets.** ``lambda_j = c_j / m`` with fractions ``c_j`` of :data:`BETS`: every factor stays above ``1 - c_j``
(at ``x = 0``). Each factor ``1 - c_j + c_j x / m`` is non-increasing in ``m``, so the capital is too and the
rejected candidates form an interval below the bound: bisection finds it.

**Ratios.** ``E[sum w] / E[sum b] <= q`` for paired ``w, b`` in ``[0, H]`` is the mean test on
``x_i = (w_i - q b_i + q H) / ((1 + q) H)`` at ``m = q / (1 + q)``, whose factors are ``1 + c (w_i - q b_i) / (q H)``;
only the pooled ratio is tested, not each pair's.

**Distribution-free floor.** No valid test confirms below ``N = log(1/alpha) / log(1 + d / m)`` observations
when every observation sits ``d`` above ``m`` (the most favourable data): the null distribution on ``{0, m + d}``
with mean ``m`` produces exactly those data with probability ``(m / (m + d))^N``. This test's own floor
(:func:`floor`) is the smallest ``N`` at which it confirms those data; it lies a few prompts above the bound
(the truncation ``c_0 < 1`` and the weight of the largest bet).

Missing values are NaN: they neither bet nor count. Shapes: ``(..., n)`` observations; every function accepts
leading batch dimensions.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp


#: Bet fractions ``c_j`` of the mixture (``lambda_j = c_j / m``) and their weights, fixed before any data. The
#: large bet is near the best constant bet at the sweep's spread (ratings' paired differences far inside their
#: range, where the optimal bet ``~ margin / variance`` exceeds every admissible one): at 0.99 rather than the
#: sequential test's 0.95 it gains power at every scale of bench/confirm_validity.py. The half bet keeps a test
#: when a few prompts collapse (a factor of at least 0.5 instead of 0.01), at a cost of ``log(1/0.9)`` (0.1) in the
#: log capital.
BETS = (0.99, 0.5)
WEIGHTS = (0.9, 0.1)
#: Bisection steps of a bound (range / 2**40: far below any rating's resolution).
STEPS = 40


def log_capital(excess: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """Log of the mixture capital ``sum_j w_j prod_i (1 + c_j excess_i / scale)`` over the last axis.

    Args:
        excess: ``(..., n)`` each observation's excess over the hypothesised mean (NaN: missing, a factor of 1).
        scale: ``(...)`` the largest possible loss ``-excess`` (``m`` for values in ``[0, 1]``), > 0, so that
            every factor stays above ``1 - c_j``.
    """
    scale = np.asarray(scale, dtype=float)[..., None, None]
    bets = np.asarray(BETS)[:, None] / scale  # (..., J, 1)
    excess = np.asarray(excess, dtype=float)[..., None, :]
    with np.errstate(invalid="ignore"):
        logs = np.where(np.isnan(excess), 0.0, np.log1p(np.maximum(bets * excess, -1.0))).sum(axis=-1)
    return logsumexp(logs + np.log(WEIGHTS), axis=-1)


def rejects(z: np.ndarray, m: np.ndarray | float, alpha: float) -> np.ndarray:
    """Whether "mean of ``z`` <= ``m``" (the average of the observations' means) is rejected at level
    ``alpha``: the final capital reaches ``1/alpha``.

    Args:
        z: ``(..., n)`` values in ``[0, 1]`` (NaN: missing).
        m: candidate means in ``(0, 1]``, broadcastable to ``(...)`` (``m <= 0`` is rejected by any positive
            value: a factor with the smallest positive scale).

    Returns:
        ``(...)`` bool.
    """
    m = np.asarray(m, dtype=float)
    return log_capital(np.asarray(z, dtype=float) - m[..., None], np.maximum(m, np.finfo(float).tiny)
                       ) >= math.log(1 / alpha)


def lower_bound(x: np.ndarray, alpha: float, low: float, high: float) -> np.ndarray:
    """One-sided ``1 - alpha`` lower confidence bound for the average mean of ``x`` in ``[low, high]``: the
    largest candidate mean that :func:`rejects` (``low`` when none is, e.g. without data).

    Args:
        x: ``(..., n)`` observations (NaN: missing).

    Returns:
        ``(...)`` bounds in ``[low, high]``.

    Raises:
        ValueError: an observation outside ``[low, high]`` (the guarantee would not hold).
    """
    x = np.asarray(x, dtype=float)
    if high <= low:
        raise ValueError(f"empty range [{low}, {high}]")
    if np.any((x < low) | (x > high)):
        raise ValueError(f"observations outside their declared range [{low}, {high}]")
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], float(low))
    z = (x - low) / (high - low)
    below = np.zeros(z.shape[:-1])  # rejected (or the range's end)
    above = np.ones(z.shape[:-1])  # never rejected: every factor is <= 1 at m = 1
    for _ in range(STEPS):
        middle = (below + above) / 2
        hit = rejects(z, middle, alpha)
        below, above = np.where(hit, middle, below), np.where(hit, above, middle)
    return low + (high - low) * below


def upper_bound(x: np.ndarray, alpha: float, low: float, high: float) -> np.ndarray:
    """One-sided ``1 - alpha`` upper confidence bound for the average mean of ``x`` in ``[low, high]`` (the lower
    bound of ``-x``)."""
    return -lower_bound(-np.asarray(x, dtype=float), alpha, -high, -low)


def ratio_exceeds(w: np.ndarray, b: np.ndarray, q: np.ndarray | float, alpha: float, high: float) -> np.ndarray:
    """Whether ``E[sum w] / E[sum b] <= q`` is rejected at level ``alpha``, i.e. ``sum E[w - q b] > 0`` is shown,
    for independent pairs ``w, b`` in ``[0, high]`` (``(..., n)``, NaN: a missing pair): the mixture capital of
    the excesses ``w - q b``, whose largest loss is ``q high`` (``w = 0``, ``b = high``)."""
    q = np.asarray(q, dtype=float)
    return log_capital(w - q[..., None] * b, np.maximum(q * high, np.finfo(float).tiny)) >= math.log(1 / alpha)


def ratio_falls_short(w: np.ndarray, b: np.ndarray, q: np.ndarray | float, alpha: float,
                      high: float) -> np.ndarray:
    """Whether ``E[sum w] / E[sum b] >= q`` is rejected at level ``alpha`` (``sum E[q b - w] > 0`` is shown): the
    mixture capital of the excesses ``q b - w``, whose largest loss is ``high`` (``w = high``, ``b = 0``)."""
    q = np.asarray(q, dtype=float)
    return log_capital(q[..., None] * b - w, high) >= math.log(1 / alpha)


def floor(margin: float, scale: float, alpha: float) -> tuple[int, int]:
    """Fewest observations to confirm a mean ``margin`` above its hypothesis when every observation sits exactly
    there (the most favourable data), ``scale`` the largest possible loss (``m``; for a ratio ``q`` of ratings on
    ``[0, H]``: ``q H``, with ``margin`` the per-prompt ``w - q b`` in rating points).

    Returns:
        ``(any valid test, this test)``: ``ceil(log(1/alpha) / log(1 + margin / scale))``, below which no valid
        test confirms (the module docstring), and the smallest count at which :func:`log_capital` reaches
        ``1/alpha`` on those data.
    """
    if not margin > 0:
        return math.inf, math.inf  # type: ignore[return-value]
    bound = math.ceil(round(math.log(1 / alpha) / math.log1p(margin / scale), 9))
    n = bound
    while log_capital(np.full(n, float(margin)), scale) < math.log(1 / alpha):
        n += 1
    return bound, n


def ratio_bounds(w: np.ndarray, b: np.ndarray, alpha: float, high: float, at: np.ndarray | float,
                 top: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """One-sided lower and upper bounds (level ``alpha`` each) for ``E[w] / E[b]`` from paired ``w, b`` in
    ``[0, high]`` (``(..., n)``; NaN: a missing pair), by inverting :func:`ratio_exceeds` /
    :func:`ratio_falls_short` over ``q`` in ``[0, top]``.

    The inversion is anchored at ``at`` (the constraint): the lower bound is ``>= at`` exactly when the test at
    ``at`` rejects, and the upper bound ``< at`` exactly when the opposite test does, so a verdict read off the
    bounds is the exact level-``alpha`` test at the constraint, whatever the bounds' shape elsewhere.

    Returns:
        ``(low, high)``, each ``(...)``.

    Raises:
        ValueError: a rating outside ``[0, high]``.
    """
    w, b = np.asarray(w, dtype=float), np.asarray(b, dtype=float)
    if np.any((w < 0) | (w > high) | (b < 0) | (b > high)):
        raise ValueError(f"ratings outside their declared range [0, {high}]")
    missing = np.isnan(w) | np.isnan(b)
    w, b = np.where(missing, np.nan, w), np.where(missing, np.nan, b)
    shape = w.shape[:-1]
    at = np.broadcast_to(np.asarray(at, dtype=float), shape)

    def invert(test, shown_at_anchor: np.ndarray, below_is_shown: bool) -> np.ndarray:
        # Bracket [a, c] around the bound, with the anchor on the side its own test decides.
        if below_is_shown:  # lower bound: shown for small q
            a, c = np.where(shown_at_anchor, at, 0.0), np.where(shown_at_anchor, top, at)
        else:  # upper bound: shown for large q
            a, c = np.where(shown_at_anchor, 0.0, at), np.where(shown_at_anchor, at, top)
        for _ in range(STEPS):
            middle = (a + c) / 2
            hit = test(w, b, middle, alpha, high)
            if below_is_shown:
                a, c = np.where(hit, middle, a), np.where(hit, c, middle)
            else:
                a, c = np.where(hit, a, middle), np.where(hit, middle, c)
        return a if below_is_shown else c

    low = invert(ratio_exceeds, ratio_exceeds(w, b, at, alpha, high), True)
    short = ratio_falls_short(w, b, at, alpha, high)
    up = invert(ratio_falls_short, short, False)
    # Shown short at the anchor: the bound lies strictly below it even when no bisection point was rejected.
    return low, np.where(short & (up >= at), np.nextafter(at, -np.inf), up)
