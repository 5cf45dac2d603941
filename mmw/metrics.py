"""The paper's evaluation metrics as pure functions over polars frames.

Quality ``Q`` (mean judge rating), relative quality (paired by prompt, bootstrap CI), watermark size ``E``
(median shortest detected prefix), per-attack detection rate ``W_A`` and quality retained ``Q_A``, tamper
resistance ``R`` (convex-hull AUC, anchored at the measured no-attack point) and the empirical false-positive rate
of the unwatermarked baseline with a Clopper-Pearson interval.

Input frames follow the table schemas of docs/ARCHITECTURE.md:

* detections: ``prompt_id, task, source, attack, n_tokens, pvalue, detected, size`` (size null = undetected);
  ``source == "retokenized"`` rows are the watermarked texts of the attacked prompts detected from their text
* ratings: ``prompt_id, task, source, attack, rating`` (rating null = the judge failed)
* perturbed: ``prompt_id, task, attack, family, in_R, ok`` (ok false = the attack itself failed)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl
from scipy.spatial import ConvexHull
from scipy.stats import binomtest, bootstrap

#: The "trivial attack" (returns the empty string: no quality left, nothing detected). Always attainable, so it
#: always belongs to the hull; so does "no attack", at full quality and the *measured* detection rate.
TRIVIAL_ATTACK = (0.0, 0.0)
#: Bootstrap resamples and seed of the relative-quality interval (fixed: the report is deterministic).
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0
#: Fewest pairs for a bootstrap interval: n pairs have C(2n - 1, n) distinct resamples (3 for n = 2, 35 for n = 4),
#: too few for the tails of a 95% interval; 5 pairs give 126.
MIN_BOOTSTRAP_PAIRS = 5


@dataclass(frozen=True)
class QualitySummary:
    """Mean rating over the rated texts; ``n_missing`` texts had no rating (judge failure) and are excluded."""

    mean: float | None
    n_rated: int
    n_missing: int

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


@dataclass(frozen=True)
class RateEstimate:
    """``k`` of ``n`` events, the estimate ``k / n`` and its exact (Clopper-Pearson) confidence interval."""

    rate: float | None
    low: float | None
    high: float | None
    k: int
    n: int
    confidence: float

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _as_missing(values: pl.Series) -> pl.Series:
    """Treat NaN like null: neither is a rating."""
    values = values.cast(pl.Float64)
    return values.fill_nan(None)


def quality(ratings: pl.Series) -> QualitySummary:
    """Quality ``Q``: mean of ``ratings`` (shape ``(n,)``, floats, null/NaN = missing) with missing excluded.

    A failed judge call must never count as a 0 (the reference code's bug), so missing values are dropped and
    counted instead. ``mean`` is None when nothing was rated.
    """
    values = _as_missing(ratings)
    n_missing = values.null_count()
    rated = values.drop_nulls()
    mean = float(rated.mean()) if len(rated) else None
    return QualitySummary(mean=mean, n_rated=len(rated), n_missing=n_missing)


def relative_quality(q_watermarked: float | None, q_baseline: float | None) -> float | None:
    """``Q_wm / Q_baseline``: 1 means the watermark costs no quality. None when either side is unknown or 0."""
    if q_watermarked is None or q_baseline is None or q_baseline == 0:
        return None
    return q_watermarked / q_baseline


@dataclass(frozen=True)
class PairedRatio:
    """``mean(watermarked) / mean(baseline)`` over the ``n`` prompts rated on both sides, with a BCa bootstrap
    interval (None when it cannot be formed: fewer than ``MIN_BOOTSTRAP_PAIRS`` pairs, or no spread to resample)."""

    ratio: float | None
    low: float | None
    high: float | None
    n: int


def paired_relative_quality(ratings: pl.DataFrame, confidence: float = 0.95) -> PairedRatio:
    """Relative quality on the same prompts on both sides.

    The unpaired ratio of the two sides' means mixes prompt difficulty into the comparison whenever the judge fails
    on different prompts of each side; pairing keeps exactly the prompts rated as baseline *and* as watermarked.
    The interval resamples prompts (pairs), the unit that was sampled.

    Args:
        ratings: rows ``prompt_id, source, rating`` (``source`` baseline / watermarked; other sources ignored;
            null/NaN rating = missing).
    """
    def side(name: str) -> pl.DataFrame:
        return (ratings.filter(pl.col("source") == name)
                .with_columns(pl.col("rating").cast(pl.Float64).fill_nan(None))
                .drop_nulls("rating").select("prompt_id", pl.col("rating").alias(name)))

    pairs = side("watermarked").join(side("baseline"), on="prompt_id")
    watermarked, baseline = pairs["watermarked"].to_numpy(), pairs["baseline"].to_numpy()
    n = len(pairs)
    ratio = relative_quality(float(watermarked.mean()), float(baseline.mean())) if n else None
    if ratio is None or n < MIN_BOOTSTRAP_PAIRS or (np.ptp(watermarked) == 0 and np.ptp(baseline) == 0):
        return PairedRatio(ratio, None, None, n)
    interval = bootstrap((watermarked, baseline), lambda w, b, axis: w.mean(axis=axis) / b.mean(axis=axis),
                         paired=True, vectorized=True, confidence_level=confidence, method="BCa",
                         n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(BOOTSTRAP_SEED)
                         ).confidence_interval
    low, high = (None if not np.isfinite(v) else float(v) for v in (interval.low, interval.high))
    return PairedRatio(ratio, low, high, n)


def watermark_size(sizes: pl.Series) -> float | None:
    """Watermark size ``E``: median over generations of the shortest detected prefix (tokens).

    ``sizes`` has shape ``(n,)``; null marks a generation where no prefix was detected, which counts as
    ``+inf``. Hence ``E = inf`` as soon as at least half of the generations are undetected (with an even count
    the median averages the two middle values, and ``x + inf = inf``). None for an empty input.
    """
    if len(sizes) == 0:
        return None
    lengths = sizes.cast(pl.Float64).fill_null(math.inf).to_numpy()
    return float(np.median(lengths))


def quality_retained(q_attacked: float | None, q_reference: float | None) -> float | None:
    """``Q_A = max(0, min(Q*_A / Q, 1))``: clipped ratio of attacked to unattacked (watermarked) quality."""
    if q_attacked is None or q_reference is None or q_reference <= 0:
        return None
    return max(0.0, min(q_attacked / q_reference, 1.0))


def detection_rate(detected: pl.Series, confidence: float = 0.95) -> RateEstimate:
    """Fraction of ``detected`` (bool, shape ``(n,)``) that is true, with an exact binomial interval.

    On unwatermarked baseline texts this is the empirical false-positive rate (it should stay near the
    detector's ``alpha``); on watermarked or attacked texts it is the detection rate ``W_A``.
    """
    flags = detected.drop_nulls().cast(pl.Boolean)
    n = len(flags)
    k = int(flags.sum())
    if n == 0:
        return RateEstimate(rate=None, low=None, high=None, k=0, n=0, confidence=confidence)
    interval = binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return RateEstimate(rate=k / n, low=float(interval.low), high=float(interval.high), k=k, n=n,
                        confidence=confidence)


def _validated_points(points: Sequence[tuple[float, float]] | np.ndarray) -> np.ndarray:
    array = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"tamper-resistance points must be finite, got {array.tolist()}")
    if np.any(array < 0) or np.any(array > 1):
        raise ValueError(f"tamper-resistance points must lie in [0, 1]^2 (Q_A, W_A), got {array.tolist()}")
    return array


def tamper_frontier(points: Sequence[tuple[float, float]] | np.ndarray, no_attack: float) -> np.ndarray:
    """The attacker's best trade-off curve: the lower boundary of the convex hull of the attack points.

    Geometry (paper, "Tamper resistance"). Each attack ``A`` is a point ``(Q_A, W_A)`` in the unit square:
    x = quality retained, y = fraction of texts still detected as watermarked. ``(1, W_0)`` is "no attack" (full
    quality by definition, and the *measured* detection rate ``W_0`` of the unattacked texts: assuming ``W_0 = 1``
    would credit the scheme with detections it does not make) and ``(0, 0)`` the trivial attack that returns the
    empty string; both are always available. An attacker who applies attack ``A`` to a fraction ``t`` of texts
    and ``B`` to the rest reaches (on average) the segment between the two points, so every point of the convex
    hull of ``{(0,0), (1,W_0), attacks}`` is attainable. The attacker wants high quality and low detection, i.e.
    points towards ``(1, 0)``: the frontier of best attacks is the *lower* chain of the hull, a convex,
    non-decreasing function ``f`` on ``[0, 1]`` with ``f(0) = 0``; it runs from ``(0, 0)`` to the lowest hull
    point at the largest retained quality (then the hull closes up along a vertical edge, which has no area under
    it). With no effective attack ``f`` is the line to ``(1, W_0)`` (area ``W_0 / 2``); an attack at ``(1, 0)``
    makes ``f = 0`` (area 0).

    To keep qhull's input two-dimensional even when every point is collinear (e.g. only the diagonal), the
    point ``(0, 1)`` is added: it lies above every possible lower chain (the chain is 0 at x = 0), so it never
    changes the frontier.

    Args:
        points: shape ``(n, 2)`` of ``(Q_A, W_A)`` in ``[0, 1]``; may be empty.
        no_attack: ``W_0`` in ``[0, 1]``, the detection rate without attack of the texts that were attacked.

    Returns:
        shape ``(m, 2)``: the frontier's vertices sorted by quality, from ``(0, 0)`` to the right end.
    """
    attack_points = _validated_points(points)
    anchors = np.vstack([TRIVIAL_ATTACK, _validated_points([(1.0, no_attack)]), (0.0, 1.0)])
    cloud = np.unique(np.vstack([anchors, attack_points]), axis=0)
    hull = ConvexHull(cloud)
    # hull.equations rows are (n_x, n_y, offset) with outward normals: facets facing down (n_y < 0) form
    # the lower chain; vertical facets (n_y == 0) carry no area and are left out.
    lower_facets = hull.simplices[hull.equations[:, 1] < -1e-12]
    vertices = np.unique(cloud[lower_facets.ravel()], axis=0)
    return vertices[np.lexsort((vertices[:, 1], vertices[:, 0]))]


def tamper_resistance(points: Sequence[tuple[float, float]] | np.ndarray, no_attack: float) -> float:
    """Tamper resistance ``R = 2 * AUC`` of the lower hull frontier (see :func:`tamper_frontier`).

    ``R`` lies in ``[0, W_0]``: ``W_0`` when no attack beats mixing "no attack" with "empty string" (so 1 only
    for a scheme that detects every unattacked text), 0 when some attack keeps full quality and removes every
    watermark (a point at ``(1, 0)``). Weakening any attack (lower ``Q_A`` or higher ``W_A``) can only raise ``R``.

    Args:
        points: shape ``(n, 2)`` of ``(Q_A, W_A)`` for the attacks counted in ``R`` (paraphrases excluded).
        no_attack: ``W_0``, the measured detection rate of the attacked texts before the attack.
    """
    frontier = tamper_frontier(points, no_attack)
    area = float(np.trapezoid(frontier[:, 1], frontier[:, 0]))
    return min(1.0, max(0.0, 2.0 * area))


def attack_points(detections: pl.DataFrame, ratings: pl.DataFrame, perturbed: pl.DataFrame,
                  by_task: bool) -> pl.DataFrame:
    """One row per attack (and per task when ``by_task``): ``W_A``, ``E_A``, ``Q*_A``, the reference ``Q`` and ``Q_A``.

    * ``watermarked`` (``W_A``): fraction of successfully attacked texts still detected.
    * ``no_attack_watermarked`` (``W_0``, the same on every row of a task or of the pooled table): fraction of the
      watermarked texts of the attacked prompts detected from their text (``source == "retokenized"``), the
      hull's no-attack anchor; null when no such row exists.
    * ``quality_attacked`` (``Q*_A``) and ``quality_reference`` (``Q``): mean ratings of the attacked texts and
      of the *watermarked* texts they came from, over the prompts where both were rated. Pairing the prompts
      matters because only the first part of each task is attacked: comparing against the whole task's
      watermarked quality would mix prompt difficulty into ``Q_A``.
    * ``quality_retained`` (``Q_A``) = clip(``Q*_A / Q``, 0, 1).
    * ``n`` attacked texts, ``n_failed`` texts where the attack itself failed (excluded from everything).

    Args:
        detections, ratings: rows with ``source`` ``attack``/``retokenized`` and ``watermarked`` are used.
        perturbed: the perturbation table (``attack, family, in_R, ok`` per ``prompt_id``).
    """
    keys = ["attack", "task"] if by_task else ["attack"]
    attack_meta = perturbed.select("attack", "family", "in_R").unique(subset="attack", keep="first")
    ok_rows = perturbed.filter(pl.col("ok")).select("prompt_id", "attack")
    failed = perturbed.group_by(keys).agg((~pl.col("ok")).sum().alias("n_failed"))

    attacked_detections = detections.filter(pl.col("source") == "attack").join(ok_rows, on=["prompt_id", "attack"])
    detection_stats = attacked_detections.group_by(keys).agg(
        pl.len().alias("n"),
        pl.col("detected").cast(pl.Float64).mean().alias("watermarked"),
        pl.col("size").alias("sizes"),
    ).with_columns(
        pl.col("sizes").map_elements(lambda s: watermark_size(pl.Series(s, dtype=pl.Int64)),
                                     return_dtype=pl.Float64).alias("size"),
    ).drop("sizes")

    attacked_ratings = (ratings.filter(pl.col("source") == "attack").join(ok_rows, on=["prompt_id", "attack"])
                        .with_columns(pl.col("rating").fill_nan(None))
                        .select("prompt_id", "task", "attack", pl.col("rating").alias("rating_attacked")))
    reference = (ratings.filter(pl.col("source") == "watermarked")
                 .with_columns(pl.col("rating").fill_nan(None))
                 .select("prompt_id", pl.col("rating").alias("rating_reference")))
    paired = attacked_ratings.join(reference, on="prompt_id").filter(
        pl.col("rating_attacked").is_not_null() & pl.col("rating_reference").is_not_null())
    quality_stats = paired.group_by(keys).agg(
        pl.col("rating_attacked").mean().alias("quality_attacked"),
        pl.col("rating_reference").mean().alias("quality_reference"),
        pl.len().alias("n_rated"),
    )

    group = keys[1:]  # the task, or nothing for the pooled table
    retokenized = detections.filter(pl.col("source") == "retokenized")
    no_attack = pl.col("detected").cast(pl.Float64).mean().alias("no_attack_watermarked")
    table = (failed.join(detection_stats, on=keys, how="left")
             .join(quality_stats, on=keys, how="left")
             .join(attack_meta, on="attack", how="left")
             .with_columns(pl.col("n").fill_null(0), pl.col("n_rated").fill_null(0)))
    if group:
        table = table.join(retokenized.group_by(group).agg(no_attack), on=group, how="left")
    else:
        table = table.with_columns(pl.lit(retokenized["detected"].cast(pl.Float64).mean(), dtype=pl.Float64)
                                   .alias("no_attack_watermarked"))
    retained = [quality_retained(a, r) for a, r in
                zip(table["quality_attacked"].to_list(), table["quality_reference"].to_list(), strict=True)]
    table = table.with_columns(pl.Series("quality_retained", retained, dtype=pl.Float64))
    columns = [*keys, "family", "in_R", "n", "n_failed", "n_rated", "watermarked", "size",
               "quality_attacked", "quality_reference", "quality_retained", "no_attack_watermarked"]
    return table.select(columns).sort(keys)


def tamper_resistance_of(points_table: pl.DataFrame) -> float | None:
    """``R`` from an :func:`attack_points` table (one task, or the pooled rows): only attacks with ``in_R`` and
    both coordinates known, anchored at the table's measured ``no_attack_watermarked``.

    None when no attack qualifies (R is undefined without attacks, not 1) or the no-attack point is unmeasured.
    """
    usable = points_table.filter(
        pl.col("in_R") & pl.col("watermarked").is_not_null() & pl.col("quality_retained").is_not_null())
    anchors = usable["no_attack_watermarked"].drop_nulls().unique()
    if anchors.len() > 1:
        raise ValueError(f"one group's attack points expected, got no-attack rates {anchors.to_list()}")
    if usable.height == 0 or anchors.len() == 0:
        return None
    return tamper_resistance(usable.select("quality_retained", "watermarked").to_numpy(), float(anchors[0]))
