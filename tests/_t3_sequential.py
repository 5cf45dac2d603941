"""A group-sequential false-positive-rate check: the power of 2,000 unwatermarked texts for half the texts.

The fixed test counted false alarms on N = 2,000 texts and failed above the upper end of the 99% binomial band
around alpha = 0.02 (57 alarms). Exactly (binomial, independent texts), a correct detector (rate 0.02) fails it with
probability 0.0040, and a broken one whose rate is twice nominal (0.04) fails with probability 0.9963.

This check looks at the count X_n after every LOOK = 250 texts, n = 250, 500, ..., N_MAX = 2,500:

* pass as soon as X_n <= floor(SLOPE * n - PASS_MARGIN),
* fail as soon as X_n >  ceil(SLOPE * n + FAIL_MARGIN),
* at n = N_MAX: fail iff X_n > FINAL.

SLOPE = ln(0.98 / 0.96) / ln(2 * 0.98 / 0.96) = 0.0289 is the slope of Wald's sequential likelihood-ratio test of
0.02 against 0.04; PASS_MARGIN = 7, FAIL_MARGIN = 6 and FINAL = 70 are the margins of least expected work among
those searched (looks of 250 or 500, N_MAX 2,000-3,000) that are at least as strict as the fixed test on both sides.
Exact probabilities (``operating_characteristic``, a convolution of binomial counts between looks, checked in
tests/test_size.py::test_sequential_fpr_check_is_as_strict_as_the_fixed_2000_text_test):

| true rate | P(fail) | expected texts read |
|---|---|---|
| 0.02 (nominal) | 0.0039 (fixed test: 0.0040) | 994 (fixed: 2,000) |
| 0.04 (twice nominal) | 0.9971 (fixed test: 0.9963) | 863 |

A conservative null (rate below 0.02: the discrete exact nulls, permutation p-values with ties) stops sooner still.
The data are seeded, so a pass is the same pass on every run; the numbers above say how likely it is that a break
which doubles the false-positive rate is missed for a seed (0.3%), and how likely that a correct detector is failed
by its seed (0.4%).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats

NOMINAL = 0.02
LOOK = 250
N_MAX = 2500
SLOPE = math.log((1 - NOMINAL) / (1 - 2 * NOMINAL)) / math.log(2 * (1 - NOMINAL) / (1 - 2 * NOMINAL))
PASS_MARGIN = 7.0
FAIL_MARGIN = 6.0
FINAL = 70
LOOKS = list(range(LOOK, N_MAX + 1, LOOK))


def boundaries() -> tuple[list[int], list[int]]:
    """At each look n: pass if X_n <= passes[k], fail if X_n > fails[k] (equal at the last look)."""
    passes = [math.floor(SLOPE * n - PASS_MARGIN) for n in LOOKS[:-1]] + [FINAL]
    fails = [math.ceil(SLOPE * n + FAIL_MARGIN) for n in LOOKS[:-1]] + [FINAL]
    return passes, fails


def operating_characteristic(rate: float) -> tuple[float, float]:
    """(P(fail), expected texts read) when each text is a false alarm independently with probability ``rate``."""
    passes, fails = boundaries()
    alive = np.array([1.0])  # P(X_n = x and no decision yet)
    failed, read, previous = 0.0, 0.0, 0
    for n, low, high in zip(LOOKS, passes, fails):
        read += alive.sum() * (n - previous)
        alive = np.convolve(alive, stats.binom.pmf(np.arange(n - previous + 1), n - previous, rate))
        failed += alive[high + 1:].sum()
        alive[high + 1:] = 0.0
        alive[:low + 1] = 0.0
        previous = n
    return float(failed), float(read)


def sequential_false_alarms(alarms_of: Callable[[int, int], int]) -> tuple[bool, int, int]:
    """Run the check. ``alarms_of(start, stop)`` counts the false alarms among texts start..stop-1 (independent
    texts; the caller makes them). Returns (passed, alarms, texts read)."""
    passes, fails = boundaries()
    alarms, previous = 0, 0
    for n, low, high in zip(LOOKS, passes, fails):
        alarms += alarms_of(previous, n)
        previous = n
        if alarms > high:
            return False, alarms, n
        if alarms <= low:
            return True, alarms, n
    raise AssertionError("unreachable: the last look decides")
