"""MAUVE (Pillutla et al., 2021; quality measure ``mauve``) between baseline and watermarked texts, on precomputed features.

``mauve-text`` computes features with gpt2-large from the hub unless given features; here the features are the
scoring model's hidden states (:mod:`mmw.quality.scoring`), so nothing is downloaded. MAUVE is noisy on small
samples (the paper: it wants thousands of texts; its own spread was 1.3 points at 296): with the default few dozen
texts, read it as a sanity check, not a measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmw.seeds import derive_seed
from mmw.quality.base import QualityMetric, Texts, number


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


class Mauve(QualityMetric):
    """Pooled over all tasks (per task it would rest on a handful of texts); its run time goes to the timings log
    (`mmw timings`), not to quality.json (a DVC output that aggregate reads)."""

    name = "mauve"
    needs_scorer = True
    pooled = True
    summary_pooled = ("MAUVE baseline vs watermarked (all tasks): **{value}** (n = {n_baseline} + {n_watermarked}; "
                      "noisy below thousands of texts)")

    def pool(self, texts: Texts) -> dict[str, Any]:
        assert texts.scores is not None, "the stage scores the texts for a measure that needs_scorer"
        is_base = (texts.table["source"] == "baseline").to_numpy()
        features = texts.scores.features
        result = mauve_score(features[is_base], features[~is_base], self.settings.mauve_buckets,
                             seed=derive_seed(texts.seed, "mauve") % (2**31))
        return {"value": number(result.value), "n_baseline": result.n_baseline,
                "n_watermarked": result.n_watermarked, "num_buckets": result.num_buckets}
