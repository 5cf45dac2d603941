"""Collecting a sweep: its finished units' evidence files (:mod:`mmw.sweep.units`, written as each experiment
lands, or exported from the experiment refs first) into tables that live in git.

``reports/sweeps/<name>/`` receives (all readable without the DVC cache and without experiment refs):

* ``results.parquet`` / ``.csv`` — one row per config of the definition: ``config_id``, ``grid``, ``status``
  (done | failed | missing), ``error``, ``experiment``, every param as a dotted column, ``family`` (= sampler),
  ``randomness_kind`` (text-dependent | fixed), the ``all.*`` metrics, ``wall_s``, and the stages DVC ran /
  restored (``stages_ran``, ``stages_restored``);
* ``attacks.parquet`` — per config and attack: ``watermarked``, ``quality_retained``, ``size``;
* ``reevaluations.parquet`` — one row per re-evaluation run (``config_id`` of the pick, ``seed``, metrics);
* ``table.parquet`` / ``table.md`` — the paper's table: per temperature x family x constraint the pick, its
  selection-time size, and the median (MAD) of its size over the K re-evaluations;
* ``randomness.parquet`` / ``.md`` — text-dependent vs fixed randomness (smallest size at near-optimal quality);
* ``delta.parquet`` / ``.md`` — the size-quality trade-off over delta (distribution shift) at T = 0.3 and 1;
* with held-out prompts (``confirm``): ``prompts.parquet`` (per-prompt rows), ``tries.parquet``, ``plan.parquet``
  and ``claims.parquet`` — the paper's orderings judged on the confirmed cells (:mod:`mmw.sweep.claims`; also
  at the end of ``table.md``);
* ``timings.parquet`` — per config and stage that actually ran in its experiment: the stage's wall time;
* for a race (an ``adaptive`` definition): ``rounds.parquet`` (the round log: per round and configuration that
  ran, kept or dropped, why, at how many prompts, the bounds, cells stopped), ``race.parquet`` (per round: units,
  kept, dropped by reason, cells stopped) and ``race.json`` (tuning seconds spent against the uniform grid's, from
  the measured unit times); a raced configuration's row in ``results`` pools its shards' per-prompt rows, and each
  cell's confirmation ranks only the configurations the race kept in it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from mmw.selection import (
    PAPER_CONSTRAINTS,
    Constraints,
    cell_picks,
    comparable_groups,
    median_mad,
    with_group,
)
from mmw.errors import SpecError
from mmw.io import write_text
from mmw.reporting.data import watermark_names
from mmw.sweep.adaptive import LOG_SCHEMA, cells_left
from mmw.sweep.cells import confirmed_randomness, confirmed_table, extended_table, first_rounds
from mmw.sweep.claims import bound_undetected, check_claims
from mmw.sweep.cost import measured_costs
from mmw.sweep.definition import SINGLE_VALUED, Sweep
from mmw.sweep.plan import sweep_plan
from mmw.sweep.tables import plan_markdown, race_markdown, write_sweep_tables
from mmw.sweep.units import Runs, read_runs, rounds_paths

SIZE, QUALITY, RESISTANCE = "all.size", "all.relative_quality", "all.tamper_resistance"


@dataclass(frozen=True)
class Collected:
    """The tables of one collection (see the module docstring)."""

    results: pl.DataFrame
    attacks: pl.DataFrame
    reevaluations: pl.DataFrame
    table: pl.DataFrame
    randomness: pl.DataFrame
    delta: pl.DataFrame
    groups: int


def check_single_valued(results: pl.DataFrame) -> None:
    """Refuse (SpecError naming the param) a sweep whose finished runs used more than one generator, engine or
    judge: their qualities and sizes cannot be compared or pooled."""
    done = results.filter(pl.col("status") == "done")
    for dotted in SINGLE_VALUED:
        if dotted in done.columns and done[dotted].drop_nulls().n_unique() > 1:
            values = ", ".join(str(v) for v in done[dotted].drop_nulls().unique().sort().to_list())
            raise SpecError(dotted, f"the sweep's runs mix {values}", "one value over the whole sweep")


def pool(results: pl.DataFrame) -> pl.DataFrame:
    """The selection pool: finished configs with the columns :func:`mmw.selection.select` needs."""
    done = results.filter(pl.col("status") == "done")
    for required in ("all.fpr_ci_high",):
        if required not in done.columns:
            done = done.with_columns(pl.lit(None, dtype=pl.Float64).alias(required))
    return with_group(done.with_columns(pl.lit("experiment").alias("kind"), pl.col("experiment").alias("name"),
                                        pl.lit(None, dtype=pl.String).alias("rev")).drop("family"))


def picks(results: pl.DataFrame) -> pl.DataFrame:
    """The paper's four constraints x temperature x family picks over the finished configs."""
    done = pool(results)
    if done.height == 0:
        return pl.DataFrame()
    constraints = [Constraints(max_quality_loss=q, min_tamper_resistance=r) for q, r in PAPER_CONSTRAINTS]
    return cell_picks(done, constraints)


