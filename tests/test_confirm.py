"""Confirmed picks (mmw.sweep.confirm) and the simulation study that proves them (bench/sweep_simulation.py).

The simulation test is the procedure's guarantee, measured: over >= 1,000 simulated sweeps whose settings have
known true quality, R and size, the share of cells reported confirmed with a setting that truly violates its
constraint stays at or below the stated level; the old procedure (the tuning pick is the answer) is printed beside
it and must be far above — so the same check fails when confirmation is switched off.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from mmw.errors import SpecError
from mmw.metrics import paired_relative_quality, tamper_resistance
from mmw.selection import Constraints
from mmw.sweep.confirm import (
    CONFIRMED,
    NO_FEASIBLE,
    NOT_CONFIRMED,
    PENDING,
    SIZE_ANYTIME,
    SIZE_E,
    SIZE_VALID,
    UNRESOLVED,
    AttackEvidence,
    Confirmation,
    Evidence,
    confirm_cell,
    hull_resistance,
    quality_bounds,
    ranked_candidates,
    resample_counts,
    size_kind,
)
from sweep_simulation import Scenario, Truth, false_confirmation_rates, simulate

LEVEL = 0.05
SWEEPS = 1000
#: The simulated cells' confirmation (each scenario brings its own prompts: ``Scenario.n_confirm``).
SETTINGS = Confirmation(prompts=300, level=LEVEL, max_tries=2, resamples=600)


def _four(relative_quality: list[float], survival: list[float]) -> Truth:
    """Four settings, smallest last, with the given true quality and first-attack survival."""
    s = np.array(survival)
    return Truth(relative_quality=np.array(relative_quality), size=np.array([200.0, 100.0, 50.0, 40.0]),
                 survival=np.stack([s, s / 2], axis=1), retained=np.tile([0.9, 0.6], (4, 1)),
                 no_attack=np.full(4, 0.95))


#: (name, scenario): the smallest settings sit just beyond a constraint — the hardest case for the guarantee. The
#: quality bound holds for any ratings in the judge's range, and pays for it in prompts: a ratio 0.05-0.1 above its
#: constraint resolves at a few hundred confirmation prompts (bench/bound_study.py), hence 300 here.
SCENARIOS = [
    ("trade-off, 10 % and R > 0.2", Scenario(Truth.trade_off(), Constraints(0.1, 0.2), n_confirm=300)),
    ("quality at the bound", Scenario(_four([1.0, 0.96, 0.899, 0.895], [0.8] * 4), Constraints(0.1, 0.0),
                                      n_confirm=300)),
    ("R at the bound", Scenario(_four([1.0] * 4, [0.5, 0.3, 0.12, 0.11]), Constraints(0.1, 0.2), n_confirm=300)),
]


def not_above_level(false: int, n: int, level: float) -> bool:
    """The measured false-confirmation rate is consistent with ``<= level``: a one-sided binomial test of
    ``rate > level`` does not reject at 1 %."""
    return binomtest(false, n, level, alternative="greater").pvalue > 0.01


@pytest.mark.parametrize(("name", "scenario"), SCENARIOS, ids=[n for n, _ in SCENARIOS])
def test_simulated_false_confirmation_rate_is_at_most_the_level(name: str, scenario: Scenario) -> None:
    violates = scenario.truth.violates(scenario.constraints)
    assert violates.any() and not violates.all(), "a scenario needs settings on both sides of the constraint"
    new = simulate(scenario, SWEEPS, SETTINGS, seed=1)
    old = simulate(scenario, SWEEPS, SETTINGS, seed=1, confirm=False)
    rates = false_confirmation_rates(new)
    print(f"\n{name}: {SWEEPS} simulated sweeps, level {LEVEL}: false confirmations {rates['confirmed']:.3f} "
          f"(confirmed {rates['share confirmed']:.3f}, unresolved {rates['share unresolved']:.3f}); "
          f"old procedure {rates['old']:.3f}")
    assert not_above_level(int(new["false_confirmed"].sum()), SWEEPS, LEVEL)
    # The negative control: without confirmation the same check fails (the winner's curse).
    assert not not_above_level(int(old["false_confirmed"].sum()), SWEEPS, LEVEL)
    assert rates["old"] > 4 * LEVEL
    # Power: confirmation answers cells, it does not just refuse (each scenario has a truly feasible setting
    # far enough from its bounds).
    assert rates["share confirmed"] > 0.3
    # Every confirmed pick was a tuning candidate tried within the bound on tries.
    assert new.filter(pl.col("status") == CONFIRMED)["tries"].max() <= SETTINGS.max_tries


def test_one_try_only_is_also_valid_and_fallbacks_add_answers() -> None:
    scenario = SCENARIOS[1][1]
    one = simulate(scenario, SWEEPS, Confirmation(prompts=300, level=LEVEL, max_tries=1, resamples=600), seed=2)
    two = simulate(scenario, SWEEPS, SETTINGS, seed=2)
    assert not_above_level(int(one["false_confirmed"].sum()), SWEEPS, LEVEL)
    assert (two["status"] == CONFIRMED).sum() >= (one["status"] == CONFIRMED).sum()
    assert two["tries"].max() == 2 and one["tries"].max() == 1


def test_simulation_is_deterministic() -> None:
    scenario = SCENARIOS[1][1]
    assert simulate(scenario, 50, SETTINGS, seed=3).equals(simulate(scenario, 50, SETTINGS, seed=3))


def test_hull_resistance_matches_the_metric() -> None:
    rng = np.random.default_rng(0)
    for case in range(400):
        m = int(rng.integers(1, 5))
        q, w, w0 = rng.random(m), rng.random(m), float(rng.random())
        if case % 3 == 0:
            q[0] = 1.0  # an attack at full quality
        if case % 5 == 0:
            q, w = np.round(q, 1), np.round(w, 1)  # ties and collinear points
        got = float(hull_resistance(q[None], w[None], np.array([w0]))[0])
        assert got == pytest.approx(tamper_resistance(np.c_[q, w], w0), abs=1e-12)
    nan = hull_resistance(np.array([[np.nan]]), np.array([[0.5]]), np.array([0.9]))
    assert np.isnan(nan[0])


def test_quality_bounds_estimate_and_coverage() -> None:
    rng = np.random.default_rng(5)
    base = np.clip(rng.normal(60, 15, (1, 30)), 0, 100)
    wm = np.clip(0.9 * base * (1 + rng.normal(0, 0.2, (1, 30))), 0, 100)
    ratings = pl.DataFrame({"prompt_id": list(range(30)) * 2, "source": ["watermarked"] * 30 + ["baseline"] * 30,
                            "rating": np.concatenate([wm[0], base[0]])})
    estimate, low, high = quality_bounds(wm, base, 0.05, 0.9)
    assert float(estimate) == pytest.approx(paired_relative_quality(ratings).ratio)
    assert low < estimate < high
    # One-sided coverage of the lower bound over many batches with the true ratio on the constraint.
    batch = 2000
    difficulty = np.clip(rng.normal(60, 15, (batch, 1, 40)), 0, 100)
    base = np.clip(difficulty * (1 + rng.normal(0, 0.1, (batch, 3, 40))), 0, 100)
    wm = np.clip(0.95 * base * (1 + rng.normal(0, 0.2, (batch, 3, 40))), 0, 100)
    _, low, high = quality_bounds(wm, base, 0.05, 0.95)
    assert not_above_level(int((low >= 0.95).sum()), batch, 0.05)
    assert not_above_level(int((high < 0.95).sum()), batch, 0.05)


def _evidence(rng: np.random.Generator, rho: float, survival: float, size: float = 50.0, k: int = 3,
              n: int = 150) -> Evidence:
    base = np.clip(rng.normal(60, 10.0, (k, n)), 0, 100)
    wm = rho * base * (1 + rng.normal(0, 0.05, (k, n)))
    n_a = n // 3
    detected = (rng.random((k, 2, n_a)) < np.array([survival, survival / 2])[None, :, None]).astype(float)
    attacked = np.array([0.9, 0.6])[None, :, None] * wm[:, None, :n_a]
    attacks = AttackEvidence(detected, attacked, wm[:, :n_a], np.ones((k, n_a)))
    return Evidence(wm, base, np.full(k, size), attacks)


def test_confirm_cell_walks_the_ranking() -> None:
    rng = np.random.default_rng(7)
    good, bad_quality, weak = _evidence(rng, 1.0, 0.8), _evidence(rng, 0.7, 0.8), _evidence(rng, 1.0, 0.0)
    undetected = Evidence(good.watermarked, good.baseline, np.array([np.inf, np.inf, 40.0]), good.attacks)
    paper = Constraints(0.1, 0.2)
    settings = Confirmation(prompts=150)
    assert confirm_cell([], {}, paper, settings).status == NO_FEASIBLE
    outcome = confirm_cell(["a", "b", "c"], {"a": bad_quality}, paper, settings)
    assert (outcome.status, outcome.pending, len(outcome.tries)) == (PENDING, "b", 1)
    outcome = confirm_cell(["a", "b"], {"a": bad_quality, "b": good}, paper, settings)
    assert (outcome.status, outcome.pick) == (CONFIRMED, "b")
    assert outcome.tries[0].reason == "quality" and outcome.tries[1].alpha == pytest.approx(0.025)
    assert outcome.tries[1].quality_low >= 0.9 and outcome.tries[1].resistance_low > 0.2
    outcome = confirm_cell(["a", "b", "c"], {"a": weak, "b": undetected, "c": good}, paper, settings)
    assert (outcome.status, outcome.reason, outcome.pick) == (NOT_CONFIRMED, "R", None)  # c is beyond max_tries
    assert outcome.tries[1].reason == "undetected"
    assert confirm_cell(["a"], {"a": weak}, Constraints(0.1, 0.0), settings).status == CONFIRMED
    straddle = _evidence(np.random.default_rng(8), 0.9, 0.8)
    outcome = confirm_cell(["a"], {"a": straddle}, paper, Confirmation(prompts=150, max_tries=1))
    assert (outcome.status, outcome.reason) == (UNRESOLVED, "quality")
    assert outcome.tries[0].quality_low < 0.9 < outcome.tries[0].quality_high


def test_bad_confirmation_input_names_the_setting() -> None:
    rng = np.random.default_rng(9)
    one_run = _evidence(rng, 1.0, 0.8, k=1)
    with pytest.raises(SpecError, match=r"^reevaluate\.k: "):
        confirm_cell(["a"], {"a": one_run}, Constraints(), Confirmation(prompts=150))
    few = _evidence(rng, 1.0, 0.8, n=4)
    with pytest.raises(SpecError, match=r"^confirm\.prompts: 4 confirmation prompt"):
        confirm_cell(["a"], {"a": few}, Constraints(), Confirmation(prompts=150))
    few_attacked = _evidence(rng, 1.0, 0.8, n=12)
    with pytest.raises(SpecError, match=r"^attacks\.fraction: "):
        confirm_cell(["a"], {"a": few_attacked}, Constraints(0.1, 0.2), Confirmation(prompts=150))
    for bad in ({"level": 0.0}, {"level": 0.7}, {"max_tries": 0}, {"resamples": 10}, {"prompts": 0},
                {"quality_losses": [0.05]}):
        with pytest.raises(SpecError, match=r"^confirm\."):
            Confirmation(**{"prompts": 150, **bad})


def _cell(**extra: list[object]) -> pl.DataFrame:
    base = {"config_id": ["a", "b", "c"], "experiment": ["x-a", "x-b", "x-c"], SIZE_E: [5.0, 9.0, 7.0],
            SIZE_VALID: [30.0, 12.0, 20.0], "all.relative_quality": [1.0, 0.95, 0.5],
            "all.tamper_resistance": [0.5, 0.5, 0.5], "scheme.score": ["sum"] * 3}
    return pl.DataFrame({**base, **extra})


def test_size_kind_and_ranking() -> None:
    assert size_kind(_cell()) == SIZE_VALID
    assert size_kind(_cell(**{SIZE_ANYTIME: [40.0, 14.0, 25.0]})) == SIZE_ANYTIME
    # One kind per cell: a setting without a sum score (or without the column's value) keeps the whole cell on
    # the checkpoint size.
    assert size_kind(_cell(**{SIZE_ANYTIME: [40.0, None, 25.0]})) == SIZE_VALID
    assert size_kind(_cell(**{SIZE_ANYTIME: [40.0, 14.0, 25.0], "scheme.score": ["sum", "align", "sum"]})) == SIZE_VALID
    assert size_kind(_cell().drop(SIZE_VALID)) == SIZE_E
    # An undetected median is null in a run's metrics: beside other values it is no reason to fall back to E
    # (which would rank "a" first), and an unknown size fails the selection rule, as any null metric does.
    undetected = _cell(**{SIZE_VALID: [None, 12.0, 20.0], SIZE_ANYTIME: [None, 14.0, 25.0]})
    assert size_kind(undetected) == SIZE_VALID
    assert ranked_candidates(undetected, Constraints(0.1, 0.2)) == (SIZE_VALID, ["b"])
    assert size_kind(_cell(**{SIZE_VALID: [None, None, None]})) == SIZE_E  # no valid size anywhere: older runs
    # ... unless the sweep's other runs measured it: then every setting of the cell went undetected.
    assert size_kind(_cell(**{SIZE_VALID: [None, None, None]}), valid_measured=True) == SIZE_VALID
    kind, ranked = ranked_candidates(_cell(), Constraints(0.1, 0.2))
    assert (kind, ranked) == (SIZE_VALID, ["b", "a"])  # E would rank a first; c fails quality
    assert ranked_candidates(_cell(), Constraints(0.1, 0.2), SIZE_E) == (SIZE_E, ["a", "b"])


def test_evidence_from_per_prompt_rows_matches_the_run_metrics() -> None:
    from test_metrics import _toy_tables

    from mmw.metrics import attack_points, tamper_resistance_of
    from mmw.sweep.confirm import resistance_bounds
    from mmw.sweep.evidence import evidence, join_rows

    detections, ratings, perturbed = _toy_tables()
    rows = join_rows(detections, ratings, perturbed)
    assert rows.filter((pl.col("source") == "attack") & (pl.col("attack") == "swap")).height == 3
    two = pl.concat([rows.with_columns(pl.lit(run).alias("experiment")) for run in ("r1", "r2")])
    found = evidence(two, [30.0, None])
    assert (found.k, found.n_prompts, found.attacks.n_prompts) == (2, 6, 4)
    assert found.attacks.detected.shape == (2, 2, 4)  # runs x attacks in R (lower, swap) x attacked prompts
    assert np.isinf(found.sizes[1])
    r, _, _ = resistance_bounds(found.attacks, 0.05, resample_counts(4, 200, 0))
    assert float(r) == pytest.approx(tamper_resistance_of(attack_points(detections, ratings, perturbed, False)))
    q, _, _ = quality_bounds(found.watermarked, found.baseline, 0.05, 0.9)
    assert float(q) == pytest.approx(paired_relative_quality(ratings).ratio)


def _run_rows(experiment: str, rho: float, rng: np.random.Generator, n: int = 150, n_a: int = 50,
              survival: float = 0.9, noise: float = 0.02) -> pl.DataFrame:
    """Per-prompt rows of one synthetic run (the schema of mmw.sweep.evidence.join_rows)."""
    rows = []
    for i in range(n):
        pid = f"story-{i:03d}"
        base = float(np.clip(rng.normal(60, 10), 0, 100))
        wm = rho * base * (1 + float(rng.normal(0, noise)))
        rows += [(pid, "baseline", "", False, None, base, None, None),
                 (pid, "watermarked", "", True, 20.0, wm, None, None)]
        if i < n_a:
            rows.append((pid, "retokenized", "", True, 20.0, None, None, None))
            for attack, retained in (("swap", 0.9), ("typo", 0.6)):
                rows.append((pid, "attack", attack, bool(rng.random() < survival), 25.0, retained * wm, True, True))
    frame = pl.DataFrame(rows, schema={"prompt_id": pl.String, "source": pl.String, "attack": pl.String,
                                       "detected": pl.Boolean, "size_valid": pl.Float64, "rating": pl.Float64,
                                       "in_R": pl.Boolean, "ok": pl.Boolean}, orient="row")
    return frame.with_columns(pl.lit(experiment).alias("experiment"))


def _sweep_tables(rhos: dict[str, float], confirmed_runs: dict[str, float]) -> tuple[pl.DataFrame, ...]:
    """One cell (T 0.7, distribution shift): tuning rows with E, size_valid and point metrics; confirmation
    runs (2 each) of the given configs with their true relative quality."""
    ids = list(rhos)
    results = pl.DataFrame({
        "config_id": ids, "experiment": [f"t-{c}" for c in ids], "status": ["done"] * len(ids),
        "model.temperature": [0.7] * len(ids), "family": ["distribution_shift"] * len(ids),
        SIZE_E: [10.0 + i for i in range(len(ids))], SIZE_VALID: [30.0 - i for i in range(len(ids))],
        "all.relative_quality": [1.0] * len(ids), "all.tamper_resistance": [0.6] * len(ids),
        "scheme.score": ["sum"] * len(ids), "wall_s": [60.0] * len(ids)})
    rng = np.random.default_rng(11)
    reevals, prompts = [], []
    for cid, rho in confirmed_runs.items():
        for seed in (1000, 1001):
            name = f"reeval-t-{cid}-s{seed}"
            reevals.append({"config_id": cid, "seed": seed, "experiment": name, "status": "done",
                            SIZE_E: 12.0, SIZE_VALID: 28.0 + seed % 2})
            prompts.append(_run_rows(name, rho, rng))
    reevaluations = pl.DataFrame(reevals)
    return results, reevaluations, pl.concat(prompts) if prompts else pl.DataFrame()


def test_confirmed_table_statuses_fallbacks_and_plan() -> None:
    from mmw.sweep.tables import confirmed_markdown
    from mmw.sweep.cells import confirmed_table, pending_config_ids
    from mmw.sweep.tables import plan_markdown
    from mmw.sweep.plan import needed_prompts, plan_table

    confirmation = Confirmation(prompts=150, offset=2, level=0.05, max_tries=2)
    # Ranked by size_valid (c smallest, then b); nothing confirmed yet: every cell waits for c.
    results, _, _ = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {})
    empty = pl.DataFrame(schema={"config_id": pl.String, "status": pl.String, "experiment": pl.String})
    table, _ = confirmed_table(results, empty, pl.DataFrame(), confirmation, k=2)
    assert table.height == 4 and set(table["status"]) == {PENDING} and pending_config_ids(table) == ["c"]
    # c truly loses 20 % quality: not confirmed anywhere; the fallback b (true 0.99) is confirmed at 10 % and
    # unresolved at 1 %.
    results, reevaluations, prompts = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 0.8, "b": 0.99})
    table, tries = confirmed_table(results, reevaluations, prompts, confirmation, k=2)
    rows = {(r["max_quality_loss"], r["min_tamper_resistance"]): r for r in table.iter_rows(named=True)}
    ten = rows[(0.1, 0.0)]
    assert (ten["status"], ten["config_id"], ten["tries"], ten["size_kind"]) == (CONFIRMED, "b", 2, SIZE_VALID)
    assert ten["quality_low"] >= 0.9 and ten["size_median"] == pytest.approx(28.5) and ten["e_median"] == 12.0
    assert (ten["k"], ten["n_prompts"], ten["n_attacked"], ten["alpha"]) == (2, 150, 50, 0.025)
    assert rows[(0.1, 0.2)]["status"] == CONFIRMED and rows[(0.1, 0.2)]["resistance_low"] > 0.2
    one = rows[(0.01, 0.0)]
    assert one["status"] == UNRESOLVED and one["reason"] == "quality"
    assert tries.filter(pl.col("config_id") == "c")["reason"].unique().to_list() == ["quality"]
    text = confirmed_markdown(table, confirmation, 2, "test")
    assert "**28.5**" in text and "unresolved (quality)" in text and "confirmed 2" in text
    # The planner: the 1 % cells need more prompts than they have, at a finite cost.
    plan = plan_table(table, k=2, tasks=1, attacked_share=1 / 3, time_model=(40.0, 1.0))
    assert plan.height == 2 and (plan["prompts_per_task"] > 150).all()
    assert plan["cpu_s"].to_list()[0] == pytest.approx(2 * (40 + plan["prompts_per_task"][0]))
    assert "H100" in plan_markdown(plan, 0.05, 2)
    assert needed_prompts(0.95, 0.90, 0.9, 10) == 10 and needed_prompts(0.95, 0.85, 0.9, 10) == 40
    assert needed_prompts(0.9, 0.85, 0.9, 10) == np.inf


def test_the_plan_covers_every_unresolved_cell_of_the_table_and_of_randomness() -> None:
    """b's true quality sits on the 10 % constraint: its cell and the randomness cell it answers are unresolved,
    and the planner gives both a row (the randomness one as family ``randomness: <kind>``)."""
    from mmw.sweep.cells import confirmed_randomness, confirmed_table
    from mmw.sweep.tables import plan_markdown
    from mmw.sweep.plan import sweep_plan

    confirmation = Confirmation(prompts=150, offset=2, level=0.05, max_tries=2)
    results, reevaluations, prompts = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 0.8, "b": 0.9})
    results = results.with_columns(pl.lit("text-dependent").alias("randomness_kind"))
    reevaluations = reevaluations.with_columns(pl.lit(80.0).alias("wall_s"))
    table, _ = confirmed_table(results, reevaluations, prompts, confirmation, k=2)
    randomness = confirmed_randomness(results, reevaluations, prompts, confirmation, k=2)
    cells = [(r["temperature"], r["family"], r["max_quality_loss"], r["min_tamper_resistance"])
             for r in table.filter(pl.col("status") == UNRESOLVED).iter_rows(named=True)]
    cells += [(r["temperature"], f"randomness: {r['randomness_kind']}", 0.1, 0.0)
              for r in randomness.filter(pl.col("status") == UNRESOLVED).iter_rows(named=True)]
    assert any(c[1].startswith("randomness") for c in cells) and len(cells) >= 2
    plan = sweep_plan(table, results, reevaluations, confirmation, 2, 2, randomness)
    assert sorted(plan.select("temperature", "family", "max_quality_loss", "min_tamper_resistance").rows()) == \
        sorted(cells)
    assert "randomness: text-dependent" in plan_markdown(plan, 0.05, 2)


def test_sweep_plan_never_plans_below_the_smallest_confirmation_set() -> None:
    from mmw.sweep.definition import min_confirm_prompts
    from mmw.sweep.plan import sweep_plan

    # One unresolved 10 % cell at 6 confirmation prompts (2 per task of 3), estimate 0.99, bound 0.88: the
    # variance alone asks for 9 prompts (3 per task), but with a third of each task's prompts attacked an R
    # interval needs 4 per task (5 attacked prompts in all).
    confirmation = Confirmation(prompts=2, offset=1)
    table = pl.DataFrame({
        "temperature": [0.7], "family": ["distribution_shift"], "max_quality_loss": [0.1],
        "min_tamper_resistance": [0.0], "config_id": ["a"], "status": ["unresolved"], "reason": ["quality"],
        "quality": [0.99], "quality_low": [0.88], "resistance": [None], "resistance_low": [None],
        "n_prompts": [6], "n_attacked": [3]}, schema_overrides={"resistance": pl.Float64,
                                                                "resistance_low": pl.Float64})
    results = pl.DataFrame({"config_id": ["a"], "attacks.fraction": [1 / 3], "wall_s": [60.0]})
    plan = sweep_plan(table, results, pl.DataFrame(), confirmation, tuning=1, k=2)
    assert plan["quality_prompts"].to_list() == [9.0] and plan["k"].to_list() == [2]
    # ... and the distribution-free floor asks for more: a margin of at most 9 points over 0.9 x 100 needs
    # ceil(log 40 / log(1 + 9 / 90)) = 39 prompts whatever the noise (13 per task).
    assert plan["floor_prompts"].to_list() == [39.0] and plan["prompts_per_task"].to_list() == [13]
    # A wide margin (estimate 1.5) puts the floor at 8 prompts; then the smallest confirmation set governs.
    wide = sweep_plan(table.with_columns(pl.lit(1.5).alias("quality"), pl.lit(1.3).alias("quality_low")), results,
                      pl.DataFrame(), confirmation, tuning=1, k=2)
    assert wide["floor_prompts"].to_list() == [8.0]
    assert min_confirm_prompts(1 / 3, 3) == 4 and wide["prompts_per_task"].to_list() == [4]


def test_sweep_plan_counts_the_tasks_of_the_runs_not_of_a_cell_a_later_round_grew() -> None:
    """A later round judges its cells on more prompts (here 48 + 3 x 79 = 285) than rounds 1-2's 16 per task of
    3 tasks: the planner divides a cell's needed prompts by 3 tasks whichever cell comes first, with the runs' task
    list or without it (the smallest judged cell then). Counting tasks from the first cell read (a round-3 cell of
    237 prompts: 15 tasks) planned KGW's later round at a fifth of what it needs."""
    from mmw.sweep.plan import sweep_plan

    confirmation = Confirmation(prompts=16, offset=1)
    grown = _unresolved_cell(0.96, 0.90, n=285)
    table = pl.concat([grown.with_columns(pl.lit("b").alias("config_id")), _unresolved_cell(0.96, 0.85)])
    for results in (pl.DataFrame({"config_id": ["a"], "attacks.fraction": [1 / 3], "wall_s": [60.0],
                                  "prompts.tasks": ["['book_report', 'story', 'fake_news']"]}),
                    pl.DataFrame({"config_id": ["a"], "attacks.fraction": [1 / 3], "wall_s": [60.0]})):
        plan = sweep_plan(table, results, pl.DataFrame(), confirmation, tuning=1, k=5)
        row = plan.filter(pl.col("config_id") == "a").row(0, named=True)
        needs = max(row["quality_prompts"], row["floor_prompts"])
        assert needs > 48 and row["prompts_per_task"] == math.ceil(round(needs / 3, 9))


