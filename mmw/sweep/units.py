"""A sweep's committed evidence: one file per finished unit (tuning run, confirmation or re-evaluation run).

Experiment refs and the DVC cache stay on the machine that made them; a long sweep that continues on another
machine needs its finished work as files in git. Every unit that finishes is written, atomically, to::

    reports/sweeps/<name>/runs/<unit_id>.parquet

* the rows: the run's per-prompt table (:func:`mmw.sweep.evidence.join_rows`: ratings, detections and sizes,
  attack outcomes; no texts, never the key);
* the Parquet metadata ``mmw.unit`` (JSON): the sweep, the unit (``unit_id``, ``experiment``, ``config_id``,
  ``role``, ``seed``, the overrides it ran with), the run's params (the key is dropped as soon as they are read),
  its ``all.*`` and per-attack metrics, its wall time, the stages DVC ran / restored and their wall times, and the
  commit it ran on. A unit run in a pack (several configurations of one baseline in one process,
  :mod:`mmw.sweep.pack`) has the same rows and fields, no experiment commit (``rev`` null) and ``packed``: the
  pack's id, size, the unit's place in it and the pack's shared wall time.

``unit_id`` is a pure function of the unit's params: :func:`mmw.sweep.definition.config_id` of the overrides the
unit runs with (its config's, plus for a confirmation or re-evaluation run the held-out prompts and its seed; a
tuning unit's id is its ``config_id``). A rerun on any machine maps to the same file.

A unit with a file is finished: :func:`mmw.sweep.run_sweep` never runs it again and collection reads every table
from these files (:func:`read_runs`), so a clone that holds the committed directory but no experiment refs and no
DVC cache resumes and collects exactly as the machine that ran them. Finished experiments that have no file yet
(a sweep run by an older version, a kill between the experiment and its file) are written first
(:func:`export`), from the experiment refs of any baseline commit.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from mmw.errors import SpecError
from mmw.io import write_with
from mmw.selection.reading import column, read_revision
from mmw.selection.reeval import REEVAL_PREFIX
from mmw.sweep.definition import SINGLE_VALUED, Sweep, config_id
from mmw.sweep.evidence import COLUMNS, KEYS, pooled_metrics, prompt_rows
from mmw.sweep.pipeline import cached_file, locked_outputs
from mmw.sweep.runner import (
    LOG_DIR,
    Executor,
    Job,
    Outcome,
    Progress,
    finished_experiments,
    head_commit,
    read_log,
    run_jobs,
)

REPORTS = Path("reports/sweeps")
RUNS = "runs"
META = "mmw.unit"
#: 2: the metadata holds ``shard`` (the race round of a race unit, else null). Format 1 files (no ``shard``) read
#: as units without a shard. A unit run in a pack (:func:`write_packed_unit`) also holds ``packed``; one without
#: it ran as a DVC experiment.
FORMAT = 2
#: Stages whose wall times make the cost model (``reports/timings/<stage>.json``, a DVC output of each stage).
TIMED_STAGES = ("generate_baseline", "generate_watermarked", "perturb", "detect_baseline", "detect_watermarked",
                "rate_baseline", "rate_watermarked", "aggregate")
TUNING, CONFIRMATION, REEVALUATION, RACE = "tuning", "confirmation", "reevaluation", "race"


def experiment_name(sweep: str, config_id: str) -> str:
    return f"{sweep}-{config_id}"


def reevaluation_name(sweep: str, config_id: str, seed: int) -> str:
    return f"{REEVAL_PREFIX}{sweep}-{config_id}-s{seed}"


def race_name(sweep: str, config_id: str, shard: int) -> str:
    """The experiment of a configuration's race unit on prompt shard (round) ``shard``."""
    return f"{sweep}-{config_id}-r{shard}"


@dataclass(frozen=True)
class Unit:
    """One experiment a sweep may run: its name, config, role (tuning | race | confirmation | reevaluation), seed
    (None: the repository's), the overrides it runs with and, for a race unit, its prompt shard (round); ``unit_id``
    is a hash of those overrides."""

    experiment: str
    config_id: str
    role: str
    seed: int | None
    overrides: dict[str, Any]
    shard: int | None = None

    @property
    def unit_id(self) -> str:
        return config_id(self.overrides)


