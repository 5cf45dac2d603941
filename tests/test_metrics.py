"""Metrics: hull geometry of tamper resistance, watermark size with infinities, quality with missing ratings."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from mmw.metrics import (
    attack_points,
    detection_rate,
    quality,
    quality_retained,
    relative_quality,
    tamper_frontier,
    tamper_resistance,
    tamper_resistance_of,
    watermark_size,
)

# --- tamper resistance: hand-made configurations -------------------------------------------------------------


def test_no_attack_succeeds_gives_r_one() -> None:
    # Attacks that either keep the watermark fully or destroy quality proportionally never beat the diagonal.
    assert tamper_resistance([]) == pytest.approx(1.0)
    assert tamper_resistance([(1.0, 1.0), (0.6, 1.0), (0.3, 0.3), (0.0, 0.5)]) == pytest.approx(1.0)


def test_perfect_attack_gives_r_zero() -> None:
    # One attack that keeps full quality and removes every watermark makes the scheme tamperable.
    assert tamper_resistance([(1.0, 0.0)]) == pytest.approx(0.0)
    assert tamper_resistance([(1.0, 0.0), (0.8, 0.9), (0.4, 0.1)]) == pytest.approx(0.0)


def test_single_attack_area_matches_hand_computation() -> None:
    # Frontier (0,0) -> (0.8, 0.2) -> (1, 1): area = 0.8*0.1 + 0.2*0.6 = 0.2, R = 0.4.
    assert tamper_resistance([(0.8, 0.2)]) == pytest.approx(0.4)
    # Full-quality attack leaving half the watermarks: triangle (0,0)-(1,0.5), area 0.25, R = 0.5.
    assert tamper_resistance([(1.0, 0.5)]) == pytest.approx(0.5)


def test_points_inside_the_hull_do_not_matter() -> None:
    frontier_only = tamper_resistance([(0.9, 0.1), (0.5, 0.02)])
    # (0.7, 0.5) lies above the segment joining the two frontier attacks; it is dominated.
    assert tamper_resistance([(0.9, 0.1), (0.5, 0.02), (0.7, 0.5)]) == pytest.approx(frontier_only)


def test_frontier_is_lower_chain_sorted_from_origin() -> None:
    frontier = tamper_frontier([(0.9, 0.1), (0.5, 0.02), (0.7, 0.5), (0.2, 0.9)])
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
        r = tamper_resistance(points)
        assert 0.0 <= r <= 1.0


def test_r_monotone_when_an_attack_gets_weaker() -> None:
    rng = np.random.default_rng(11)
    for _ in range(300):
        points = rng.uniform(0, 1, size=(rng.integers(1, 7), 2))
        before = tamper_resistance(points)
        weaker = points.copy()
        i = rng.integers(len(points))
        # Weaker: less quality retained and/or more texts still watermarked.
        weaker[i, 0] = rng.uniform(0, points[i, 0])
        weaker[i, 1] = rng.uniform(points[i, 1], 1)
        assert tamper_resistance(weaker) >= before - 1e-12
        removed = np.delete(points, i, axis=0)
        assert tamper_resistance(removed) >= before - 1e-12


def test_r_matches_brute_force_lower_envelope() -> None:
    # Independent check: the lower envelope of the hull at x is the minimum over mixtures of two points.
    rng = np.random.default_rng(3)
    xs = np.linspace(0, 1, 2001)
    for _ in range(20):
        points = np.vstack([[(0, 0), (1, 1)], rng.uniform(0, 1, size=(4, 2))])
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
        assert tamper_resistance(points[2:]) == pytest.approx(2 * np.trapezoid(envelope, xs), abs=2e-3)


def test_points_outside_unit_square_rejected() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tamper_resistance([(1.2, 0.3)])
    with pytest.raises(ValueError, match="finite"):
        tamper_resistance([(math.nan, 0.3)])


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


def test_detection_rate_clopper_pearson() -> None:
    estimate = detection_rate(pl.Series([True] + [False] * 99))
    assert estimate.rate == pytest.approx(0.01)
    assert estimate.low < 0.01 < estimate.high
    # Known exact interval for 0 of 50 at 95%: upper bound 1 - 0.025^(1/50).
    zero = detection_rate(pl.Series([False] * 50))
    assert zero.low == 0.0
    assert zero.high == pytest.approx(1 - 0.025 ** (1 / 50))
    assert detection_rate(pl.Series([], dtype=pl.Boolean)).rate is None


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


def _toy_tables() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    prompts = [("b0", "books"), ("b1", "books"), ("s0", "stories"), ("s1", "stories")]
    perturbed_rows, detection_rows, rating_rows = [], [], []
    for prompt_id, task in prompts:
        detection_rows.append((prompt_id, task, "watermarked", "", True, 30))
        rating_rows.append((prompt_id, task, "watermarked", "", 0.8))
        # "lower": keeps the watermark, costs half of the quality.
        perturbed_rows.append((prompt_id, task, "lower", "case", True, True))
        detection_rows.append((prompt_id, task, "attack", "lower", True, 30))
        rating_rows.append((prompt_id, task, "attack", "lower", 0.4))
        # "swap": removes the watermark from stories only; one judge failure; fails outright on b1.
        ok = prompt_id != "b1"
        perturbed_rows.append((prompt_id, task, "swap", "swap", True, ok))
        if ok:
            detection_rows.append((prompt_id, task, "attack", "swap", task == "books", 30 if task == "books" else None))
            rating_rows.append((prompt_id, task, "attack", "swap", None if prompt_id == "s1" else 0.8))
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
    assert rows["lower"]["watermarked"] == 1.0 and rows["lower"]["quality_retained"] == pytest.approx(0.5)
    assert rows["lower"]["size"] == 30.0
    swap = rows["swap"]
    assert (swap["n"], swap["n_failed"], swap["n_rated"]) == (3, 1, 2)
    assert swap["watermarked"] == pytest.approx(1 / 3)
    assert swap["size"] == math.inf
    assert swap["quality_retained"] == pytest.approx(1.0)
    assert rows["para"]["in_R"] is False
    # R uses lower and swap only: frontier (0,0) -> (1, 1/3), area 1/6, R = 1/3. With the paraphrase (at (1, 0))
    # it would be 0.
    assert tamper_resistance_of(table) == pytest.approx(1 / 3)


def test_attack_points_by_task() -> None:
    detections, ratings, perturbed = _toy_tables()
    table = attack_points(detections, ratings, perturbed, by_task=True)
    swap_stories = table.filter((pl.col("attack") == "swap") & (pl.col("task") == "stories")).row(0, named=True)
    assert swap_stories["watermarked"] == 0.0
    assert tamper_resistance_of(table.filter(pl.col("task") == "stories")) == pytest.approx(0.0)
    assert tamper_resistance_of(table.filter(pl.col("task") == "books")) == pytest.approx(1.0)
    assert tamper_resistance_of(table.filter(pl.col("in_R").not_())) is None