def _unresolved_cell(quality: float, low: float, n: int = 48, k: int = 5) -> pl.DataFrame:
    """One unresolved 10 % cell measured on ``n`` prompts of 3 tasks, ``k`` runs."""
    return pl.DataFrame({
        "temperature": [1.0], "family": ["exponential"], "max_quality_loss": [0.1], "min_tamper_resistance": [0.0],
        "config_id": ["a"], "status": ["unresolved"], "reason": ["quality"], "quality": [quality],
        "quality_low": [low], "resistance": [None], "resistance_low": [None], "n_prompts": [n],
        "n_attacked": [18], "k": [k], "alpha": [0.025]},
        schema_overrides={"resistance": pl.Float64, "resistance_low": pl.Float64})


def test_the_plan_chooses_runs_per_prompt_by_cost_within_the_pool() -> None:
    """Generation noise is most of a prompt's variance, so K trades against prompts: unbounded, the cheapest plan
    runs 2 per prompt; when the tasks hold too few prompts, the plan raises K until the prompts fit, and says
    which K. Every plan respects the floor and the pool."""
    from mmw.sweep.cost import GPU_STAGED
    from mmw.sweep.plan import confirmation_cost, plan_table, relative_variance

    cell = _unresolved_cell(0.96, 0.85)  # needs 48 (0.11 / 0.06)^2 = 162 prompts at K = 5
    free = plan_table(cell, k=5, tasks=3, attacked_share=1 / 3, time_model=None).row(0, named=True)
    assert free["k"] == 2 and free["resolvable"] and free["note"] is None
    assert free["quality_prompts"] == pytest.approx(162 * relative_variance(2, 5))
    tight = plan_table(cell, k=5, tasks=3, attacked_share=1 / 3, time_model=None, available=60).row(0, named=True)
    assert tight["k"] > 2 and tight["prompts_per_task"] <= 60
    assert tight["prompts_per_task"] * 3 >= max(tight["quality_prompts"], tight["floor_prompts"])
    # The smallest K that fits is the cheapest here (each run pays its fixed costs), and costs more than the free
    # plan; the one below it does not fit.
    below = 162 * relative_variance(tight["k"] - 1, 5)
    assert math.ceil(below / 3) > 60
    assert confirmation_cost(tight["k"], tight["prompts_per_task"] * 3, GPU_STAGED) > confirmation_cost(
        2, free["prompts_per_task"] * 3, GPU_STAGED)
    assert relative_variance(5, 5) == 1.0 and relative_variance(10, 5) == pytest.approx((0.02 + 0.49) / 1.0)


