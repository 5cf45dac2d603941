"""Later confirmation rounds (``confirm.extend``): the definition's keys, their validation, the units they add,
and the level accounting of a cell judged in more than one round (docs/SWEEP.md section 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from mmw.errors import SpecError
from mmw.sweep.cells import (
    confirmed_table,
    extended_table,
    extension_candidates,
    first_rounds,
)
from mmw.sweep.confirm import (
    CANNOT,
    CONFIRMED,
    NOT_CONFIRMED,
    SIZE_E,
    SIZE_VALID,
    UNRESOLVED,
    Confirmation,
    Extension,
    ExtensionCell,
)
from mmw.sweep.definition import check_extensions, expand

ROOT = Path(__file__).resolve().parents[1]

GRIDS = [
    {"name": "dipmark", "scheme.sampler": "reweight", "scheme.score": "sum", "scheme.randomness": "window",
     "scheme.window": 1, "scheme.delta": None, "scheme.reweight_alpha": [0.5, 0.35]},
    {"name": "ds", "scheme.sampler": "distribution_shift", "scheme.score": "sum", "scheme.randomness": "window",
     "scheme.window": 1, "scheme.delta": 2.5},
]
ROUND = {"name": "round 3", "level": 0.025, "offset": 17, "first_seed": 2000,
         "cells": [{"temperature": 1.0, "family": "reweight", "prompts": 53, "k": 2},
                   {"temperature": 0.7, "family": "distribution_shift", "min_r": [0.0], "prompts": 79, "k": 3}]}


def _write(directory: Path, extend: list[dict[str, Any]]) -> None:
    definition = {"base": {"prompts.per_task": 1, "model.max_new_tokens": 48}, "temperatures": [1.0, 0.7],
                  "reevaluate": {"k": 5, "first_seed": 1000},
                  "confirm": {"prompts": 16, "level": 0.05, "max_tries": 2, "quality_losses": [0.1],
                              "extend": extend},
                  "grids": GRIDS}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "r.yaml").write_text(yaml.safe_dump(definition))


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _round(**changes: Any) -> dict[str, Any]:
    return {**ROUND, **changes}


def _cells(*changes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**cell, **change} for cell, change in zip(ROUND["cells"], changes, strict=True)]


def test_a_later_round_is_declared_with_its_level_and_adds_fresh_units(tmp_path: Path, board: dict) -> None:
    from mmw.sweep.units import extension_runs, sweep_units

    _write(tmp_path, [ROUND])
    sweep = expand("r", board, tmp_path, validate=False)
    confirmation = sweep.confirmation
    assert confirmation is not None and len(confirmation.extend) == 1
    extension = confirmation.extend[0]
    assert confirmation.total_level == pytest.approx(0.075)
    assert (extension.per_task(1.0), extension.per_task(0.7), extension.per_task(0.3)) == (53, 79, None)
    assert confirmation.round_of_seed(2002) is extension and confirmation.round_of_seed(1004) is None
    # Every configuration of a declared cell's temperature and family, with the round's seeds (up to the cell's
    # K) and the round's prompts at that temperature; none elsewhere.
    runs = extension_runs(sweep)
    by_config: dict[str, list[int]] = {}
    for config, seed, overrides in runs:
        by_config.setdefault(config.config_id, []).append(seed)
        temperature = overrides["model.temperature"]
        assert (overrides["prompts.offset"], overrides["prompts.per_task"]) == (17, 53 if temperature == 1.0 else 79)
        assert (overrides["scheme.sampler"], temperature) in {("reweight", 1.0), ("distribution_shift", 0.7)}
    assert sorted(len(s) for s in by_config.values()) == [2, 2, 3]
    units = sweep_units(sweep)
    assert len({u.unit_id for u in units.values()}) == len(units)  # fresh seeds and prompts: fresh unit ids
    later = [u for u in units.values() if u.seed is not None and u.seed >= 2000]
    assert len(later) == 7 and all(u.role == "confirmation" for u in later)


@pytest.mark.parametrize(("extend", "key", "words"), [
    ([_round(cells=_cells({"k": 1}, {}))], "confirm.extend[0].cells[0].k", "out of range"),
    ([_round(cells=_cells({"prompts": 0}, {}))], "confirm.extend[0].cells[0].prompts", "out of range"),
    ([_round(cells=_cells({}, {"min_r": [0.3]}))], "confirm.extend[0].cells[1].min_r[0]", "R targets"),
    ([_round(level=0.6)], "confirm.extend[0].level", "out of range"),
    ([_round(cells=[*ROUND["cells"], {**ROUND["cells"][0], "min_r": [0.0], "family": "distribution_shift",
                                      "temperature": 0.7, "prompts": 60}])],
     "confirm.extend[0].cells[2].prompts", "share one prompt range"),
    ([_round(offset=10)], "confirm.extend[0].offset", "overlap the first confirmation prompts [1, 17)"),
    ([_round(offset=0)], "confirm.extend[0].offset", "overlap the tuning prompts [0, 1)"),
    ([_round(), _round(name="round 4", first_seed=3000, offset=60, cells=_cells({"prompts": 10}, {"prompts": 10}))],
     "confirm.extend[1].offset",
     "overlap the prompts of confirm.extend[0]"),
    ([_round(first_seed=1003)], "confirm.extend[0].first_seed", "overlap those of reevaluate"),
    ([_round(cells=_cells({"prompts": 340}, {}))], "confirm.extend[0].cells[0].prompts",
     f"task book_report holds 350 prompts in the extended pool (the largest); the cell {CANNOT}"),
    ([_round(cells=_cells({"family": "kgw"}, {}))], "confirm.extend[0].cells[0]", "no configuration of family"),
    ([_round(level=0.46)], "confirm.extend[0].level", "levels add up to 0.51 per cell"),
])
def test_a_bad_round_is_refused_naming_its_key(tmp_path: Path, board: dict, extend: list, key: str,
                                               words: str) -> None:
    _write(tmp_path, extend)
    with pytest.raises(SpecError) as caught:
        expand("r", board, tmp_path, validate=False)
    assert caught.value.key.endswith(key) and words in str(caught.value), str(caught.value)


def test_prompts_beyond_a_pool_name_the_task_and_its_count() -> None:
    confirmation = Confirmation(prompts=16, offset=1, extend=[Extension(
        name="r3", level=0.025, offset=17, first_seed=2000,
        cells=[ExtensionCell(temperature=1.0, family="reweight", prompts=80, k=2)])])
    pools = {"book_report": 100, "story": 96, "fake_news": 100}
    with pytest.raises(SpecError) as caught:
        check_extensions(confirmation, (0, 1), (1, 16), [1000, 1001], list(pools), 1 / 3, pools)
    assert "task story holds 96 prompts" in str(caught.value) and "at most 79 per task" in str(caught.value)
    check_extensions(confirmation.model_copy(update={"extend": [confirmation.extend[0].model_copy(update={
        "cells": [ExtensionCell(temperature=1.0, family="reweight", prompts=79, k=2)]})]}),
        (0, 1), (1, 16), [1000, 1001], list(pools), 1 / 3, pools)


def test_held_out_prompts_past_the_paper_pool_run_on_the_extended_pool(tmp_path: Path, board: dict) -> None:
    """The tuning runs take the board's pool (the paper's); a confirmation round whose prompts run past it sets
    ``prompts.pool: extended`` on its runs (the same prompts where both pools hold them), and only those runs, so
    every unit inside the paper pool keeps its identity. Past the extended pool the round is refused naming it; the
    tuning prompts must fit their own pool, whose error names it and the remedy."""
    from mmw.sweep.units import sweep_units

    _write(tmp_path, [_round(cells=_cells({"prompts": 100}, {}))])  # T = 1: [17, 117); T = 0.7: [17, 96)
    sweep = expand("r", board, tmp_path, validate=False)
    assert (sweep.pool, sweep.task_names) == ("paper", ("book_report", "story", "fake_news"))
    units = list(sweep_units(sweep).values())
    past = [u for u in units if u.overrides.get("prompts.pool") == "extended"]
    assert past and all(u.seed >= 2000 and u.overrides["model.temperature"] == 1.0 for u in past)
    assert all(u.overrides["prompts.per_task"] == 100 for u in past)
    assert not [u for u in units if "prompts.pool" in u.overrides and u not in past]
    _write(tmp_path, [ROUND])  # inside the paper pool: no unit sets a pool
    assert not any("prompts.pool" in u.overrides for u in sweep_units(expand("r", board, tmp_path, False)).values())
    # The first confirmation past the extended pool.
    definition = yaml.safe_load((tmp_path / "r.yaml").read_text())
    definition["confirm"] = {**definition["confirm"], "prompts": 350, "extend": []}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(definition))
    with pytest.raises(SpecError) as caught:
        expand("r", board, tmp_path, validate=False)
    assert str(caught.value).endswith("confirm.prompts: 350 per task from prompt 1: task book_report holds 350 "
                                      "prompts in the extended pool (the largest); allowed: at most 349 per task "
                                      "from prompt 1")
    # Tuning prompts past the paper pool: refused naming it and the remedy; with base prompts.pool: extended, run.
    definition["confirm"] = {**definition["confirm"], "prompts": 16}
    definition["base"]["prompts.per_task"] = 97
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(definition))
    with pytest.raises(SpecError) as caught:
        expand("r", board, tmp_path, validate=False)
    assert "base: prompts.pool: task story holds 96 prompts in the paper pool" in str(caught.value)
    assert "allowed: prompts.pool: extended (354 prompts of story)" in str(caught.value)
    definition["base"]["prompts.pool"] = "extended"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(definition))
    sweep = expand("r", board, tmp_path, validate=False)
    assert sweep.pool == "extended" and not any(
        "prompts.pool" in u.overrides and u.overrides["prompts.pool"] != "extended"
        for u in sweep_units(sweep).values())


def test_the_cli_refuses_a_bad_round_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mmw.cli import app

    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    _write(tmp_path / "sweeps", [_round(cells=_cells({"k": 1}, {}))])
    result = CliRunner().invoke(app, ["sweep", "plan", "r", "--repo", str(tmp_path)])
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]
    assert "confirm.extend[0].cells[0].k" in line and "out of range" in line


# --- level accounting: a cell judged again -------------------------------------------------------------------------

def _rows(experiment: str, rho: float, rng: np.random.Generator, prompts: range, attacked: int) -> pl.DataFrame:
    """Per-prompt rows of one synthetic run on ``prompts`` (the schema of mmw.sweep.evidence.join_rows)."""
    rows = []
    for index, i in enumerate(prompts):
        pid = f"story-{i:03d}"
        base = float(np.clip(rng.normal(60, 10), 0, 100))
        wm = float(np.clip(rho * base * (1 + rng.normal(0, 0.02)), 0, 100))
        rows += [(pid, "baseline", "", False, None, base, None, None),
                 (pid, "watermarked", "", True, 20.0, wm, None, None)]
        if index < attacked:
            rows.append((pid, "retokenized", "", True, 20.0, None, None, None))
            for attack, retained in (("swap", 0.9), ("typo", 0.6)):
                rows.append((pid, "attack", attack, bool(rng.random() < 0.9), 25.0, retained * wm, True, True))
    frame = pl.DataFrame(rows, schema={"prompt_id": pl.String, "source": pl.String, "attack": pl.String,
                                       "detected": pl.Boolean, "size_valid": pl.Float64, "rating": pl.Float64,
                                       "in_R": pl.Boolean, "ok": pl.Boolean}, orient="row")
    return frame.with_columns(pl.lit(experiment).alias("experiment"), pl.lit("confirmation").alias("role"),
                              pl.lit("a").alias("config_id"))


def _runs(seeds: list[int], rho: float, prompts: range, attacked: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    names = [f"reeval-r-a-s{s}" for s in seeds]
    reevaluations = pl.DataFrame({"config_id": ["a"] * len(seeds), "seed": seeds, "experiment": names,
                                  "status": ["done"] * len(seeds), SIZE_E: [12.0] * len(seeds),
                                  SIZE_VALID: [28.0] * len(seeds)})
    return reevaluations, pl.concat([_rows(n, rho, rng, prompts, attacked) for n in names])


RESULTS = pl.DataFrame({"config_id": ["a"], "experiment": ["r-a"], "status": ["done"], "model.temperature": [0.7],
                        "family": ["distribution_shift"], SIZE_E: [10.0], SIZE_VALID: [30.0],
                        "all.relative_quality": [1.0], "all.tamper_resistance": [0.6], "scheme.score": ["sum"]})


def _confirmation(k: int = 2) -> Confirmation:
    return Confirmation(prompts=10, offset=1, level=0.05, max_tries=2, quality_losses=[0.1], extend=[Extension(
        name="round 3", level=0.025, offset=11, first_seed=2000,
        cells=[ExtensionCell(temperature=0.7, family="distribution_shift", min_r=[0.0], prompts=150, k=k)])])


def _judged(later_rho: float | None, later_seeds: tuple[int, ...] = (2000, 2001)
            ) -> tuple[pl.DataFrame, pl.DataFrame]:
    confirmation = _confirmation()
    first, first_rows = _runs([1000, 1001], 0.97, range(1, 11), 5, seed=1)
    reevaluations, rows = first, first_rows
    if later_rho is not None:
        later, later_rows = _runs(list(later_seeds), later_rho, range(11, 161), 50, seed=2)
        reevaluations, rows = pl.concat([first, later]), pl.concat([first_rows, later_rows])
    table, tries = confirmed_table(RESULTS, first_rounds(reevaluations, [1000, 1001]), rows, confirmation, k=2)
    return extended_table(table, tries, reevaluations, rows, confirmation)


def test_rounds_one_and_two_are_judged_on_their_own_runs_only() -> None:
    first, first_rows = _runs([1000, 1001], 0.97, range(1, 11), 5, seed=1)
    later, later_rows = _runs([2000, 2001], 1.0, range(11, 161), 50, seed=2)
    runs, rows = pl.concat([first, later]), pl.concat([first_rows, later_rows])
    assert first_rounds(runs, [1000, 1001])["seed"].to_list() == [1000, 1001]
    table, _ = confirmed_table(RESULTS, first_rounds(runs, [1000, 1001]), rows, _confirmation(), k=2)
    assert table["n_prompts"].to_list() == [10, 10] and set(table["status"]) == {UNRESOLVED}
    mixed, _ = confirmed_table(RESULTS, runs, rows, _confirmation(), k=2)  # without the filter: other prompts
    assert mixed["n_prompts"].to_list() != [10, 10]


def test_a_later_round_judges_the_open_cell_at_the_sum_of_its_levels() -> None:
    before, tries_before = _judged(None)
    # Before the round's runs: the table is the first rounds' (level 0.05, no later round).
    assert set(before["status"]) == {UNRESOLVED} and set(before["level"]) == {0.05}
    assert before["round"].null_count() == before.height and set(tries_before["round"]) == {"round 1"}
    # The round's K runs on 150 fresh prompts, true quality 1.0: confirmed, at 0.05 + 0.025 in all.
    table, tries = _judged(1.0)
    no_r = table.filter(pl.col("min_tamper_resistance") == 0.0).row(0, named=True)
    assert (no_r["status"], no_r["round"], no_r["tries"], no_r["n_prompts"], no_r["k"]) == (
        CONFIRMED, "round 3", 2, 150, 2)
    assert no_r["level"] == pytest.approx(0.075) and no_r["alpha"] == 0.025 and no_r["quality_low"] >= 0.9
    later = tries.filter(pl.col("round") == "round 3")
    assert later.height == 1 and later["try"].to_list() == [2] and later["alpha"].to_list() == [0.025]
    # The cell with R is not declared in the round (min_r [0.0]): it keeps its first rounds' verdict and level.
    with_r = table.filter(pl.col("min_tamper_resistance") == 0.2).row(0, named=True)
    assert (with_r["status"], with_r["level"], with_r["round"], with_r["n_prompts"]) == (UNRESOLVED, 0.05, None, 10)


def test_a_later_round_can_refute_and_waits_for_all_its_runs() -> None:
    table, _ = _judged(0.7)
    no_r = table.filter(pl.col("min_tamper_resistance") == 0.0).row(0, named=True)
    assert (no_r["status"], no_r["reason"], no_r["level"]) == (NOT_CONFIRMED, "quality", pytest.approx(0.075))
    # One of the round's two runs: the cell is not judged again yet.
    table, _ = _judged(1.0, later_seeds=(2000,))
    no_r = table.filter(pl.col("min_tamper_resistance") == 0.0).row(0, named=True)
    assert (no_r["status"], no_r["round"], no_r["level"]) == (UNRESOLVED, None, 0.05)


def test_the_round_runs_the_declared_open_cells_in_order() -> None:
    table, _ = _judged(None)
    extension = _confirmation().extend[0]
    found = extension_candidates(table.with_columns(pl.lit(None, dtype=pl.String).alias("round")), extension)
    assert [(r["config_id"], r["min_tamper_resistance"]) for r, _ in found] == [("a", 0.0)]
    judged, _ = _judged(1.0)
    assert extension_candidates(judged, extension) == []  # judged in this round: nothing left to run


def test_the_plan_shows_a_declared_cell_as_its_round_until_the_round_judges_it() -> None:
    from mmw.sweep.plan import with_declared_rounds

    confirmation = _confirmation()
    table, _ = _judged(None)
    table = table.with_columns(pl.lit(None, dtype=pl.String).alias("round"))
    plan = pl.DataFrame({"temperature": [0.7, 0.7], "family": ["distribution_shift"] * 2, "quality_prompts": [None, None],
                         "max_quality_loss": [0.1, 0.1], "min_tamper_resistance": [0.2, 0.0], "k": [None, None],
                         "prompts_per_task": [None, None], "resolvable": [False, False], "note": [CANNOT, CANNOT],
                         "cpu_s": [None, None], "h100_hours": [None, None]},
                        schema_overrides={"k": pl.Int64, "prompts_per_task": pl.Int64, "cpu_s": pl.Float64, "quality_prompts": pl.Float64,
                                          "h100_hours": pl.Float64})
    shown = with_declared_rounds(plan, table, confirmation, 1, (10.0, 1.0))
    declared = shown.filter(pl.col("min_tamper_resistance") == 0.0).row(0, named=True)
    assert (declared["k"], declared["prompts_per_task"], declared["cpu_s"]) == (2, 150, 2 * (10 + 150))
    assert declared["note"].startswith("round 3: 150 per task, K = 2")
    assert shown.filter(pl.col("min_tamper_resistance") == 0.2)["note"].to_list() == [CANNOT]  # not declared
    judged = with_declared_rounds(plan, table.with_columns(pl.lit("round 3").alias("round")), confirmation, 1, None)
    assert judged["note"].to_list() == [CANNOT, CANNOT]
    # A need the planner put at its own K is shown at the round's K (the column beside it), not left at the
    # planner's: 100 prompts at K = 8 of a cell measured at K = 5 are 100 / rv(8, 5) x rv(2, 5) at K = 2.
    from mmw.sweep.plan import relative_variance

    k_now = table.filter((pl.col("family") == "distribution_shift") & (pl.col("min_tamper_resistance") == 0.0)
                         )["k"][0]
    planned = plan.with_columns(pl.lit(100.0).alias("quality_prompts"), pl.lit(8, dtype=pl.Int64).alias("k"))
    at_round = with_declared_rounds(planned, table, confirmation, 1, None).filter(
        pl.col("min_tamper_resistance") == 0.0).row(0, named=True)
    assert at_round["k"] == 2 and at_round["quality_prompts"] == pytest.approx(
        100 / relative_variance(8, k_now) * relative_variance(2, k_now))