def held_out(sweep: Sweep, offset: int, per_task: int | None) -> dict[str, Any]:
    """What a confirmation run sets for its held-out prompts ``[offset, offset + per_task)`` per task: the range,
    and ``prompts.pool: extended`` where it runs past the tuning runs' pool (the paper's) in one of the sweep's
    tasks. Both pools hold the same prompts where both hold them, so a range inside the tuning pool sets no pool
    (and keeps its unit's identity)."""
    from mmw.tasks import range_pool

    overrides: dict[str, Any] = {"prompts.offset": offset, "prompts.per_task": per_task}
    if per_task is not None and (pool := range_pool(sweep.task_names, per_task, offset, sweep.pool)) != sweep.pool:
        overrides["prompts.pool"] = pool
    return overrides


def reevaluation_overrides(sweep: Sweep, overrides: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """What a re-run of a config sets: its overrides, the held-out prompts (with ``confirm``: :func:`held_out`)
    and the seed."""
    confirmation = sweep.confirmation
    held = {} if confirmation is None else held_out(sweep, confirmation.overrides["prompts.offset"],
                                                        confirmation.overrides["prompts.per_task"])
    return {**overrides, **held, "seed": seed}


def sweep_units(sweep: Sweep) -> dict[str, Unit]:
    """Every unit the definition can ask for, by experiment name: each config's tuning run, its race units (one
    per round of an ``adaptive`` definition: the round's shard of the tuning prompts) and its K re-runs (any config
    may become a pick or a fallback)."""
    role = CONFIRMATION if sweep.confirmation is not None else REEVALUATION
    units: dict[str, Unit] = {}
    for config in sweep.configs:
        name = experiment_name(sweep.name, config.config_id)
        units[name] = Unit(name, config.config_id, TUNING, None, dict(config.overrides))
    if sweep.schedule is not None and sweep.confirmation is not None:
        for config in sweep.configs:
            for shard in range(sweep.schedule.rounds):
                start, size = sweep.schedule.shard(shard)
                name = race_name(sweep.name, config.config_id, shard)
                units[name] = Unit(name, config.config_id, RACE, None,
                                   {**config.overrides, "prompts.offset": sweep.tuning_offset + start,
                                    "prompts.per_task": size}, shard)
    for config in sweep.configs:
        for seed in sweep.reevaluate.seeds:
            name = reevaluation_name(sweep.name, config.config_id, seed)
            units[name] = Unit(name, config.config_id, role, seed,
                               reevaluation_overrides(sweep, config.overrides, seed))
    for config, seed, overrides in extension_runs(sweep):
        name = reevaluation_name(sweep.name, config.config_id, seed)
        units[name] = Unit(name, config.config_id, CONFIRMATION, seed, overrides)
    return units


def extension_runs(sweep: Sweep) -> list[tuple[Any, int, dict[str, Any]]]:
    """``(config, seed, overrides)`` of every run a later confirmation round (``confirm.extend``) may ask for: each
    configuration of a declared cell's temperature and family, with the round's seeds up to the cell's K and the
    round's prompts at that temperature (which candidate runs is known only from the rounds before)."""
    from mmw.sweep.definition import config_family

    confirmation = sweep.confirmation
    out: list[tuple[Any, int, dict[str, Any]]] = []
    if confirmation is None:
        return out
    for extension in confirmation.extend:
        for config in sweep.configs:
            temperature = config.overrides.get("model.temperature")
            ks = [c.k for c in extension.cells
                  if c.temperature == temperature and c.family == config_family(config.overrides)]
            if not ks:
                continue
            held = held_out(sweep, extension.offset, extension.per_task(temperature))
            out += [(config, seed, {**config.overrides, **held, "seed": seed}) for seed in extension.seeds(max(ks))]
    return out


def runs_dir(repo: Path, sweep: str) -> Path:
    return repo / REPORTS / sweep / RUNS


# ------------------------------------------------------------------------------------------------ writing


def stage_timings(repo: Path, sha: str, ran: list[str]) -> dict[str, float]:
    """Wall time of each stage that ran in the experiment at ``sha`` (a restored stage's timing file is the
    original run's, so it is not counted again), from its ``dvc.lock`` and the local DVC cache."""
    ran = [s for s in ran if s in TIMED_STAGES]
    if not ran:
        return {}
    locked = locked_outputs(repo, sha)
    found: dict[str, float] = {}
    for stage in ran:
        path = cached_file(repo, locked.get(stage, {}).get(f"reports/timings/{stage}.json"))
        if path is not None:  # not in this cache: only that number is lost
            found[stage] = float(json.loads(path.read_text()).get("wall_s", math.nan))
    return found


def read_experiment(repo: Path, sha: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                                   pl.DataFrame | None]:
    """``(params, metrics, attacks, rows)`` of the experiment commit ``sha``: flat params without the key, the
    ``all.*`` metrics, the per-attack metrics and the per-prompt rows (None when its tables are not in this
    repository's DVC cache)."""
    params, metrics, attacks, _ = read_revision(repo, sha)
    return params, metrics, attacks, prompt_rows(repo, sha)


def experiment_params(repo: Path, sha: str) -> dict[str, Any]:
    """The flat params (lists kept whole, no key) of the experiment commit ``sha``."""
    return read_revision(repo, sha)[0]


def unit_path(repo: Path, sweep: str, unit: Unit) -> Path:
    return runs_dir(repo, sweep) / f"{unit.unit_id}.parquet"


def write_unit(repo: Path, sweep: Sweep, unit: Unit, sha: str, baseline: str, wall_s: float | None,
               finished: str | None, ran: list[str], restored: list[str], ran_as: str | None = None) -> Path:
    """Read the finished experiment ``sha`` of ``unit`` and write its evidence file atomically. ``ran_as``: the
    experiment's name when it differs from the unit's (a definition whose config ids have changed since)."""
    params, metrics, attacks, rows = read_experiment(repo, sha)
    return _store(repo, sweep, unit, RunEvidence(params, metrics, attacks, rows, stage_timings(repo, sha, ran)),
                  {"rev": sha, "baseline": baseline, "ran_as": ran_as or unit.experiment, "wall_s": wall_s,
                   "finished": finished, "stages_ran": ran, "stages_restored": restored})


@dataclass(frozen=True)
class RunEvidence:
    """What an evidence file holds of one finished run: its flat params (no key), ``all.*`` metrics, per-attack
    metrics, per-prompt rows (None: not available) and the wall times of the stages it ran."""

    params: dict[str, Any]
    metrics: dict[str, Any]
    attacks: dict[str, Any]
    rows: pl.DataFrame | None
    timings: dict[str, float]


def write_packed_unit(repo: Path, sweep: Sweep, unit: Unit, evidence: RunEvidence, packed: dict[str, Any],
                      baseline: str, wall_s: float, finished: str, ran: list[str], restored: list[str]) -> Path:
    """Write the evidence file of ``unit`` run in a pack (:mod:`mmw.sweep.pack`): the same file as
    :func:`write_unit` writes for its DVC experiment, with no experiment commit (``rev`` null) and ``packed``: the
    pack's id, size and shared wall time."""
    return _store(repo, sweep, unit, evidence,
                  {"rev": None, "baseline": baseline, "ran_as": unit.experiment, "wall_s": wall_s,
                   "finished": finished, "stages_ran": ran, "stages_restored": restored, "packed": packed})


def _store(repo: Path, sweep: Sweep, unit: Unit, evidence: RunEvidence, run: dict[str, Any]) -> Path:
    meta = {"format": FORMAT, "sweep": sweep.name, "unit_id": unit.unit_id, "experiment": unit.experiment,
            "config_id": unit.config_id, "role": unit.role, "seed": unit.seed, "shard": unit.shard,
            "overrides": unit.overrides, "params": evidence.params, "metrics": evidence.metrics,
            "attacks": evidence.attacks, "timings": evidence.timings, "has_rows": evidence.rows is not None, **run}
    rows = evidence.rows if evidence.rows is not None else pl.DataFrame(schema={k: pl.String for k in KEYS})
    path = unit_path(repo, sweep.name, unit)
    text = json.dumps(meta, sort_keys=True, default=str)
    write_with(path, lambda tmp: rows.write_parquet(tmp, metadata={META: text}))
    return path


def experiment_refs(repo: Path) -> dict[str, tuple[str, str]]:
    """Experiment name -> ``(commit, baseline)`` over the experiment refs of every baseline commit (those of
    ``HEAD`` first, then the newest): a sweep started at an older commit is still found after a ``git pull``."""
    done = subprocess.run(["git", "for-each-ref", "--sort=-committerdate", "--format=%(refname) %(objectname)",
                           "refs/exps/"], cwd=repo, capture_output=True, text=True, check=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=False)
    head_sha = head.stdout.strip()
    found: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        ref, sha = line.split()
        parts = ref.split("/")
        if len(parts) != 5 or len(parts[2]) != 2 or len(parts[3]) != 38:
            continue  # DVC's own refs (exec, celery, ...)
        baseline = parts[2] + parts[3]
        if parts[4] not in found or baseline == head_sha:
            found[parts[4]] = (sha, baseline)
    return found


def export(repo: Path, sweep: Sweep, echo: Callable[[str], None] = print) -> list[Path]:
    """Write the evidence file of every finished experiment of ``sweep`` (an experiment ref of any baseline
    commit) that has none yet; wall times and stages from this repository's run log. Returns the files written."""
    units = sweep_units(sweep)
    refs = experiment_refs(repo)
    todo = {name: units[name] for name in refs if name in units}
    strays = sorted(n for n in refs if n.startswith((f"{sweep.name}-", f"{REEVAL_PREFIX}{sweep.name}-"))
                    and n not in units)
    left = []
    for name in strays:  # config ids changed since it ran: find its unit by the params it ran with
        unit = _unit_of(units, name, experiment_params(repo, refs[name][0]))
        if unit is None or unit.unit_id in {u.unit_id for u in todo.values()}:
            left.append(name)
        else:
            todo[name] = unit
    if left:
        echo(f"[{sweep.name}] {len(left)} experiment(s) of this sweep's name match no unit of its definition "
             f"(left out): {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}")
    log = read_log(repo, sweep.name)
    written = []
    for name, unit in sorted(todo.items()):
        if unit_path(repo, sweep.name, unit).is_file():
            continue
        sha, baseline = refs[name]
        outcome = log.get(name)
        ok = outcome is not None and outcome.status == "done"
        written.append(write_unit(repo, sweep, unit, sha, baseline, outcome.wall_s if ok else None,
                                  outcome.finished if ok else None, outcome.ran if ok else [],
                                  outcome.restored if ok else [], ran_as=name))
    if written:
        echo(f"[{sweep.name}] wrote the evidence of {len(written)} finished experiment(s) to "
             f"{runs_dir(repo, sweep.name).relative_to(repo)}/")
    return written


def _unit_of(units: Mapping[str, Unit], name: str, params: Mapping[str, Any]) -> Unit | None:
    """The one unit of the definition whose overrides the experiment ``name`` ran with (``params``: its flat
    params), of the same role (tuning or re-run); None when none or several match."""
    rerun = name.startswith(REEVAL_PREFIX)
    found = [u for u in units.values() if (u.role in (CONFIRMATION, REEVALUATION)) == rerun
             and all(params.get(k) == v for k, v in u.overrides.items())]
    return found[0] if len(found) == 1 else None


# ------------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class StoredUnit:
    """One evidence file: its metadata (see the module docstring) and its per-prompt rows."""

    path: Path
    meta: dict[str, Any]
    rows: pl.DataFrame


def read_unit(path: Path) -> StoredUnit:
    try:
        meta = json.loads(pl.read_parquet_metadata(path)[META])
        rows = pl.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - not Parquet, no metadata, not JSON: all mean "not evidence"
        raise SpecError(str(path), f"not a sweep evidence file ({type(err).__name__})",
                        "a file written by `mmw sweep run` / `mmw sweep export`; remove it") from None
    return StoredUnit(path, meta, rows)


def finished_units(repo: Path, sweep: Sweep) -> set[str]:
    """Experiment names of the units that have an evidence file (no validation: :func:`load_units` does it)."""
    present = {p.stem for p in runs_dir(repo, sweep.name).glob("*.parquet")}
    return {name for name, unit in sweep_units(sweep).items() if unit.unit_id in present}


def load_units(repo: Path, sweep: Sweep) -> list[StoredUnit]:
    """Every evidence file of ``sweep``, checked (SpecError, one line naming the setting): written for this sweep
    and for a unit of its definition, and one generator, engine and judge over all of them."""
    units = {u.unit_id: u for u in sweep_units(sweep).values()}
    stored = [read_unit(p) for p in sorted(runs_dir(repo, sweep.name).glob("*.parquet"))]
    where = f"{REPORTS / sweep.name / RUNS}"
    for unit in stored:
        name = f"{where}/{unit.path.name}"
        if unit.meta.get("sweep") != sweep.name:
            raise SpecError("sweep", f"{name} holds a run of sweep {unit.meta.get('sweep')!r}",
                            f"only runs of {sweep.name}: remove it")
        expected = units.get(unit.path.stem)
        if expected is None or unit.meta.get("unit_id") != unit.path.stem \
                or unit.meta.get("experiment") != expected.experiment:
            raise SpecError(f"sweeps/{sweep.name}.yaml", f"{name} ({unit.meta.get('experiment')}) is no unit of "
                            "the current definition (written under another one)",
                            "restore that definition, or remove the file to run the unit again")
    for dotted in SINGLE_VALUED:
        seen: dict[str, list[str]] = {}
        for unit in stored:
            params = unit.meta.get("params") or {}
            if dotted in params:
                seen.setdefault(str(params[dotted]), []).append(unit.path.name)
        if len(seen) > 1:
            shown = "; ".join(f"{v} ({len(files)} run(s), e.g. {files[0]})" for v, files in sorted(seen.items()))
            raise SpecError(dotted, f"{where} mixes {shown}", "one value over the whole sweep: remove the other "
                            "runs' files")
    return stored


@dataclass(frozen=True)
class Runs:
    """A sweep's finished units as collection's tables (see :mod:`mmw.sweep.collect`): ``results`` (one row per
    config; a raced config's shards pooled), ``attacks``, ``reevaluations`` (one row per re-run), ``prompts``
    (per-prompt rows of every unit that has them, with ``experiment, config_id, seed, role``), ``timings`` (per
    tuning unit and stage) and ``race_units`` (one row per finished race or grid tuning unit: ``config_id``,
    ``role``, ``shard``, ``prompts`` per task, ``wall_s``: what the race's cost is compared with)."""

    results: pl.DataFrame
    attacks: pl.DataFrame
    reevaluations: pl.DataFrame
    prompts: pl.DataFrame
    timings: pl.DataFrame
    race_units: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RACE_UNITS))