def test_the_plan_refuses_what_the_tasks_cannot_resolve() -> None:
    """Beyond the pool, or with the estimate on the limit, the plan answers that the prompts the tasks hold cannot
    resolve the cell instead of planning it."""
    from mmw.sweep.plan import CANNOT, plan_table
    from mmw.sweep.tables import plan_markdown

    # Estimate 0.905: the floor alone is log 40 / log(1 + 0.5 / 90) = 666 prompts, 222 per task > 95.
    near = plan_table(_unresolved_cell(0.905, 0.80), k=5, tasks=3, attacked_share=1 / 3, time_model=None,
                      available=95).row(0, named=True)
    assert near["floor_prompts"] == 666 and (near["resolvable"], near["note"]) == (False, CANNOT)
    assert near["prompts_per_task"] is None and near["k"] is None and near["h100_hours"] is None
    on = plan_table(_unresolved_cell(0.9, 0.8), k=5, tasks=3, attacked_share=1 / 3, time_model=None).row(0, named=True)
    assert math.isinf(on["floor_prompts"]) and on["note"] == CANNOT
    text = plan_markdown(plan_table(_unresolved_cell(0.905, 0.80), k=5, tasks=3, attacked_share=1 / 3,
                                    time_model=None, available=95), 0.05, 5)
    assert CANNOT in text and "| 666 |" in text


