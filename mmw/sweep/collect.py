"""Collecting a sweep: its experiments (read through ``dvc.api``) into tables that live in git (written by
:mod:`mmw.reporting.sweep`).

``reports/sweeps/<name>/`` receives (all readable without the DVC cache):

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
* ``timings.parquet`` — per config and stage that actually ran in its experiment: the stage's wall time.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from mmw.reporting.sweep import plan_markdown, write_sweep_tables
from mmw.selection import (
    PAPER_CONSTRAINTS,
    Constraints,
    cell_picks,
    comparable_groups,
    median_mad,
    read_experiments,
    with_group,
)
from mmw.selection.reading import column
from mmw.selection.reeval import REEVAL_PREFIX
from mmw.errors import SpecError
from mmw.sweep.cells import confirmed_randomness, confirmed_table
from mmw.sweep.definition import SINGLE_VALUED, Sweep
from mmw.sweep.evidence import sweep_prompt_rows
from mmw.sweep.plan import sweep_plan
from mmw.sweep.runner import finished_experiments, read_log

REPORTS = Path("reports/sweeps")
SIZE, QUALITY, RESISTANCE = "all.size", "all.relative_quality", "all.tamper_resistance"
TIMED_STAGES = ("generate_baseline", "generate_watermarked", "perturb", "detect_baseline", "detect_watermarked",
                "rate_baseline", "rate_watermarked", "aggregate")


def experiment_name(sweep: str, config_id: str) -> str:
    return f"{sweep}-{config_id}"


def reevaluation_name(sweep: str, config_id: str, seed: int) -> str:
    return f"{REEVAL_PREFIX}{sweep}-{config_id}-s{seed}"


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


def _randomness_kind(randomness: Any) -> str | None:
    return None if randomness is None else "fixed" if randomness == "fixed" else "text-dependent"


def read_sweep(repo: Path, sweep: Sweep) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(results, attacks, reevaluations)`` of ``sweep`` in ``repo`` (see the module docstring)."""
    prefix, reeval_prefix = f"{sweep.name}-", f"{REEVAL_PREFIX}{sweep.name}-"
    experiments = read_experiments(repo, pool_filter=lambda name: name.startswith((prefix, reeval_prefix)))
    # One row per name, the finished one first: a run killed before it finished can still be listed (running)
    # under the name its rerun finished with.
    by_name: dict[str, dict[str, Any]] = {}
    for row in experiments.table.iter_rows(named=True):
        if row["kind"] == "experiment" and by_name.get(row["name"], {}).get("status") != "done":
            by_name[row["name"]] = row
    log = read_log(repo, sweep.name)
    records: list[dict[str, Any]] = []
    attack_rows: list[dict[str, Any]] = []
    for config in sweep.configs:
        name = experiment_name(sweep.name, config.config_id)
        row = by_name.get(name)
        outcome = log.get(name)
        record: dict[str, Any] = {"config_id": config.config_id, "grid": config.grid, "experiment": name}
        if row is not None and row["status"] == "done":
            record.update(row)
            record.update(status="done", error=row["error"] if row.get("error") else None)
            for attack, metrics in experiments.attacks.get(row["rev"], {}).items():
                attack_rows.append({"config_id": config.config_id, "attack": attack,
                                    "watermarked": metrics.get("watermarked"),
                                    "quality_retained": metrics.get("quality_retained"),
                                    "size": metrics.get("size")})
        else:
            record.update({k: v for k, v in config.overrides.items() if not isinstance(v, list | dict)})
            failed = outcome is not None and outcome.status == "failed"
            record.update(status="failed" if failed else "missing", error=outcome.error if failed else None)
        record["name"] = name
        record["wall_s"] = outcome.wall_s if outcome is not None and outcome.status == "done" else None
        record["stages_ran"] = ",".join(outcome.ran) if outcome is not None else None
        record["stages_restored"] = ",".join(outcome.restored) if outcome is not None else None
        records.append(record)
    results = _typed(records)
    results = results.with_columns(
        pl.col("scheme.sampler").alias("family"),
        pl.col("scheme.randomness").map_elements(_randomness_kind, return_dtype=pl.String).alias("randomness_kind"))
    first = ["config_id", "grid", "status", "error", "experiment", "family", "randomness_kind", "wall_s"]
    dropped = {"name", "kind"}
    results = results.select([*first, *[c for c in results.columns if c not in first and c not in dropped]])
    reeval_rows = []
    for row in by_name.values():
        if row["name"].startswith(reeval_prefix):
            cid, _, seed = row["name"].removeprefix(reeval_prefix).rpartition("-s")
            reeval_rows.append({"config_id": cid, "seed": int(seed), "experiment": row["name"],
                                "status": row["status"], SIZE: row.get(SIZE), QUALITY: row.get(QUALITY),
                                RESISTANCE: row.get(RESISTANCE), "all.size_valid": row.get("all.size_valid"),
                                "all.size_anytime": row.get("all.size_anytime"), "all.fpr": row.get("all.fpr"),
                                "rev": row.get("rev"),
                                "wall_s": log[row["name"]].wall_s if row["name"] in log else None})
    reevaluations = _typed(reeval_rows) if reeval_rows else pl.DataFrame(
        schema={"config_id": pl.String, "seed": pl.Int64, "experiment": pl.String, "status": pl.String,
                SIZE: pl.Float64, QUALITY: pl.Float64, RESISTANCE: pl.Float64})
    attacks = pl.DataFrame(attack_rows, schema={"config_id": pl.String, "attack": pl.String,
                                                "watermarked": pl.Float64, "quality_retained": pl.Float64,
                                                "size": pl.Float64})
    return results, attacks, reevaluations