def picked_config_ids(results: pl.DataFrame) -> list[str]:
    """Distinct config ids picked in any cell under any of the paper's constraints (what to re-evaluate)."""
    table = picks(results)
    if table.height == 0 or "pick.config_id" not in table.columns:
        return []
    return list(dict.fromkeys(table["pick.config_id"].drop_nulls().to_list()))


def paper_table(results: pl.DataFrame, reevaluations: pl.DataFrame, k: int) -> pl.DataFrame:
    """``table.parquet``: per temperature x family x constraint: the pick's ``config_id``, its selection-time
    size, ``size_median`` / ``size_mad`` over its re-evaluations (``k`` = how many finished), the pick's params."""
    table = picks(results)
    if table.height == 0:
        return table
    for needed in ("pick.config_id", f"pick.{SIZE}"):
        if needed not in table.columns:  # no cell had a feasible setting
            table = table.with_columns(pl.lit(None, dtype=pl.String if needed.endswith("id") else pl.Float64)
                                       .alias(needed))
    done = reevaluations.filter(pl.col("status") == "done") if reevaluations.height else reevaluations
    summary: dict[str, tuple[float | None, float | None, int]] = {}
    for cid in table["pick.config_id"].drop_nulls().unique().to_list():
        sizes = done.filter(pl.col("config_id") == cid)[SIZE].to_list() if done.height else []
        median, mad = median_mad(sizes)
        summary[cid] = (median, mad, len(sizes))
    cids = table["pick.config_id"].to_list()
    table = table.rename({"model.temperature": "temperature", "pick.config_id": "config_id",
                          "pick.all.size": "pick_size"})
    table = table.with_columns(
        pl.Series("size_median", [summary[c][0] if c else None for c in cids], dtype=pl.Float64),
        pl.Series("size_mad", [summary[c][1] if c else None for c in cids], dtype=pl.Float64),
        pl.Series("k", [summary[c][2] if c else 0 for c in cids], dtype=pl.Int64),
        pl.lit(k).alias("k_planned"))
    keep = ["temperature", "family", "max_quality_loss", "min_tamper_resistance", "config_id", "size_median",
            "size_mad", "k", "k_planned", "pick_size", "n_settings", "n_feasible"]
    params = [c for c in table.columns if c.startswith(("pick.scheme.", "pick.all.relative_quality",
                                                         "pick.all.tamper_resistance"))]
    return table.select([c for c in keep if c in table.columns] + params)


def randomness_table(results: pl.DataFrame, max_quality_loss: float = 0.1) -> pl.DataFrame:
    """Text-dependent vs fixed randomness: per temperature and kind, the smallest size among finished configs
    with quality loss <= ``max_quality_loss``, excluding the constant-randomness corner cases (window 0,
    key length 1), as the paper's comparison does."""
    done = results.filter((pl.col("status") == "done") & (pl.col(QUALITY) >= 1 - max_quality_loss)
                          & pl.col(SIZE).is_not_null() & pl.col(SIZE).is_finite())
    if "scheme.window" in done.columns:
        done = done.filter(pl.col("scheme.window").is_null() | (pl.col("scheme.window") != 0))
    if done.height == 0:
        return pl.DataFrame(schema={"temperature": pl.Float64, "randomness_kind": pl.String,
                                    "min_size": pl.Float64, "config_id": pl.String, "n": pl.UInt32})
    best = (done.sort(SIZE).group_by(["model.temperature", "randomness_kind"], maintain_order=True)
            .agg(pl.col(SIZE).first().alias("min_size"), pl.col("config_id").first(),
                 pl.col("family").first(), pl.len().alias("n")))
    return best.rename({"model.temperature": "temperature"}).sort(["temperature", "randomness_kind"])