def test_a_plan_beyond_the_pool_or_below_the_floor_is_refused(tmp_path: Path) -> None:
    """``mmw sweep plan --prompts``: more prompts than a task holds past the confirmation offset, or fewer in all
    than the floor of ``--margin``, exit 2 with one line naming the task and its count, or the floor."""
    from typer.testing import CliRunner

    from mmw.cli import app

    repo = Path(__file__).resolve().parents[1]
    runner = CliRunner()
    # small-confirmed tunes on the paper pool (100 / 96 / 100) and confirms on prompts [1, 17); a later round past
    # the paper's prompts runs on the extended pool (350 / 354 / 350: mmw.sweep.units.held_out), so the request is
    # checked against that one, and the error names it.
    result = runner.invoke(app, ["sweep", "plan", "small-confirmed", "--repo", str(repo), "--out", str(tmp_path),
                                 "--prompts", "350"])
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert error == [("error: --prompts: 350 per task from prompt 1: task book_report holds 350 prompts in the "
                      "extended pool; allowed: at most 349 per task")]
    # Past the paper pool (story holds 96) but inside the extended one: no pool error (here: nothing collected in
    # tmp_path, exit 2 naming that).
    result = runner.invoke(app, ["sweep", "plan", "small-confirmed", "--repo", str(repo), "--out", str(tmp_path),
                                 "--prompts", "96"])
    assert result.exit_code == 2 and "holds" not in result.output
    assert "mmw sweep collect small-confirmed first" in result.output
    # Checked against the paper pool, the same request names that pool and its smallest task.
    from mmw.sweep.plan import check_request
    from mmw.tasks import pool_sizes

    with pytest.raises(SpecError) as caught:
        check_request(96, 1, pool_sizes(["book_report", "story", "fake_news"], "paper"), pool="paper")
    assert str(caught.value) == ("--prompts: 96 per task from prompt 1: task story holds 96 prompts in the paper "
                                 "pool; allowed: at most 95 per task")
    # A margin of 2 points over 0.9 x 100: floor ceil(log 40 / log(1 + 2 / 90)) = 168 prompts, 56 per task.
    result = runner.invoke(app, ["sweep", "plan", "small-confirmed", "--repo", str(repo), "--out", str(tmp_path),
                                 "--prompts", "50", "--margin", "2"])
    assert result.exit_code == 2
    assert "below the distribution-free floor of 168 prompts" in result.output and "at least 56 per task" in \
        result.output
    # A margin of 0.3 points: floor 1,109 prompts, 370 per task, more than the tasks hold past prompt 1.
    result = runner.invoke(app, ["sweep", "plan", "small-confirmed", "--repo", str(repo), "--out", str(tmp_path),
                                 "--prompts", "95", "--margin", "0.3"])
    assert result.exit_code == 2 and "floor of 1,109 prompts" in result.output
    assert "cannot be resolved with the prompts the tasks hold (at most 349 per task past prompt 1)" in result.output
    # Within both, the request passes on to the plan (here: nothing collected in tmp_path, exit 2 naming that).
    result = runner.invoke(app, ["sweep", "plan", "small-confirmed", "--repo", str(repo), "--out", str(tmp_path),
                                 "--prompts", "60", "--margin", "2"])
    assert result.exit_code == 2 and "mmw sweep collect small-confirmed first" in result.output


