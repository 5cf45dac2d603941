"""One-sided confidence bounds for the mean of a bounded variable that need no distributional assumption: the
hedged capital process of Waudby-Smith & Ramdas (2023, "Estimating means of bounded random variables by betting",
JRSS-B), one-sided.

For values ``x_i`` in ``[0, 1]`` and a candidate mean ``m``, a gambler who bets ``lambda_i >= 0`` on each
observation exceeding ``m`` has capital ``K_t(m) = prod_{i<=t} (1 + lambda_i (x_i - m))``. When the true mean is at
most ``m``, ``K_t(m)`` is a non-negative supermartingale started at 1, so by Ville's inequality
``P(max_t K_t(m) >= 1/alpha) <= alpha`` whatever the distribution in ``[0, 1]``: rejecting "mean <= m" when the
capital reaches ``1/alpha`` errs with probability at most ``alpha``. The bets are the paper's predictable plug-in
``lambda_i = sqrt(2 log(1/alpha) / (n var_{i-1}))`` (``var_{i-1}``: a running variance of the observations before
``i``, started at 1/4 around 1/2), truncated at ``c / m`` so that every factor stays above ``1 - c``.

Why betting and not empirical Bernstein: at the sweep's scale (a few dozen prompts, level 0.025 per try) the
Maurer-Pontil empirical Bernstein bound carries a ``7 log(2/alpha) / (3 (n - 1))`` range term of about 0.2 of the
range at n = 48, several times the whole statistical margin of a ratio near 0.9; the betting bound adapts to the
observed variance and is never looser than the Hoeffding-type bound it generalises (Waudby-Smith & Ramdas,
Section 4 and their Figure 5). No library ships it (``confseq`` is an unmaintained C++ extension), so it is written
here: a few lines of numpy, vectorised over leading batch dimensions.

The truncation makes each factor non-increasing in ``m`` (both ``min(lambda, c/m)`` and ``x - m`` are), so the
capital is too and the rejected candidates form an interval below the bound: bisection finds it.

Missing values are NaN: they neither bet nor enter the running variance. Shapes: ``(..., n)`` observations in the
given order (the order is part of the procedure: callers pass a fixed, data-independent order).
"""

from __future__ import annotations

import math

import numpy as np

#: Truncation of the bets: every factor of the capital stays above ``1 - TRUNCATION`` (the paper uses 1/2 or 3/4;
#: closer to 1 has more power when, as with ratings, the values sit far inside their range and the truncation binds;
#: bench/bound_study.py).
TRUNCATION = 0.95
#: Bisection steps of a bound (range / 2**40: far below any rating's resolution).
STEPS = 40


def _bets(z: np.ndarray, alpha: float) -> np.ndarray:
    """Predictable plug-in bets ``(..., n)`` before truncation, from the observations before each one."""
    seen = ~np.isnan(z)
    values = np.where(seen, z, 0.0)
    count = np.cumsum(seen, axis=-1)
    n = np.maximum(count[..., -1:], 1)
    mean = (0.5 + np.cumsum(values, axis=-1)) / (count + 1)  # mean of 1/2 and x_1..x_i
    squares = np.where(seen, (values - mean) ** 2, 0.0)
    var = (0.25 + np.cumsum(squares, axis=-1)) / (count + 1)  # running variance up to i
    before = np.concatenate([np.full(var.shape[:-1] + (1,), 0.25), var[..., :-1]], axis=-1)
    return np.sqrt(2 * math.log(1 / alpha) / (n * before))


def rejects(z: np.ndarray, m: np.ndarray | float, alpha: float, bets: np.ndarray | None = None) -> np.ndarray:
    """Whether "mean of ``z`` <= ``m``" is rejected at level ``alpha``: the capital's running maximum reaches
    ``1/alpha``.

    Args:
        z: ``(..., n)`` values in ``[0, 1]`` (NaN: missing).
        m: candidate means in ``[0, 1]``, broadcastable to ``(...)``.
        bets: :func:`_bets` of ``z`` (computed when omitted; reused across candidates).

    Returns:
        ``(...)`` bool.
    """
    bets = _bets(z, alpha) if bets is None else bets
    m = np.asarray(m, dtype=float)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.minimum(bets, np.where(m > 0, TRUNCATION / np.where(m > 0, m, 1.0), np.inf))
        factor = np.where(np.isnan(z), 1.0, 1.0 + lam * (z - m))
    log_capital = np.cumsum(np.log(factor), axis=-1)
    return log_capital.max(axis=-1) >= math.log(1 / alpha)


def lower_bound(x: np.ndarray, alpha: float, low: float, high: float) -> np.ndarray:
    """One-sided ``1 - alpha`` lower confidence bound for the mean of ``x`` in ``[low, high]``: the largest
    candidate mean that :func:`rejects` (``low`` when none is, e.g. without data).

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
    bets = _bets(z, alpha)
    below = np.zeros(z.shape[:-1])  # rejected (or the range's end)
    above = np.ones(z.shape[:-1])  # never rejected: every factor is <= 1 at m = 1
    for _ in range(STEPS):
        middle = (below + above) / 2
        hit = rejects(z, middle, alpha, bets)
        below, above = np.where(hit, middle, below), np.where(hit, above, middle)
    return low + (high - low) * below


def upper_bound(x: np.ndarray, alpha: float, low: float, high: float) -> np.ndarray:
    """One-sided ``1 - alpha`` upper confidence bound for the mean of ``x`` in ``[low, high]`` (the lower bound
    of ``-x``)."""
    return -lower_bound(-np.asarray(x, dtype=float), alpha, -high, -low)


def ratio_exceeds(w: np.ndarray, b: np.ndarray, q: np.ndarray | float, alpha: float, high: float) -> np.ndarray:
    """Whether ``E[w] / E[b] <= q`` is rejected at level ``alpha``, i.e. ``E[w - q b] > 0`` is shown, for paired
    ``w, b`` in ``[0, high]`` (``(..., n)``, NaN: a missing pair): the betting test on
    ``z = (w - q b + q high) / ((1 + q) high)`` in ``[0, 1]`` at ``m = q / (1 + q)``."""
    q = np.asarray(q, dtype=float)[..., None]
    z = (w - q * b + q * high) / ((1 + q) * high)
    return rejects(z, (q / (1 + q))[..., 0], alpha)


def ratio_falls_short(w: np.ndarray, b: np.ndarray, q: np.ndarray | float, alpha: float,
                      high: float) -> np.ndarray:
    """Whether ``E[w] / E[b] >= q`` is rejected at level ``alpha`` (``E[q b - w] > 0`` is shown): the betting
    test on ``z = (q b - w + high) / ((1 + q) high)`` at ``m = 1 / (1 + q)``."""
    q = np.asarray(q, dtype=float)[..., None]
    z = (q * b - w + high) / ((1 + q) * high)
    return rejects(z, (1 / (1 + q))[..., 0], alpha)


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