def delta_table(results: pl.DataFrame, temperatures: tuple[float, ...] = (0.3, 1.0)) -> pl.DataFrame:
    """Size-quality trade-off over delta (distribution shift, sum score) at the given temperatures: per delta
    the number of finished configs, the smallest and median size, the median relative quality and the max R."""
    if "scheme.delta" not in results.columns:
        return pl.DataFrame()
    ds = results.filter((pl.col("status") == "done") & (pl.col("family") == "distribution_shift")
                        & pl.col("model.temperature").is_in(list(temperatures)) & pl.col("scheme.delta").is_not_null())
    return (ds.group_by(["model.temperature", "scheme.delta"])
            .agg(pl.len().alias("n"), pl.col(SIZE).min().alias("min_size"), pl.col(SIZE).median().alias("median_size"),
                 pl.col(QUALITY).median().alias("median_relative_quality"),
                 pl.col(RESISTANCE).max().alias("max_tamper_resistance"))
            .rename({"model.temperature": "temperature", "scheme.delta": "delta"}).sort(["temperature", "delta"]))




def round_log(repo: Path, sweep: Sweep) -> pl.DataFrame:
    """The race's committed round log (empty before its first round)."""
    path = rounds_paths(repo, sweep.name)[0]
    return pl.read_parquet(path) if path.is_file() else pl.DataFrame(schema=LOG_SCHEMA)