#: ``Runs.race_units``' columns.
RACE_UNITS = {"config_id": pl.String, "role": pl.String, "shard": pl.Int64, "prompts": pl.Int64,
              "wall_s": pl.Float64}


def _typed(records: list[dict[str, Any]], floats: tuple[str, ...]) -> pl.DataFrame:
    columns: list[str] = []
    for record in records:
        columns.extend(k for k in record if k not in columns)
    frame = pl.DataFrame([column(c, [r.get(c) for r in records]) for c in columns])
    return frame.with_columns((pl.col(m).cast(pl.Float64) if m in frame.columns
                               else pl.lit(None, dtype=pl.Float64).alias(m)) for m in floats)


SIZE, QUALITY, RESISTANCE = "all.size", "all.relative_quality", "all.tamper_resistance"
REEVAL_METRICS = (SIZE, QUALITY, RESISTANCE, "all.size_valid", "all.size_anytime", "all.fpr")


def tables(sweep: Sweep, stored: list[StoredUnit], failed: Mapping[str, str | None] | None = None) -> Runs:
    """The collection's tables from the evidence files alone. ``failed``: experiment name -> error of units whose
    last attempt on this machine failed (the run log); every other config without a file is missing."""
    failed = failed or {}
    by_name = {u.meta["experiment"]: u for u in stored}
    records: list[dict[str, Any]] = []
    attack_rows: list[dict[str, Any]] = []
    timing_rows: list[dict[str, Any]] = []
    shards: dict[str, list[StoredUnit]] = {}
    for unit in stored:
        if sweep.racing and unit.meta["role"] == RACE:
            shards.setdefault(unit.meta["config_id"], []).append(unit)
    for config in sweep.configs:
        name = experiment_name(sweep.name, config.config_id)
        record: dict[str, Any] = {"config_id": config.config_id, "grid": config.grid, "experiment": name}
        unit = None if sweep.racing else by_name.get(name)
        ran = sorted(shards.get(config.config_id, []), key=lambda u: u.meta["shard"])
        if unit is not None or ran:
            meta = unit.meta if unit is not None else _pooled_meta(sweep, ran)
            record.update(rev=meta["rev"], kind="experiment", status="done", error=None)
            record.update(meta["params"])
            record.update(meta["metrics"])
            for attack, metrics in meta["attacks"].items():
                attack_rows.append({"config_id": config.config_id, "attack": attack,
                                    "watermarked": metrics.get("watermarked"),
                                    "quality_retained": metrics.get("quality_retained"), "size": metrics.get("size")})
            for part in ([unit] if unit is not None else ran):
                for stage, wall in part.meta["timings"].items():
                    timing_rows.append({"config_id": config.config_id,
                                        "temperature": part.meta["params"].get("model.temperature"),
                                        "stage": stage, "wall_s": wall})
        else:
            meta = None
            names = [name] if not sweep.racing else [race_name(sweep.name, config.config_id, 0)]
            record.update({k: v for k, v in config.overrides.items() if not isinstance(v, list | dict)})
            record.update(status="failed" if names[0] in failed else "missing", error=failed.get(names[0]))
        record["name"] = name
        record["wall_s"] = meta["wall_s"] if meta is not None else None
        record["stages_ran"] = ",".join(meta["stages_ran"]) if meta is not None else None
        record["stages_restored"] = ",".join(meta["stages_restored"]) if meta is not None else None
        records.append(record)
    results = _typed(records, (SIZE, QUALITY, RESISTANCE))
    # A plugin is its own family (each outside watermark is one column of the tables, as a built-in sampler).
    family = pl.col("scheme.sampler")
    if "scheme.plugin" in results.columns:
        family = pl.when(family == "plugin").then(pl.col("scheme.plugin")).otherwise(family)
    results = results.with_columns(
        family.alias("family"),
        pl.col("scheme.randomness").map_elements(_randomness_kind, return_dtype=pl.String).alias("randomness_kind"))
    first = ["config_id", "grid", "status", "error", "experiment", "family", "randomness_kind", "wall_s"]
    results = results.select([*first, *[c for c in results.columns if c not in first and c not in {"name", "kind"}]])
    reeval_rows = []
    for name in sorted(by_name):
        meta = by_name[name].meta
        if meta["role"] in (CONFIRMATION, REEVALUATION):
            reeval_rows.append({"config_id": meta["config_id"], "seed": meta["seed"], "experiment": name,
                                "status": "done", **{m: meta["metrics"].get(m) for m in REEVAL_METRICS},
                                "rev": meta["rev"], "wall_s": meta["wall_s"]})
    reevaluations = _typed(reeval_rows, REEVAL_METRICS) if reeval_rows else pl.DataFrame(
        schema={"config_id": pl.String, "seed": pl.Int64, "experiment": pl.String, "status": pl.String,
                SIZE: pl.Float64, QUALITY: pl.Float64, RESISTANCE: pl.Float64})
    attacks = pl.DataFrame(attack_rows, schema={"config_id": pl.String, "attack": pl.String,
                                                "watermarked": pl.Float64, "quality_retained": pl.Float64,
                                                "size": pl.Float64})
    timings = pl.DataFrame(timing_rows, schema={"config_id": pl.String, "temperature": pl.Float64,
                                                "stage": pl.String, "wall_s": pl.Float64})
    race_units = pl.DataFrame([{"config_id": u.meta["config_id"], "role": u.meta["role"], "shard": u.meta.get("shard"),
                                "prompts": u.meta["params"].get("prompts.per_task"), "wall_s": u.meta["wall_s"]}
                               for u in stored if u.meta["role"] in (RACE, TUNING)], schema=RACE_UNITS)
    return Runs(results, attacks, reevaluations, _prompts(stored), timings, race_units)