def check_single_valued(results: pl.DataFrame) -> None:
    """Refuse (SpecError naming the param) a sweep whose finished runs used more than one generator, engine or
    judge: their qualities and sizes cannot be compared or pooled."""
    done = results.filter(pl.col("status") == "done")
    for dotted in SINGLE_VALUED:
        if dotted in done.columns and done[dotted].drop_nulls().n_unique() > 1:
            values = ", ".join(str(v) for v in done[dotted].drop_nulls().unique().sort().to_list())
            raise SpecError(dotted, f"the sweep's runs mix {values}", "one value over the whole sweep")


def _typed(records: list[dict[str, Any]]) -> pl.DataFrame:
    columns: list[str] = []
    for record in records:
        columns.extend(k for k in record if k not in columns)
    frame = pl.DataFrame([column(c, [r.get(c) for r in records]) for c in columns])
    for metric in (SIZE, QUALITY, RESISTANCE):
        if metric in frame.columns:
            frame = frame.with_columns(pl.col(metric).cast(pl.Float64))
        else:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias(metric))
    return frame


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


def timings(repo: Path, results: pl.DataFrame) -> pl.DataFrame:
    """Per finished config, the wall time of each stage that ran in its own experiment (a restored stage's
    timing file is the original run's, so it is not counted again).

    The timing files are DVC outputs: their hashes come from the experiment commit's ``dvc.lock`` and their
    content from the local cache (one ``git show`` per experiment instead of one DVC repository open per file).
    """
    refs = finished_experiments(repo)
    cache = repo / ".dvc" / "cache" / "files" / "md5"
    rows = []
    for row in results.filter(pl.col("status") == "done").iter_rows(named=True):
        ran = [s for s in (row.get("stages_ran") or "").split(",") if s in TIMED_STAGES]
        sha = refs.get(row["experiment"])
        if not ran or sha is None:
            continue
        shown = subprocess.run(["git", "show", f"{sha}:dvc.lock"], cwd=repo, capture_output=True, text=True)
        lock = yaml.safe_load(shown.stdout) if shown.returncode == 0 else {}
        for stage in ran:
            outs = {o["path"]: o.get("md5") for o in (lock.get("stages", {}).get(stage, {}).get("outs") or [])}
            digest = outs.get(f"reports/timings/{stage}.json")
            path = cache / digest[:2] / digest[2:] if digest else None
            if path is None or not path.is_file():  # not in this cache: only that number is lost
                continue
            data = json.loads(path.read_text())
            rows.append({"config_id": row["config_id"], "temperature": row.get("model.temperature"),
                         "stage": stage, "wall_s": float(data.get("wall_s", math.nan))})
    return pl.DataFrame(rows, schema={"config_id": pl.String, "temperature": pl.Float64, "stage": pl.String,
                                      "wall_s": pl.Float64})


def collect(repo: Path, sweep: Sweep, out_dir: Path, scale: str, with_timings: bool = True,
            echo: Callable[[str], None] = print) -> Collected:
    """Read ``sweep``'s experiments in ``repo`` and write every table of the module docstring to ``out_dir``."""
    results, attacks, reevaluations = read_sweep(repo, sweep)
    done = pool(results)
    groups = len(comparable_groups(done)) if done.height else 0
    if groups > 1:
        echo(f"warning: the finished configs form {groups} groups that cannot be compared; the table picks "
             "across them (check the sweep's base)")
    extra: dict[str, pl.DataFrame] = {}
    if sweep.split is not None:
        check_single_valued(results)
        prompts = pl.concat([sweep_prompt_rows(repo, results, "tuning"),
                             sweep_prompt_rows(repo, reevaluations, "confirmation")], how="diagonal_relaxed")
        table, tries = confirmed_table(results, reevaluations, prompts.filter(pl.col("role") == "confirmation"),
                                       sweep.split, sweep.reevaluate.k)
        plan = sweep_plan(table, results, reevaluations, sweep.split, sweep.reevaluate.k)
        extra = {"prompts": prompts, "tries": tries, "plan": plan}
        randomness = confirmed_randomness(results, reevaluations, prompts.filter(pl.col("role") == "confirmation"),
                                          sweep.split, sweep.reevaluate.k)
    else:
        table = paper_table(results, reevaluations, sweep.reevaluate.k)
        randomness = randomness_table(results)
    delta = delta_table(results)
    frames = {"results": results, "attacks": attacks, "reevaluations": reevaluations, "table": table,
              "randomness": randomness, "delta": delta, **extra}
    if with_timings:
        frames["timings"] = timings(repo, results)
    plan_text = plan_markdown(extra["plan"], sweep.split.level, sweep.reevaluate.k) if sweep.split else ""
    write_sweep_tables(out_dir, frames, sweep.split, scale, plan_text)
    return Collected(results=results, attacks=attacks, reevaluations=reevaluations, table=table,
                     randomness=randomness, delta=delta, groups=groups)