def confirmed_tables(repo: Path, runs: Runs, sweep: Sweep) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(table, tries, randomness)`` of a sweep with ``confirm`` (:mod:`mmw.sweep.cells`). For a race, each cell
    ranks only the configurations still contending in it (the round log's ``cells_left``) and the randomness
    comparison those still in their 10 %-quality cell; ``n_settings`` counts every configuration of the cell."""
    confirmation = sweep.confirmation
    assert confirmation is not None
    results, k = runs.results, sweep.reevaluate.k
    reevaluations = first_rounds(runs.reevaluations, sweep.reevaluate.seeds)  # later rounds: extended_table
    prompts = runs.prompts.filter(pl.col("role") == "confirmation")
    if not sweep.racing:
        table, tries = confirmed_table(results, reevaluations, prompts, confirmation, k)
        return table, tries, confirmed_randomness(results, reevaluations, prompts, confirmation, k)
    out = cells_left(round_log(repo, sweep))

    def contending(cell: tuple[float, float]) -> pl.DataFrame:
        return results.filter(~pl.col("config_id").is_in([c for c, cells in out.items() if cell in cells]))

    tables, tried = [], []
    for cell in confirmation.constraints:
        table, tries = confirmed_table(contending(cell), reevaluations, prompts, confirmation, k,
                                       constraint_list=(cell,))
        tables.append(table)
        tried += [tries] if tries.height else []
    counts = (results.filter(pl.col("status") == "done").group_by("model.temperature", "family")
              .agg(pl.len().cast(pl.Int64).alias("_n")).rename({"model.temperature": "temperature"}))
    table = (pl.concat(tables).join(counts, on=["temperature", "family"], how="left")
             .with_columns(pl.col("_n").alias("n_settings")).drop("_n")
             .sort(["temperature", "family", "max_quality_loss", "min_tamper_resistance"],
                   descending=[False, False, False, True]))
    randomness = confirmed_randomness(contending((0.1, 0.0)), reevaluations, prompts, confirmation, k)
    return table, pl.concat(tried, how="diagonal_relaxed") if tried else pl.DataFrame(), randomness


def judged_tables(repo: Path, runs: Runs, sweep: Sweep) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(table, tries, randomness)`` as collected: :func:`confirmed_tables`, each "undetected" try judged again on
    the detection bound over its own round's prompts (:func:`mmw.sweep.claims.bound_undetected`), then the later
    rounds of ``confirm.extend`` (:func:`mmw.sweep.cells.extended_table`)."""
    confirmation = sweep.confirmation
    assert confirmation is not None
    table, tries, randomness = confirmed_tables(repo, runs, sweep)
    held_out = runs.prompts.filter(pl.col("role") == "confirmation")
    first = first_rounds(runs.reevaluations, sweep.reevaluate.seeds)
    first_rows = held_out.filter(pl.col("experiment").is_in(first["experiment"].to_list())) \
        if first.height and "experiment" in held_out.columns else held_out
    table, tries = bound_undetected(table, tries, first_rows, confirmation.per_try)
    randomness, _ = bound_undetected(randomness, None, first_rows, confirmation.per_try)
    if confirmation.extend:
        table, tries = extended_table(table, tries if tries is not None else pl.DataFrame(), runs.reevaluations,
                                      held_out, confirmation)
    return table, tries, randomness


def race_frames(repo: Path, runs: Runs, sweep: Sweep) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """The race's report tables (``rounds``: the round log; ``race``: per round, units, kept, dropped by reason,
    cells stopped) and its costs (:func:`mmw.sweep.cost.measured_costs`)."""
    assert sweep.confirmation is not None and sweep.schedule is not None and sweep.tuning is not None
    log = round_log(repo, sweep)
    reason = pl.col("reason").fill_null("")
    summary = (log.group_by("round", maintain_order=True).agg(
        pl.col("prompts_per_task").first(), pl.len().alias("units"),
        (pl.col("decision") == "kept").sum().alias("kept"), (pl.col("decision") == "dropped").sum().alias("dropped"),
        *[((pl.col("decision") == "dropped") & reason.str.contains(f": {why}", literal=True)).sum()
          .alias(f"dropped_{why}") for why in ("quality", "R", "size")],
        pl.concat_str(pl.col("group"), pl.lit(": "), pl.col("cells_stopped")).drop_nulls().unique().sort()
        .str.join("; ").alias("cells_stopped"))
        .with_columns(pl.col("round") + 1).sort("round")) if log.height else pl.DataFrame()
    costs = measured_costs(runs.race_units, len(sweep.configs), sweep.tuning, sweep.tasks)
    costs.update(race_rounds=sweep.schedule.rounds, race_level=sweep.schedule.level,
                 race_shards=",".join(str(s) for s in sweep.schedule.shards))
    return {"rounds": log, "race": summary}, costs


def collect(repo: Path, sweep: Sweep, out_dir: Path, scale: str, with_timings: bool = True,
            echo: Callable[[str], None] = print) -> Collected:
    """Read ``sweep``'s experiments in ``repo`` and write every table of the module docstring to ``out_dir``."""
    runs = read_runs(repo, sweep, echo)
    results, attacks, reevaluations = runs.results, runs.attacks, runs.reevaluations
    done = pool(results)
    groups = len(comparable_groups(done)) if done.height else 0
    if groups > 1:
        echo(f"warning: the finished configs form {groups} groups that cannot be compared; the table picks "
             "across them (check the sweep's base)")
    extra: dict[str, pl.DataFrame] = {}
    race_text = ""
    confirmation = sweep.confirmation
    if confirmation is not None:
        assert sweep.tuning is not None  # a confirmed sweep's tuning runs leave prompts for confirmation
        check_single_valued(results)
        table, tries, randomness = judged_tables(repo, runs, sweep)
        held_out = runs.prompts.filter(pl.col("role") == "confirmation")
        plan = sweep_plan(table, results, reevaluations, confirmation, sweep.tuning, sweep.reevaluate.k,
                          randomness)
        claims = check_claims(table, randomness, held_out, level=confirmation.level, names=watermark_names(results))
        extra = {"prompts": runs.prompts, "tries": tries, "plan": plan, "claims": claims}
        if sweep.racing:
            frames, costs = race_frames(repo, runs, sweep)
            extra.update(frames)
            race_text = race_markdown(frames["race"], costs)
            out_dir.mkdir(parents=True, exist_ok=True)
            write_text(json.dumps(costs, indent=2) + "\n", out_dir / "race.json")
    else:
        table = paper_table(results, reevaluations, sweep.reevaluate.k)
        randomness = randomness_table(results)
    delta = delta_table(results)
    frames = {"results": results, "attacks": attacks, "reevaluations": reevaluations, "table": table,
              "randomness": randomness, "delta": delta, **extra}
    if with_timings:
        frames["timings"] = runs.timings
    plan_text = plan_markdown(extra["plan"], confirmation.level, sweep.reevaluate.k) if confirmation else ""
    write_sweep_tables(out_dir, frames, sweep, scale, plan_text + race_text)
    return Collected(results=results, attacks=attacks, reevaluations=reevaluations, table=table,
                     randomness=randomness, delta=delta, groups=groups)
