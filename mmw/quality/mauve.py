"""MAUVE (Pillutla et al., 2021) between baseline and watermarked texts, on precomputed features.

``mauve-text`` computes features with gpt2-large from the hub unless given features; here the features are the
scoring model's hidden states (:mod:`mmw.quality.scoring`), so nothing is downloaded. MAUVE is noisy on small
samples (the paper: it wants thousands of texts; its own spread was 1.3 points at 296): with the default few dozen
texts, read it as a sanity check, not a measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MauveResult:
    """``value`` in (0, 1] (1 = the two samples are indistinguishable to the quantised features)."""

    value: float
    n_baseline: int
    n_watermarked: int
    num_buckets: int | str
    wall_s: float


def mauve_score(baseline: np.ndarray, watermarked: np.ndarray, num_buckets: int | str = "auto",
                seed: int = 25) -> MauveResult:
    """MAUVE of two feature matrices of shape (n_p, d) and (n_q, d) (rows with non-finite values are dropped)."""
    from mauve import compute_mauve

    p = baseline[np.isfinite(baseline).all(axis=1)]
    q = watermarked[np.isfinite(watermarked).all(axis=1)]
    started = time.perf_counter()
    result = compute_mauve(p_features=p, q_features=q, num_buckets=num_buckets, device_id=-1, seed=seed,
                           verbose=False)
    return MauveResult(float(result.mauve), len(p), len(q), num_buckets, time.perf_counter() - started)
