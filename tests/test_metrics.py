"""Metrics: hull geometry of tamper resistance (anchored at the measured no-attack point), watermark size with
infinities, quality with missing ratings, per-prompt pairing, metrics.json encoding, FPR audit keys."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pytest

from mmw.audit import audit_keys
from mmw.metrics import (
    PairedRatio,
    RateEstimate,
    attack_points,
    detection_rate,
    paired_relative_quality,
    quality,
    quality_retained,
    relative_quality,
    tamper_frontier,
    tamper_resistance,
    tamper_resistance_of,
    watermark_size,
)
from mmw.reporting.run import build_metrics

# --- tamper resistance: hand-made configurations -------------------------------------------------------------


def test_no_attack_succeeds_gives_r_one() -> None:
    # Attacks that either keep the watermark fully or destroy quality proportionally never beat the diagonal.
    assert tamper_resistance([], no_attack=1.0) == pytest.approx(1.0)
    assert tamper_resistance([(1.0, 1.0), (0.6, 1.0), (0.3, 0.3), (0.0, 0.5)], no_attack=1.0) == pytest.approx(1.0)


def test_perfect_attack_gives_r_zero() -> None:
    # One attack that keeps full quality and removes every watermark makes the scheme tamperable.
    assert tamper_resistance([(1.0, 0.0)], no_attack=1.0) == pytest.approx(0.0)
    assert tamper_resistance([(1.0, 0.0), (0.8, 0.9), (0.4, 0.1)], no_attack=1.0) == pytest.approx(0.0)


def test_single_attack_area_matches_hand_computation() -> None:
    # Frontier (0,0) -> (0.8, 0.2) -> (1, 1): area = 0.8*0.1 + 0.2*0.6 = 0.2, R = 0.4.
    assert tamper_resistance([(0.8, 0.2)], no_attack=1.0) == pytest.approx(0.4)
    # Full-quality attack leaving half the watermarks: triangle (0,0)-(1,0.5), area 0.25, R = 0.5.
    assert tamper_resistance([(1.0, 0.5)], no_attack=1.0) == pytest.approx(0.5)


def test_measured_no_attack_point_caps_r() -> None:
    # Without attacks the frontier is the chord to (1, W_0): area W_0 / 2, R = W_0.
    assert tamper_resistance([], no_attack=0.7) == pytest.approx(0.7)
    # (0, 0) -> (0.8, 0.2) -> (1, 0.6): area 0.8 * 0.1 + 0.2 * 0.4 = 0.16, R = 0.32 (0.4 with an assumed (1, 1)).
    assert tamper_resistance([(0.8, 0.2)], no_attack=0.6) == pytest.approx(0.32)
    # An attack above the chord to the anchor does not count: (0.5, 0.4) lies above y = 0.6 x (0.4 > 0.3), so
    # the frontier stays the chord, R = 0.6.
    assert tamper_resistance([(0.5, 0.4)], no_attack=0.6) == pytest.approx(0.6)


def test_points_inside_the_hull_do_not_matter() -> None:
    frontier_only = tamper_resistance([(0.9, 0.1), (0.5, 0.02)], no_attack=1.0)
    # (0.7, 0.5) lies above the segment joining the two frontier attacks; it is dominated.
    assert tamper_resistance([(0.9, 0.1), (0.5, 0.02), (0.7, 0.5)], no_attack=1.0) == pytest.approx(frontier_only)


def test_frontier_is_lower_chain_sorted_from_origin() -> None:
    frontier = tamper_frontier([(0.9, 0.1), (0.5, 0.02), (0.7, 0.5), (0.2, 0.9)], no_attack=1.0)
    assert tuple(frontier[0]) == (0.0, 0.0)
    assert np.all(np.diff(frontier[:, 0]) > 0)
    # Convex and non-decreasing: slopes increase and are non-negative.
    slopes = np.diff(frontier[:, 1]) / np.diff(frontier[:, 0])
    assert np.all(slopes >= 0) and np.all(np.diff(slopes) >= -1e-12)
    assert {tuple(p) for p in frontier} == {(0.0, 0.0), (0.5, 0.02), (0.9, 0.1), (1.0, 1.0)}


def test_r_in_unit_interval_for_random_configurations() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        points = rng.uniform(0, 1, size=(rng.integers(0, 9), 2))
        points[rng.uniform(size=len(points)) < 0.2, 0] = 1.0  # attacks at full quality occur in practice
        r = tamper_resistance(points, no_attack=1.0)
        assert 0.0 <= r <= 1.0


def test_r_monotone_when_an_attack_gets_weaker() -> None:
    rng = np.random.default_rng(11)
    for _ in range(300):
        points = rng.uniform(0, 1, size=(rng.integers(1, 7), 2))
        before = tamper_resistance(points, no_attack=1.0)
        weaker = points.copy()
        i = rng.integers(len(points))
        # Weaker: less quality retained and/or more texts still watermarked.
        weaker[i, 0] = rng.uniform(0, points[i, 0])
        weaker[i, 1] = rng.uniform(points[i, 1], 1)
        assert tamper_resistance(weaker, no_attack=1.0) >= before - 1e-12
        removed = np.delete(points, i, axis=0)
        assert tamper_resistance(removed, no_attack=1.0) >= before - 1e-12


def test_r_matches_brute_force_lower_envelope() -> None:
    # Independent check: the lower envelope of the hull at x is the minimum over mixtures of two points.
    rng = np.random.default_rng(3)
    xs = np.linspace(0, 1, 2001)
    for _ in range(20):
        anchor = rng.uniform(0.3, 1)  # the measured no-attack detection rate
        points = np.vstack([[(0, 0), (1, anchor)], rng.uniform(0, 1, size=(4, 2))])
        envelope = np.full_like(xs, np.inf)
        for a in points:
            for b in points:
                lo, hi = sorted((a, b), key=lambda p: p[0])
                if hi[0] == lo[0]:
                    envelope[np.isclose(xs, lo[0])] = np.minimum(envelope[np.isclose(xs, lo[0])], min(a[1], b[1]))
                    continue
                inside = (xs >= lo[0]) & (xs <= hi[0])
                line = lo[1] + (hi[1] - lo[1]) * (xs[inside] - lo[0]) / (hi[0] - lo[0])
                envelope[inside] = np.minimum(envelope[inside], line)
        expected = 2 * np.trapezoid(envelope, xs)
        assert tamper_resistance(points[2:], no_attack=anchor) == pytest.approx(expected, abs=2e-3)


def test_points_outside_unit_square_rejected() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tamper_resistance([(1.2, 0.3)], no_attack=1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tamper_resistance([(0.5, -0.1)], no_attack=1.0)
    with pytest.raises(ValueError, match="finite"):
        tamper_resistance([(math.nan, 0.3)], no_attack=1.0)


# --- size, quality, rates --------------------------------------------------------------------------------------


def test_size_median_counts_undetected_as_infinite() -> None:
    assert watermark_size(pl.Series([40, 60, None], dtype=pl.Int64)) == 60.0
    assert watermark_size(pl.Series([40, None, None], dtype=pl.Int64)) == math.inf
    # Half undetected with an even count: the median straddles infinity.
    assert watermark_size(pl.Series([40, 50, None, None], dtype=pl.Int64)) == math.inf
    assert watermark_size(pl.Series([10, 30, 50, 70], dtype=pl.Int64)) == 40.0
    assert watermark_size(pl.Series([], dtype=pl.Int64)) is None


def test_quality_excludes_and_counts_missing() -> None:
    summary = quality(pl.Series([0.8, None, 0.4, math.nan]))
    assert summary.mean == pytest.approx(0.6)
    assert (summary.n_rated, summary.n_missing) == (2, 2)
    empty = quality(pl.Series([None, None], dtype=pl.Float64))
    assert empty.mean is None and empty.n_missing == 2


def test_relative_quality_and_quality_retained() -> None:
    assert relative_quality(0.72, 0.8) == pytest.approx(0.9)
    assert relative_quality(0.72, None) is None
    assert quality_retained(0.4, 0.8) == pytest.approx(0.5)
    assert quality_retained(0.9, 0.8) == 1.0  # clipped: attacks that "improve" quality count as 1
    assert quality_retained(-0.1, 0.8) == 0.0
    assert quality_retained(None, 0.8) is None
    # An unknown or zero reference quality has no ratio (never a crash, never a division by zero).
    assert quality_retained(0.4, None) is None and quality_retained(0.4, 0.0) is None
    assert relative_quality(0.72, 1.0) == pytest.approx(0.72) and relative_quality(0.72, 0.0) is None


def test_detection_rate_clopper_pearson() -> None:
    estimate = detection_rate(pl.Series([True] + [False] * 99))
    assert estimate.rate == pytest.approx(0.01)
    assert estimate.low < 0.01 < estimate.high
    # Known exact interval for 0 of 50 at 95%: upper bound 1 - 0.025^(1/50).
    zero = detection_rate(pl.Series([False] * 50))
    assert zero.low == 0.0
    assert zero.high == pytest.approx(1 - 0.025 ** (1 / 50))
    assert detection_rate(pl.Series([], dtype=pl.Boolean)).rate is None


def test_detection_rate_reports_its_counts_and_confidence() -> None:
    # Hand-computed: 2 of 10 at 99%: the exact interval solves P(X >= 2 | p_low) = 0.005 and P(X <= 2 | p_high) =
    # 0.005 (scipy.stats.beta quantiles of the Clopper-Pearson construction, checked against the binomial cdf).
    from scipy.stats import binom
    estimate = detection_rate(pl.Series([True, True] + [False] * 8 + [None]), confidence=0.99)
    assert (estimate.k, estimate.n, estimate.confidence, estimate.rate) == (2, 10, 0.99, 0.2)
    assert binom.sf(1, 10, estimate.low) == pytest.approx(0.005, rel=1e-6)
    assert binom.cdf(2, 10, estimate.high) == pytest.approx(0.005, rel=1e-6)
    assert detection_rate(pl.Series([], dtype=pl.Boolean), confidence=0.9) == RateEstimate(
        rate=None, low=None, high=None, k=0, n=0, confidence=0.9)


def test_fpr_interval_covers_alpha_for_a_calibrated_detector() -> None:
    # Statistical: a detector whose null p-values are uniform flags alpha of unwatermarked texts; the 95%
    # interval must cover alpha in about 95% of repetitions.
    rng = np.random.default_rng(0)
    alpha, covered = 0.02, 0
    for _ in range(200):
        flags = rng.uniform(size=300) <= alpha
        estimate = detection_rate(pl.Series(flags))
        covered += estimate.low <= alpha <= estimate.high
    assert covered >= 180


# --- attack table ------------------------------------------------------------------------------------------------


#: Watermarked and baseline ratings differ from prompt to prompt (pairing must matter); b2 and s2 are not attacked;
#: the judge failed on b2's baseline. Stored-token verdicts of the watermarked texts vs the verdicts of the same
#: texts re-tokenized (only the attacked prompts are re-tokenized): s0 flips.
WM_RATING = {"b0": 0.9, "b1": 0.5, "s0": 0.8, "s1": 0.6, "b2": 0.2, "s2": 0.7}
BASE_RATING = {"b0": 0.8, "b1": 0.6, "s0": 0.7, "s1": 0.5, "b2": None, "s2": 0.9}
STORED_DETECTED = {"b0": True, "b1": True, "s0": True, "s1": False, "b2": True, "s2": True}
RETOKENIZED_DETECTED = {"b0": True, "b1": True, "s0": False, "s1": False}
# "lower" halves each attacked text's quality and keeps every watermark; its rating of b0 is missing.
LOWER_RATING = {"b0": None, "b1": 0.25, "s0": 0.4, "s1": 0.3}


def _toy_tables() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    prompts = [("b0", "books"), ("b1", "books"), ("b2", "books"), ("s0", "stories"), ("s1", "stories"),
               ("s2", "stories")]
    perturbed_rows, detection_rows, rating_rows = [], [], []
    for prompt_id, task in prompts:
        detection_rows.append((prompt_id, task, "watermarked", "", STORED_DETECTED[prompt_id], 30))
        rating_rows.append((prompt_id, task, "watermarked", "", WM_RATING[prompt_id]))
        rating_rows.append((prompt_id, task, "baseline", "", BASE_RATING[prompt_id]))
        detection_rows.append((prompt_id, task, "baseline", "", False, None))
        if prompt_id not in RETOKENIZED_DETECTED:
            continue
        detection_rows.append((prompt_id, task, "retokenized", "", RETOKENIZED_DETECTED[prompt_id], 30))
        perturbed_rows.append((prompt_id, task, "lower", "case", True, True))
        detection_rows.append((prompt_id, task, "attack", "lower", True, 30))
        rating_rows.append((prompt_id, task, "attack", "lower", LOWER_RATING[prompt_id]))
        # "swap": removes the watermark from stories only; one judge failure; fails outright on b1.
        ok = prompt_id != "b1"
        perturbed_rows.append((prompt_id, task, "swap", "swap", True, ok))
        if ok:
            detection_rows.append((prompt_id, task, "attack", "swap", task == "books", 30 if task == "books" else None))
            rating_rows.append((prompt_id, task, "attack", "swap", None if prompt_id == "s1" else WM_RATING[prompt_id]))
        # "para" is a paraphrase: never part of R.
        perturbed_rows.append((prompt_id, task, "para", "paraphrase", False, True))
        detection_rows.append((prompt_id, task, "attack", "para", False, None))
        rating_rows.append((prompt_id, task, "attack", "para", 0.8))
    perturbed = pl.DataFrame(perturbed_rows, schema=["prompt_id", "task", "attack", "family", "in_R", "ok"],
                             orient="row")
    detections = pl.DataFrame(detection_rows, schema={"prompt_id": pl.String, "task": pl.String, "source": pl.String,
                                                      "attack": pl.String, "detected": pl.Boolean, "size": pl.Int64},
                              orient="row")
    ratings = pl.DataFrame(rating_rows, schema={"prompt_id": pl.String, "task": pl.String, "source": pl.String,
                                                "attack": pl.String, "rating": pl.Float64}, orient="row")
    return detections, ratings, perturbed


def test_attack_points_overall() -> None:
    detections, ratings, perturbed = _toy_tables()
    table = attack_points(detections, ratings, perturbed, by_task=False)
    rows = {row["attack"]: row for row in table.iter_rows(named=True)}
    assert rows["lower"]["watermarked"] == 1.0 and rows["lower"]["size"] == 30.0
    # Paired by prompt: (0.25 + 0.4 + 0.3) / (0.5 + 0.8 + 0.6) = 0.5 (b0 has no attacked rating, so its 0.9 is out).
    # Unpaired against the attacked prompts' watermarked mean: 0.95/3 / 0.7 = 0.452; against every prompt: 0.514.
    assert rows["lower"]["quality_retained"] == pytest.approx(0.5)
    swap = rows["swap"]
    assert (swap["n"], swap["n_failed"], swap["n_rated"]) == (3, 1, 2)
    assert swap["watermarked"] == pytest.approx(1 / 3)
    assert swap["size"] == math.inf
    assert swap["quality_retained"] == pytest.approx(1.0)
    assert rows["para"]["in_R"] is False
    # W_0 = re-tokenized verdicts of exactly the attacked prompts b0 b1 s0 s1: 2 of 4. Not the assumed 1, not the
    # stored-token verdicts of the same prompts (3/4), not every watermarked text (5/6).
    assert set(table["no_attack_watermarked"].to_list()) == {0.5}
    # R uses lower and swap only: frontier (0,0) -> (1, 1/3), area 1/6, R = 1/3. With the paraphrase (at (1, 0))
    # it would be 0.
    assert tamper_resistance_of(table) == pytest.approx(1 / 3)


def test_r_is_anchored_at_the_measured_no_attack_point() -> None:
    detections, ratings, perturbed = _toy_tables()
    table = attack_points(detections, ratings, perturbed, by_task=False)
    # "lower" alone sits at (0.5, 1), above the chord from (0, 0) to the no-attack point (1, W_0 = 0.5): the
    # frontier is that chord, area 1/4, R = 0.5 (an assumed (1, 1) would give 1; W_0 from stored tokens 0.75).
    assert tamper_resistance_of(table.filter(pl.col("attack") == "lower")) == pytest.approx(0.5)


def test_attack_points_by_task() -> None:
    detections, ratings, perturbed = _toy_tables()
    table = attack_points(detections, ratings, perturbed, by_task=True)
    swap_stories = table.filter((pl.col("attack") == "swap") & (pl.col("task") == "stories")).row(0, named=True)
    assert swap_stories["watermarked"] == 0.0
    anchors = dict(table.select("task", "no_attack_watermarked").unique().iter_rows())
    assert anchors == {"books": 1.0, "stories": 0.0}
    assert tamper_resistance_of(table.filter(pl.col("task") == "stories")) == pytest.approx(0.0)
    assert tamper_resistance_of(table.filter(pl.col("task") == "books")) == pytest.approx(1.0)
    assert tamper_resistance_of(table.filter(pl.col("in_R").not_())) is None
    with pytest.raises(ValueError, match="one group"):
        tamper_resistance_of(table)  # two tasks' points with two anchors


def test_r_needs_the_measured_no_attack_point() -> None:
    detections, ratings, perturbed = _toy_tables()
    table = attack_points(detections.filter(pl.col("source") != "retokenized"), ratings, perturbed, by_task=False)
    assert tamper_resistance_of(table) is None


def test_relative_quality_pairs_prompts() -> None:
    _, ratings, _ = _toy_tables()
    paired = paired_relative_quality(ratings)
    # b2's baseline rating is missing, so b2 leaves both sides: 3.5/5 over 3.5/5 = 1. The unpaired ratio of the
    # two sides' means would be (3.7/6) / (3.5/5) = 0.881.
    assert paired.n == 5
    assert paired.ratio == pytest.approx(1.0)
    assert paired.low < 1.0 < paired.high


def test_relative_quality_interval_covers_the_true_ratio() -> None:
    # Statistical: paired ratings whose watermarked side is 0.9 x the baseline's expectation on each prompt; the
    # 95% interval must cover 0.9 in most repetitions (BCa on 30 pairs: nominal 95%, accept >= 85% of 100).
    rng = np.random.default_rng(5)
    covered = 0
    for _ in range(100):
        difficulty = rng.uniform(40, 90, size=30)
        baseline = difficulty + rng.normal(0, 8, size=30)
        watermarked = 0.9 * difficulty + rng.normal(0, 8, size=30)
        ids = [f"p{i}" for i in range(30)]
        ratings = pl.DataFrame({"prompt_id": ids * 2, "source": ["baseline"] * 30 + ["watermarked"] * 30,
                                "rating": np.concatenate([baseline, watermarked])})
        estimate = paired_relative_quality(ratings)
        covered += estimate.low <= 0.9 <= estimate.high
    assert covered >= 85


def test_relative_quality_without_pairs_is_unknown() -> None:
    ratings = pl.DataFrame({"prompt_id": ["a", "b"], "source": ["baseline", "watermarked"], "rating": [0.5, 0.6]})
    assert paired_relative_quality(ratings) == PairedRatio(None, None, None, 0)
    # Four pairs: a ratio, but too few distinct resamples (35) for a 95% interval.
    few = pl.DataFrame({"prompt_id": list("abcd") * 2, "source": ["baseline"] * 4 + ["watermarked"] * 4,
                        "rating": [0.5, 0.6, 0.7, 0.8, 0.4, 0.6, 0.7, 0.9]})
    assert paired_relative_quality(few) == PairedRatio(pytest.approx(2.6 / 2.6), None, None, 4)


def _pairs(baseline: Sequence[float], watermarked: Sequence[float], **other: Sequence[Any]) -> pl.DataFrame:
    ids = [f"p{i}" for i in range(len(baseline))]
    return pl.DataFrame({"prompt_id": ids * 2, "source": ["baseline"] * len(ids) + ["watermarked"] * len(ids),
                         "rating": [*baseline, *watermarked], **other})


def test_relative_quality_interval_resamples_pairs() -> None:
    # Watermarked = 0.9 x baseline up to a tiny per-prompt noise, across very different prompts. Resampling pairs,
    # every resample's ratio stays within ~0.2% of 0.9 (interval width 0.0022); resampling the two sides
    # independently (width 0.29) or holding one side's mean fixed (0.21) lets prompt difficulty into the ratio.
    rng = np.random.default_rng(3)
    baseline = rng.uniform(20, 95, size=40)
    watermarked = 0.9 * baseline + rng.normal(0, 0.2, size=40)
    estimate = paired_relative_quality(_pairs(baseline, watermarked))
    assert estimate.low < estimate.ratio < estimate.high
    assert estimate.high - estimate.low < 0.005
    assert estimate.low < 0.9 < estimate.high
    # The same ratings, different confidence: 50% nested strictly inside 99% (the level reaches scipy).
    narrow = paired_relative_quality(_pairs(baseline, watermarked), confidence=0.5)
    wide = paired_relative_quality(_pairs(baseline, watermarked), confidence=0.99)
    assert wide.low < estimate.low < narrow.low < narrow.high < estimate.high < wide.high
    # Deterministic: the report must not change from run to run (fixed bootstrap seed), bit for bit.
    assert paired_relative_quality(_pairs(baseline, watermarked)) == estimate


def test_relative_quality_interval_with_one_constant_side_or_identical_sides() -> None:
    varied = [50.0, 60.0, 70.0, 80.0, 90.0, 55.0]
    constant = [70.0] * 6
    # One side without spread still leaves a ratio that varies across resamples: an interval.
    for baseline, watermarked in ((varied, constant), (constant, varied)):
        estimate = paired_relative_quality(_pairs(baseline, watermarked))
        assert estimate.low is not None and estimate.low < estimate.ratio < estimate.high, (baseline, watermarked)
    # Both sides constant: nothing to resample. Identical sides: every resample's ratio is exactly 1 and BCa has no
    # spread to correct (scipy returns NaN): no interval either, never a NaN.
    assert paired_relative_quality(_pairs(constant, [60.0] * 6)) == PairedRatio(pytest.approx(60 / 70), None, None, 6)
    assert paired_relative_quality(_pairs(varied, varied)) == PairedRatio(1.0, None, None, 6)


def test_relative_quality_nan_is_missing_and_other_columns_nulls_do_not_matter() -> None:
    baseline = [50.0, 60.0, 70.0, 80.0, 90.0, 55.0, 65.0]
    watermarked = [45.0, 60.0, 60.0, 75.0, 80.0, 50.0, float("nan")]
    # The attack column is null on these rows (no attack): a null elsewhere must not drop a rating.
    estimate = paired_relative_quality(_pairs(baseline, watermarked, attack=[None] * 14))
    assert estimate.n == 6
    assert estimate.ratio == pytest.approx(sum(watermarked[:6]) / sum(baseline[:6]))
    assert estimate.low is not None and math.isfinite(estimate.low) and math.isfinite(estimate.high)


# --- metrics.json ------------------------------------------------------------------------------------------------


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    return [tree]


def test_metrics_json_holds_numbers_with_sizes_side_by_side() -> None:
    detections, ratings, perturbed = _toy_tables()
    baseline_size = {"b0": 50}  # b0's baseline crossed alpha at some prefix but not at the full text
    valid = {"b0": 32, "s2": 32, "b2": 64}  # the other three watermarked texts: no checkpoint passed
    # Audit p-values of the 6 baseline texts under 4 keys: per-key FPR at alpha = 0.02 is 0, 1/6, 2/6, 0.
    audit = {"b0": [0.5, 0.01, 0.01, 0.5], "b1": [0.5, 0.5, 0.01, 0.5]}
    is_baseline = detections["source"] == "baseline"
    detections = detections.with_columns(
        n_tokens=pl.lit(100, pl.Int64), pvalue=pl.lit(0.5),
        size=pl.when(is_baseline).then(pl.col("prompt_id").replace_strict(baseline_size, default=None,
                                                                        return_dtype=pl.Int64))
        .otherwise(pl.col("size")),
        size_valid=pl.when(pl.col("source") == "watermarked")
        .then(pl.col("prompt_id").replace_strict(valid, default=None, return_dtype=pl.Int64)),
        audit_pvalues=pl.Series([audit.get(p, [0.5] * 4) if b else None
                                 for p, b in zip(detections["prompt_id"], is_baseline, strict=True)],
                                dtype=pl.List(pl.Float64)))
    metrics, _ = build_metrics(detections, ratings, perturbed, {"mode": "expected", "discriminates": True}, 0.02)
    overall = metrics["all"]
    assert overall["size"] == 30.0 and overall["size_undetected_share"] == 0.0
    # Valid sizes 32, 32, 64, inf, inf, inf: the median straddles infinity -> null, and half are undetected.
    assert overall["size_valid"] is None and overall["size_valid_undetected_share"] == pytest.approx(0.5)
    assert overall["fpr"] == 0.0 and overall["fpr_any_prefix"] == pytest.approx(1 / 6)
    assert overall["fpr_any_prefix_valid"] == 0.0
    assert (overall["fpr_key_min"], overall["fpr_key_max"]) == (0.0, pytest.approx(1 / 3))
    assert overall["fpr_key_median"] == pytest.approx(1 / 12)
    # Binomial(6, 0.02): P(X <= 1) = 0.994 >= 0.975, so the band ends at 1/6 and only the 2/6 key exceeds it.
    assert overall["fpr_key_band_high"] == pytest.approx(1 / 6) and overall["fpr_keys_above_band"] == 0.25
    assert overall["relative_quality"] == pytest.approx(1.0) and overall["relative_quality_n"] == 5
    assert overall["no_attack_watermarked"] == 0.5 and overall["retokenization_flips"] == 1
    assert metrics["attacks"]["swap"]["size"] is None  # E_A = inf: null in JSON
    for group in ("all", "books", "stories"):
        for leaf in _leaves(metrics[group]):
            assert leaf is None or (isinstance(leaf, int | float) and math.isfinite(leaf)), (group, leaf)
    for leaf in _leaves(metrics["attacks"]):
        assert leaf is None or (isinstance(leaf, int | float) and math.isfinite(leaf)), leaf
    json.dumps(metrics, allow_nan=False)  # strict JSON: no inf, no NaN


def test_audit_keys_are_deterministic_distinct_and_not_the_key() -> None:
    key = 0x0123456789ABCDEF
    keys = audit_keys(key, 16)
    assert keys == audit_keys(key, 16) and keys[:4] == audit_keys(key, 4)  # a prefix: K can grow without reshuffling
    assert len(set(keys)) == 16 and key not in keys
    assert set(keys).isdisjoint(audit_keys(key + 1, 16))
    assert all(0 <= k < 2**64 for k in keys)


def test_an_attack_that_always_failed_or_was_never_rated_keeps_its_row() -> None:
    """An attack whose every text failed (no detection, no rating) still has its row, with n = 0 and no W_A;
    NaN ratings (a failed judgement) count as missing, never as numbers."""
    detections, ratings, perturbed = _toy_tables()
    broken = pl.DataFrame([("b0", "books", "broken", "swap", True, False), ("s0", "stories", "broken", "swap", True,
                                                                           False)],
                          schema=perturbed.columns, orient="row")
    ratings = ratings.with_columns(pl.when(pl.col("attack") == "lower").then(float("nan")).otherwise(pl.col("rating"))
                                   .alias("rating"))
    table = attack_points(detections, ratings, pl.concat([perturbed, broken]), by_task=False)
    rows = {row["attack"]: row for row in table.iter_rows(named=True)}
    assert set(rows) == {"broken", "lower", "swap", "para"}
    assert (rows["broken"]["n"], rows["broken"]["n_failed"], rows["broken"]["n_rated"]) == (0, 2, 0)
    assert rows["broken"]["watermarked"] is None and rows["broken"]["family"] == "swap"
    lower = rows["lower"]
    assert (lower["n"], lower["n_rated"]) == (4, 0)
    assert lower["quality_attacked"] is None and lower["quality_retained"] is None
    assert rows["swap"]["n_rated"] == 2  # the others are untouched


def test_a_nan_reference_rating_is_missing_and_a_task_without_anchor_keeps_its_rows() -> None:
    detections, ratings, perturbed = _toy_tables()
    nan_b1 = (pl.col("prompt_id") == "b1") & (pl.col("source") == "watermarked")
    ratings = ratings.with_columns(pl.when(nan_b1).then(float("nan")).otherwise(pl.col("rating")).alias("rating"))
    lower = attack_points(detections, ratings, perturbed, by_task=False).filter(pl.col("attack") == "lower").row(
        0, named=True)
    assert lower["n_rated"] == 2 and math.isfinite(lower["quality_reference"])  # b1 left the pairs (b0 was out)
    # By task: no re-tokenized row for the stories: their attack rows stay, with no anchor (so no R).
    no_story_anchor = detections.filter(~((pl.col("source") == "retokenized") & (pl.col("task") == "stories")))
    table = attack_points(no_story_anchor, ratings, perturbed, by_task=True)
    stories = table.filter(pl.col("task") == "stories")
    assert stories.height == 3 and stories["no_attack_watermarked"].is_null().all()
    assert tamper_resistance_of(stories) is None
