"""Validity and power of the quality confirmation when tasks differ in quality: false confirmations per try with
the prompts in the order the confirmation reads them (tasks sorted, the best first), before (the sequential
betting test: predictable bets, rejecting when the running capital crosses ``1/alpha``) and after (the final-time
test with fixed bets, :mod:`mmw.betting`), and the share confirmed at a few true margins; and R's bound (the
percentile bootstrap over attacked prompts) at the true pooled R with tasks of different attack survival. Prints
Markdown (bench/results/confirm_validity.md).

Each cell is one try of one setting: ``K`` confirmation runs on ``n`` prompts split evenly over three tasks whose
relative qualities are ``q + h``, ``q``, ``q - h`` (pooled ratio exactly the limit ``q``, the worst case a valid
test may confirm at its level), ratings drawn with the noise model of bench/sweep_simulation.py (a prompt's baseline
``N(50, 12.5)``, ``--rating-mean`` moves the 50; 10 % run-to-run noise on it; the watermarked rating ``rho b (1 +
N(0, 0.2))``). Rows go through the confirmation's own path: per-prompt rows -> :func:`mmw.sweep.evidence.evidence`
(which sorts the prompt ids, so tasks arrive grouped) -> :func:`mmw.sweep.confirm.quality_bounds` ->
:func:`mmw.sweep.confirm.verdict`. The polars step is run on the first cells of every setting and checked to give
exactly the arrays the vectorised draw holds (the same prompt order); the bounds and verdicts of all cells are then
computed in one numpy batch.

Usage: ``python bench/confirm_validity.py [--cells 10000] [--seed 0] [--part all|quality|r]`` (quality: about 25
minutes on 2 shared cores; R: about 15).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import polars as pl
from scipy.stats import beta

from mmw.selection import Constraints
from mmw.sweep.confirm import (
    CONFIRMED,
    RATING_MAX,
    AttackEvidence,
    hull_resistance,
    paired_sums,
    quality_bounds,
    resample_counts,
    resistance_bounds,
    verdict,
)
from mmw.sweep.evidence import evidence

#: Per-try level of the committed sweeps (level 0.05 over 2 tries) and their confirmation runs per setting.
ALPHA, K = 0.025, 5
TASKS = ("t0", "t1", "t2")  # sorted names: the confirmation reads t0's prompts first


# -- before: the sequential test as shipped until the fix (mmw/betting.py and quality_bounds at that revision) --

def _sequential_bets(z: np.ndarray, alpha: float) -> np.ndarray:
    seen = ~np.isnan(z)
    values = np.where(seen, z, 0.0)
    count = np.cumsum(seen, axis=-1)
    n = np.maximum(count[..., -1:], 1)
    mean = (0.5 + np.cumsum(values, axis=-1)) / (count + 1)
    squares = np.where(seen, (values - mean) ** 2, 0.0)
    var = (0.25 + np.cumsum(squares, axis=-1)) / (count + 1)
    before = np.concatenate([np.full(var.shape[:-1] + (1,), 0.25), var[..., :-1]], axis=-1)
    return np.sqrt(2 * math.log(1 / alpha) / (n * before))


def _sequential_rejects(z: np.ndarray, m: np.ndarray, alpha: float) -> np.ndarray:
    lam = np.minimum(_sequential_bets(z, alpha), 0.95 / m[..., None])
    factor = np.where(np.isnan(z), 1.0, 1.0 + lam * (z - m[..., None]))
    return np.cumsum(np.log(factor), axis=-1).max(axis=-1) >= math.log(1 / alpha)


def sequential_verdicts(watermarked: np.ndarray, baseline: np.ndarray, q: float, alpha: float) -> np.ndarray:
    """The old confirmation's quality verdict, ``(S,)`` statuses: its bounds were anchored at the constraint, so
    ``low >= q`` (confirmed) is exactly its test there and ``high < q`` (not confirmed) the opposite test."""
    w, b = paired_sums(watermarked, baseline)
    k = watermarked.shape[-2]
    w, b = w / k, b / k  # every pair present: the old per-prompt means
    m = np.full(w.shape[:-1], q / (1 + q))
    exceeds = _sequential_rejects((w - q * b + q * RATING_MAX) / ((1 + q) * RATING_MAX), m, alpha)
    short = _sequential_rejects((q * b - w + RATING_MAX) / ((1 + q) * RATING_MAX), 1 - m, alpha)
    return np.where(short, "not confirmed", np.where(exceeds, CONFIRMED, "unresolved"))


# -- the cells -------------------------------------------------------------------------------------------------

#: Mean baseline rating of a prompt (bench/sweep_simulation.py's 50; the committed confirmation rows: 69).
RATING_MEAN = [50.0]


def draw(rng: np.random.Generator, cells: int, n: int, ratios: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Ratings ``(cells, K, n)`` watermarked and baseline, prompts in task order (``n / len(ratios)`` each)."""
    rho = np.repeat(np.asarray(ratios), n // len(ratios))[None, None, :]
    difficulty = np.maximum(rng.normal(RATING_MEAN[0], 12.5, (cells, 1, rho.shape[-1])), 1.0)
    baseline = np.clip(difficulty * (1 + rng.normal(0, 0.1, (cells, K, rho.shape[-1]))), 0.0, RATING_MAX)
    watermarked = np.clip(rho * baseline * (1 + rng.normal(0, 0.2, baseline.shape)), 0.0, RATING_MAX)
    return watermarked, baseline


def rows_of(watermarked: np.ndarray, baseline: np.ndarray, per_task: int) -> pl.DataFrame:
    """One cell's per-prompt rows as collection stores them (``K`` experiments; ids ``<task>-<index>``)."""
    k, n = watermarked.shape
    ids = [f"{TASKS[i // per_task]}-{i % per_task:04d}" for i in range(n)]
    frames = []
    for source, ratings in (("watermarked", watermarked), ("baseline", baseline)):
        frames.append(pl.DataFrame({
            "experiment": np.repeat([f"run-{r}" for r in range(k)], n), "prompt_id": ids * k,
            "task": [i.split("-")[0] for i in ids] * k, "source": source, "attack": "",
            "rating": ratings.ravel(), "in_R": False, "ok": True}))
    # evidence() reads the rows in whatever order they are stored: shuffle them to show it sorts
    return pl.concat(frames).sample(fraction=1.0, shuffle=True, seed=0)


def through_evidence(watermarked: np.ndarray, baseline: np.ndarray, per_task: int, checked: int) -> None:
    """The first ``checked`` cells through :func:`evidence`: the arrays it builds equal the drawn ones."""
    for cell in range(min(checked, watermarked.shape[0])):
        found = evidence(rows_of(watermarked[cell], baseline[cell], per_task), [1.0] * K)
        assert np.array_equal(found.watermarked, watermarked[cell]) and np.array_equal(found.baseline, baseline[cell])


def confirmed_share(rng: np.random.Generator, cells: int, n: int, q: float, ratios: tuple[float, ...],
                    chunk: int = 1000) -> tuple[int, int]:
    """Confirmed cells (before, after) out of ``cells``."""
    constraints = Constraints(max_quality_loss=1 - q, min_tamper_resistance=0.0)
    before = after = 0
    for start in range(0, cells, chunk):
        size = min(chunk, cells - start)
        watermarked, baseline = draw(rng, size, n, ratios)
        if start == 0:
            through_evidence(watermarked, baseline, n // len(ratios), checked=20)
        before += int((sequential_verdicts(watermarked, baseline, q, ALPHA) == CONFIRMED).sum())
        _, low, high = quality_bounds(watermarked, baseline, ALPHA, q)
        nan = np.full(size, np.nan)
        status, _ = verdict(np.zeros(size, dtype=bool), low, high, nan, nan, constraints)
        after += int((status == CONFIRMED).sum())
    return before, after


#: Two attacks: detection survival and retained quality (``Q_A``); detection without attack ``W_0``.
SURVIVAL, RETAINED, NO_ATTACK = (0.6, 0.3), (0.9, 0.6), 0.98


def resistance_false_confirmations(rng: np.random.Generator, cells: int, n_attacked: int, spread: float,
                                   resamples: int = 1000, chunk: int = 500) -> int:
    """Cells whose R lower bound (:func:`mmw.sweep.confirm.resistance_bounds`, the percentile bootstrap over
    attacked prompts) clears the true pooled R, with the attacked prompts in three tasks whose survival is
    ``SURVIVAL +/- spread`` (task order fixed: the bootstrap does not read it). True R: the hull at the pooled
    survival, ``RETAINED`` and ``NO_ATTACK``; a false confirmation is ``low > true R``, the confirmation's rule."""
    shift = np.repeat([spread, 0.0, -spread], n_attacked // 3)
    n = shift.size
    survival = np.clip(np.asarray(SURVIVAL)[:, None] + shift[None, :], 0.0, 1.0)  # (m, n)
    truth = float(hull_resistance(np.asarray(RETAINED), survival.mean(-1), np.asarray(NO_ATTACK)))
    counts = resample_counts(n, resamples, 1)
    hits = 0
    for start in range(0, cells, chunk):
        size = min(chunk, cells - start)
        reference = np.maximum(rng.normal(50.0, 12.5, (size, K, n)), 1.0)
        attacked = np.asarray(RETAINED)[None, None, :, None] * reference[:, :, None, :] * (
            1 + rng.normal(0, 0.2, (size, K, len(RETAINED), n)))
        detected = (rng.random((size, K, len(SURVIVAL), n)) < survival[None, None]).astype(float)
        no_attack = (rng.random((size, K, n)) < NO_ATTACK).astype(float)
        _, low, _ = resistance_bounds(AttackEvidence(detected, attacked, reference, no_attack), ALPHA, counts)
        hits += int((low > truth).sum())
    return hits


def interval(hits: int, n: int, level: float = 0.95) -> str:
    """``rate [low, high]``: the Clopper-Pearson interval."""
    tail = (1 - level) / 2
    low = beta.ppf(tail, hits, n - hits + 1) if hits else 0.0
    high = beta.ppf(1 - tail, hits + 1, n - hits) if hits < n else 1.0
    return f"{hits / n:.4f} [{low:.4f}, {high:.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--part", choices=("all", "quality", "r"), default="all",
                        help="quality: false confirmations and power of the quality test; r: R's bootstrap bound")
    parser.add_argument("--rating-mean", type=float, default=50.0, help="mean baseline rating of a prompt")
    args = parser.parse_args()
    RATING_MEAN[0] = args.rating_mean
    rng = np.random.default_rng(args.seed)
    started = time.time()
    print(f"Per-try level {ALPHA}, K = {K} runs per setting, {args.cells:,} cells per row, seed {args.seed}, mean "
          f"baseline rating {args.rating_mean:g}; 95 % Clopper-Pearson intervals.\n")
    power_cells = max(args.cells // 5, 200)
    if args.part in ("all", "quality"):
        print("### False confirmations per try (pooled ratio exactly at the limit; tasks best first)\n")
        print("| limit q | task ratios | prompts | before (sequential) | after (final-time, fixed bets) |")
        print("|---|---|---|---|---|")
        for q in (0.9, 0.99):
            for h in (0.0, 0.025, 0.05):
                ratios = (q + h, q, q - h)
                for n in (48, 297, 999):
                    before, after = confirmed_share(rng, args.cells, n, q, ratios)
                    print(f"| {q} | {'/'.join(f'{r:.3f}' for r in ratios)} | {n} | {interval(before, args.cells)} "
                          f"| {interval(after, args.cells)} |", flush=True)
        print("\n### Power: share confirmed at a true pooled ratio above the limit q = 0.9\n")
        print("Tasks equal (every prompt's ratio the true one: the sequential test is valid there) and tasks +/-0.05 "
              "best first (its confirmations there are inflated by the order).\n")
        print("| true ratio | prompts | tasks equal: before | tasks equal: after | tasks +/-0.05: before "
              "| tasks +/-0.05: after |")
        print("|---|---|---|---|---|---|")
        margins = {48: (1.0, 1.05, 1.1), 297: (0.92, 0.93, 0.95), 999: (0.905, 0.91, 0.92)}
        for n, trues in margins.items():
            for true in trues:
                shares = [confirmed_share(rng, power_cells, n, 0.9, (true + h, true, true - h)) for h in (0.0, 0.05)]
                print(f"| {true} | {n} | " + " | ".join(interval(hits, power_cells) for pair in shares for hits in pair)
                      + " |", flush=True)
    if args.part in ("all", "r"):
        print("\n### R: false confirmations per try at the true pooled R (bootstrap over attacked prompts)\n")
        print(f"Two attacks (survival {SURVIVAL}, retained quality {RETAINED}), W_0 = {NO_ATTACK}; attacked prompts "
              "in three tasks whose survival differs by +/- the spread; confirmed when the lower bound exceeds the "
              "true R.\n")
        print("| attacked prompts | survival spread | false confirmations |")
        print("|---|---|---|")
        for n_attacked in (18, 99, 333):
            for spread in (0.0, 0.2):
                hits = resistance_false_confirmations(rng, power_cells, n_attacked, spread)
                print(f"| {n_attacked} | +/-{spread} | {interval(hits, power_cells)} |", flush=True)
    print(f"\n({power_cells:,} cells per power row and per R row; {time.time() - started:.0f} s in all.)")


if __name__ == "__main__":
    main()