def test_sweep_plan_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mmw.cli import app
    from mmw.sweep.cells import confirmed_table

    repo = Path(__file__).resolve().parents[1]
    runner = CliRunner()
    # Not collected, the planner says what to run first (an exploratory collection is planned as a pilot:
    # tests/test_sweep.py).
    result = runner.invoke(app, ["sweep", "plan", "small", "--repo", str(repo), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "mmw sweep collect small first" in result.output
    # smoke has one; without collected tables it says what to run first.
    result = runner.invoke(app, ["sweep", "plan", "smoke", "--repo", str(repo), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "mmw sweep collect smoke first" in result.output
    results, reevaluations, prompts = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 0.8, "b": 0.99})
    confirmation = Confirmation(prompts=150, offset=1)
    table, _ = confirmed_table(results, reevaluations, prompts, confirmation, k=2)
    (tmp_path / "smoke").mkdir()
    for name, frame in (("table", table), ("results", results),
                        ("reevaluations", reevaluations.with_columns(pl.lit(90.0).alias("wall_s")))):
        frame.write_parquet(tmp_path / "smoke" / f"{name}.parquet")
    result = runner.invoke(app, ["sweep", "plan", "smoke", "--repo", str(repo), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "| 1% q, no R | 0.7 | distribution_shift | 150 |" in result.output


def test_randomness_cells_are_confirmed_like_the_papers() -> None:
    from mmw.sweep.cells import confirmed_randomness, pending_config_ids

    confirmation = Confirmation(prompts=150, offset=2)
    results, reevaluations, prompts = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 0.8, "b": 0.99})
    results = results.with_columns(pl.Series("randomness_kind", ["fixed", "text-dependent", "text-dependent"]),
                                   pl.Series("scheme.window", [None, 1, 0]))
    table = confirmed_randomness(results, reevaluations, prompts, confirmation, k=2)
    rows = {r["randomness_kind"]: r for r in table.iter_rows(named=True)}
    # Window 0 (c) is left out: text-dependent's pick is b, confirmed at 10 %; fixed (a) waits for its runs.
    assert (rows["text-dependent"]["status"], rows["text-dependent"]["config_id"]) == (CONFIRMED, "b")
    assert rows["fixed"]["status"] == PENDING and pending_config_ids(table) == ["a"]


def test_the_simulator_judges_exactly_as_a_real_cell_is_judged() -> None:
    """The vectorised path of the simulation (bounds for a batch of sweeps + verdict) gives the same status and
    reason as :func:`check` on each sweep's runs as real evidence."""
    from mmw.sweep.confirm import check, resistance_bounds, verdict
    from sweep_simulation import draw_runs

    scenario = Scenario(_four([1.0, 0.93, 0.899, 0.895], [0.5, 0.3, 0.12, 0.11]), Constraints(0.1, 0.2), n_confirm=150)
    settings = Confirmation(prompts=150, resamples=300)
    sweeps = 24
    runs = draw_runs(scenario, np.arange(sweeps) % 4, scenario.n_confirm, 2, np.random.default_rng(4))
    _, q_low, q_high = quality_bounds(runs.watermarked, runs.baseline, settings.per_try,
                                      scenario.constraints.min_relative_quality)
    _, r_low, r_high = resistance_bounds(runs.attacks, settings.per_try,
                                         resample_counts(50, settings.resamples, settings.seed + 1))
    status, reason = verdict(np.zeros(sweeps, bool), q_low, q_high, r_low, r_high, scenario.constraints)
    assert len(set(status)) >= 2  # the batch covers more than one outcome
    for s in range(sweeps):
        a = runs.attacks
        one = Evidence(runs.watermarked[s], runs.baseline[s], runs.sizes[s], AttackEvidence(
            a.detected[s], a.rating_attacked[s], a.rating_reference[s], a.no_attack[s]))
        judged = check("x", one, scenario.constraints, settings)
        assert (judged.status, judged.reason or "") == (status[s], reason[s])
        assert judged.quality_low == pytest.approx(q_low[s]) and judged.resistance_low == pytest.approx(r_low[s])


def test_collect_writes_the_confirmed_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collection of a sweep with held-out prompts, its DVC reads replaced by synthetic runs."""
    import mmw.sweep.collect as collect_module
    from mmw.sweep.definition import Reevaluation, Sweep
    from mmw.sweep.units import Runs

    results, reevaluations, prompts = _sweep_tables({"a": 1.0, "b": 1.0, "c": 1.0}, {"c": 0.8, "b": 0.99})
    results = results.with_columns(pl.lit("text-dependent").alias("randomness_kind"),
                                   pl.lit("distribution_shift").alias("scheme.sampler"),
                                   pl.Series("scheme.delta", [1.0, 2.0, 5.0]))
    reevaluations = reevaluations.with_columns(pl.lit(None, dtype=pl.String).alias("rev"),
                                               pl.lit(80.0).alias("wall_s"))
    runs = Runs(results, pl.DataFrame(), reevaluations, prompts.with_columns(pl.lit("confirmation").alias("role")),
                pl.DataFrame())
    monkeypatch.setattr(collect_module, "read_runs", lambda repo, sweep, echo: runs)
    sweep = Sweep(name="t", description="", configs=[], reevaluate=Reevaluation(k=2, first_seed=1000),
                  confirmation=Confirmation(prompts=150, offset=2), tuning=2)
    out = tmp_path / "t"
    collected = collect_module.collect(tmp_path, sweep, out, "test", with_timings=False, echo=lambda _: None)
    assert {"prompts.parquet", "tries.parquet", "plan.parquet", "split.json", "table.md", "randomness.md",
            "delta.md"} <= {p.name for p in out.iterdir()}
    assert collected.table.filter(pl.col("status") == CONFIRMED).height == 2
    assert "tuning runs' point estimates, not confirmed" in (out / "delta.md").read_text()
    assert "Prompts needed" in (out / "table.md").read_text()
    assert (out / "claims.parquet").is_file() and "The paper's orderings" in (out / "table.md").read_text()