def _pooled_meta(sweep: Sweep, ran: list[StoredUnit]) -> dict[str, Any]:
    """A raced configuration as one tuning run: its race units' per-prompt rows pooled
    (:func:`mmw.sweep.evidence.pooled_metrics`), the params of its first unit with the prompts it saw
    (``prompts.offset`` / ``prompts.per_task`` over its shards), ``race.rounds``, the summed wall time."""
    assert sweep.confirmation is not None and sweep.schedule is not None
    frames = [u.rows for u in ran if u.meta.get("has_rows")]
    metrics, attacks = pooled_metrics(pl.concat(frames, how="diagonal_relaxed")) if frames else ({}, {})
    last = max(u.meta["shard"] for u in ran)
    params = {**ran[0].meta["params"], "prompts.offset": sweep.tuning_offset,
              "prompts.per_task": sweep.schedule.shards[last]}
    walls = [u.meta["wall_s"] for u in ran]
    stages = lambda key: list(dict.fromkeys(s for u in ran for s in u.meta[key]))  # noqa: E731
    return {"rev": ran[-1].meta["rev"], "params": params, "metrics": {**metrics, "race.rounds": len(ran)},
            "attacks": attacks, "wall_s": None if None in walls else round(sum(walls), 1),
            "stages_ran": stages("stages_ran"), "stages_restored": stages("stages_restored")}


