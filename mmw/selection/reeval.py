"""Re-evaluation of picks: K fresh seeds and keys per pick, summarised as median (MAD).

A pick is the smallest size among many settings measured once, so its own size is optimistically biased.
The paper re-runs each pick with fresh seeds and keys and reports the median and the median absolute
deviation (MAD, unscaled: ``median(|x - median(x)|)``, as ``scipy.stats.median_abs_deviation`` with its
default ``scale=1.0``). A re-run whose watermark was not detected has size +inf; the median is then inf when
at least half the re-runs were undetected, and the MAD is null whenever the median is not finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import median_abs_deviation

#: Name prefix that marks re-evaluation experiments: they never enter a selection pool.
REEVAL_PREFIX = "reeval-"


def is_reevaluation(name: str | None) -> bool:
    return bool(name) and str(name).startswith(REEVAL_PREFIX)


def median_mad(sizes: Sequence[float | None]) -> tuple[float | None, float | None]:
    """``(median, MAD)`` of re-evaluated sizes; None (undetected) counts as +inf. Empty -> ``(None, None)``."""
    values = np.array([math.inf if s is None or (isinstance(s, float) and math.isnan(s)) else float(s)
                       for s in sizes], dtype=float)
    if values.size == 0:
        return None, None
    median = float(np.median(values))
    if not math.isfinite(median):
        return math.inf, None
    # Undetected re-runs (inf) lie in the upper half here, so the MAD stays finite.
    return median, float(median_abs_deviation(values, scale=1.0))
