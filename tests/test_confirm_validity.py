"""The quality confirmation when prompts are independent but not identically distributed: tasks of different
quality read in the order the confirmation reads them (prompt ids sorted, tasks grouped, the best first), through
its own path (per-prompt rows -> evidence -> quality bounds -> verdict); and the distribution-free floor of
prompts that no valid test goes below."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from mmw.betting import floor, log_capital, ratio_exceeds
from mmw.selection import Constraints
from mmw.sweep.confirm import CONFIRMED, RATING_MAX, quality_bounds, verdict
from mmw.sweep.evidence import evidence

K, ALPHA = 5, 0.025


def not_above(hits: int, n: int, level: float) -> bool:
    """``hits / n`` is consistent with a rate ``<= level`` (one-sided binomial test at 1 %)."""
    return binomtest(hits, n, level, alternative="greater").pvalue > 0.01


def task_cells(rng: np.random.Generator, cells: int, per_task: int, ratios: tuple[float, ...]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Ratings ``(cells, K, n)``, tasks in the given order, each task's true relative quality its ratio (the noise
    model of bench/sweep_simulation.py: baseline ``N(50, 12.5)`` with 10 % run noise, watermarked
    ``rho b (1 + N(0, 0.2))``)."""
    rho = np.repeat(np.asarray(ratios), per_task)[None, None, :]
    n = rho.shape[-1]
    baseline = np.clip(np.maximum(rng.normal(50, 12.5, (cells, 1, n)), 1.0)
                       * (1 + rng.normal(0, 0.1, (cells, K, n))), 0, RATING_MAX)
    return np.clip(rho * baseline * (1 + rng.normal(0, 0.2, baseline.shape)), 0, RATING_MAX), baseline


def rows_of(watermarked: np.ndarray, baseline: np.ndarray, per_task: int) -> pl.DataFrame:
    """One cell's per-prompt rows as collection stores them (tasks ``a`` < ``b`` < ``c`` in sorted order)."""
    k, n = watermarked.shape
    ids = [f"{'abc'[i // per_task]}-{i % per_task:03d}" for i in range(n)]
    return pl.concat([pl.DataFrame({"experiment": np.repeat([f"run-{r}" for r in range(k)], n),
                                    "prompt_id": ids * k, "task": [i[0] for i in ids] * k, "source": source,
                                    "attack": "", "rating": ratings.ravel(), "in_R": False, "ok": True})
                      for source, ratings in (("baseline", baseline), ("watermarked", watermarked))])


def test_tasks_on_both_sides_of_the_limit_confirm_at_most_at_the_level() -> None:
    """Three tasks of 96 prompts with relative qualities 1.0 / 0.9 / 0.8 (pooled exactly at the 0.9 limit), the
    best first as the confirmation reads them: confirmed at most at the per-try level. The sequential test this
    replaced confirmed most of these cells (its capital crossed 1/alpha on the first task)."""
    rng = np.random.default_rng(11)
    cells, per_task, q = 300, 96, 0.9
    watermarked, baseline = task_cells(rng, cells, per_task, (1.0, 0.9, 0.8))
    # The confirmation's own path on the first cells: evidence() reads the rows in this (sorted) prompt order.
    for cell in range(3):
        found = evidence(rows_of(watermarked[cell], baseline[cell], per_task), [100.0] * K)
        assert np.array_equal(found.watermarked, watermarked[cell])
        assert np.array_equal(found.baseline, baseline[cell])
    _, low, high = quality_bounds(watermarked, baseline, ALPHA, q)
    nan = np.full(cells, np.nan)
    status, _ = verdict(np.zeros(cells, dtype=bool), low, high, nan, nan,
                        Constraints(max_quality_loss=1 - q, min_tamper_resistance=0.0))
    assert not_above(int((status == CONFIRMED).sum()), cells, ALPHA)


def test_the_verdict_does_not_depend_on_the_prompt_order() -> None:
    """Only the pooled ratio is tested: the bounds of any permutation of the prompts are the same."""
    rng = np.random.default_rng(12)
    watermarked, baseline = task_cells(rng, 40, 60, (1.02, 0.97, 0.92))
    order = rng.permutation(watermarked.shape[-1])
    first = quality_bounds(watermarked, baseline, ALPHA, 0.925)
    permuted = quality_bounds(watermarked[..., order], baseline[..., order], ALPHA, 0.925)
    for a, b in zip(first, permuted):
        np.testing.assert_allclose(a, b, rtol=1e-9)
    assert 0 < (first[1] >= 0.925).mean() < 1  # some cells confirm, not all: the comparison is not vacuous


def test_power_above_the_limit() -> None:
    """A true pooled ratio of 0.95 over three unequal tasks at 297 prompts is confirmed nearly always at 0.9, and a
    0.85 one is shown short (not confirmed) nearly always."""
    rng = np.random.default_rng(13)
    for true, side in ((0.95, "low"), (0.85, "high")):
        watermarked, baseline = task_cells(rng, 100, 99, (true + 0.05, true, true - 0.05))
        _, low, high = quality_bounds(watermarked, baseline, ALPHA, 0.9)
        shown = (low >= 0.9) if side == "low" else (high < 0.9)
        assert shown.mean() > 0.9


@pytest.mark.parametrize("margin", [1.0, 2.0, 5.0, 10.0])
def test_the_distribution_free_floor(margin: float) -> None:
    """At the 1 % loss limit (q = 0.99, ratings on 0..100) the floor of any valid test is
    ``log(1/alpha) / -log(1 - d / (d + 99))`` prompts for a margin of ``d`` rating points (``w - q b`` on every
    prompt), and this test's own best case confirms a few prompts above it, never below."""
    q = 0.99
    bound, own = floor(margin, q * RATING_MAX, ALPHA)
    assert bound == math.ceil(math.log(1 / ALPHA) / -math.log(1 - margin / (margin + 99)))
    assert bound <= own <= 1.06 * bound + 1
    # The most favourable data: every prompt w - q b = margin exactly (b = 60, w = q 60 + margin).
    for n, confirmed in ((own, True), (own - 1, False)):
        b = np.full((1, n), 60.0)
        assert ratio_exceeds(b * q + margin, b, q, ALPHA, RATING_MAX)[0] == confirmed
    # The floor is tight for a valid test: the null on {(w, b) observed, (0, 100)} with pooled ratio exactly q gives
    # those data with probability (q H / (q H + d))^n, above alpha just below the floor.
    assert (q * RATING_MAX / (q * RATING_MAX + margin)) ** (bound - 1) > ALPHA
    assert log_capital(np.full(bound - 1, margin), q * RATING_MAX) < math.log(1 / ALPHA)