def _prompts(stored: list[StoredUnit]) -> pl.DataFrame:
    """The per-prompt rows of every unit that has them, tagged ``experiment, config_id, seed, role`` (a re-run of
    a sweep with ``confirm`` is a confirmation run), sorted by unit."""
    first = ["experiment", "config_id", "seed", "role"]
    frames = [u.rows.with_columns(pl.lit(u.meta["experiment"]).alias("experiment"),
                                  pl.lit(u.meta["config_id"]).alias("config_id"),
                                  pl.lit(u.meta["params"].get("seed"), dtype=pl.Int64).alias("seed"),
                                  pl.lit(u.meta["role"]).alias("role"))
              for u in sorted(stored, key=lambda u: u.meta["experiment"]) if u.meta.get("has_rows")]
    if not frames:
        return pl.DataFrame(schema={"experiment": pl.String, "config_id": pl.String, "seed": pl.Int64,
                                    "role": pl.String, "prompt_id": pl.String, "source": pl.String})
    stacked = pl.concat(frames, how="diagonal_relaxed")
    return stacked.select([*first, *[c for c in COLUMNS if c in stacked.columns],
                           *[c for c in stacked.columns if c not in first and c not in COLUMNS]])


def _randomness_kind(randomness: Any) -> str | None:
    return None if randomness is None else "fixed" if randomness == "fixed" else "text-dependent"


def read_runs(repo: Path, sweep: Sweep, echo: Callable[[str], None] = print) -> Runs:
    """Export what has no file yet (:func:`export`), then the tables from the evidence files alone; failures of
    this machine's run log mark configs without a file as failed."""
    export(repo, sweep, echo)
    log = read_log(repo, sweep.name)
    failed = {name: o.error for name, o in log.items() if o.status == "failed"}
    return tables(sweep, load_units(repo, sweep), failed)


def run_units(repo: Path, sweep: Sweep, label: str, jobs: list[Job], executor: Executor,
              echo: Callable[[str], None]) -> Progress:
    """:func:`run_jobs` with the sweep's evidence: units with a file count as finished, and each unit that
    finishes gets its file as it lands (a kill between units loses nothing already written)."""
    units = sweep_units(sweep)
    baseline = head_commit(repo)

    def write(job: Job, outcome: Outcome) -> None:
        if outcome.evidence is not None:  # ran in a pack: no experiment, its results came in memory
            write_packed_unit(repo, sweep, units[job.name], outcome.evidence, outcome.packed or {}, baseline,
                              outcome.wall_s, outcome.finished, outcome.ran, outcome.restored)
            return
        sha = finished_experiments(repo, baseline).get(job.name)
        if sha is None:  # the executor said done but left no ref: nothing to keep, the unit runs again
            echo(f"  warning: {job.name} finished without an experiment ref; no evidence written")
            return
        write_unit(repo, sweep, units[job.name], sha, baseline, outcome.wall_s, outcome.finished, outcome.ran,
                   outcome.restored)

    return run_jobs(repo, sweep.name, label, jobs, executor, echo, finished=finished_units(repo, sweep),
                    on_done=write)


def rounds_paths(repo: Path, name: str) -> tuple[Path, Path]:
    """The race's round log: the committed copy (what lasts, and what a resume on any machine reads) and the
    working copy beside the run log."""
    return repo / REPORTS / name / "rounds.parquet", repo / LOG_DIR / name / "rounds.parquet"
