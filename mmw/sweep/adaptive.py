"""The racing sweep on DVC: its units (one configuration on one prompt shard) run through the sweep runner and
the evidence store, the round log (what a resume on any machine replays), and the round lines it prints. The race
itself (rules, bounds, state) is :mod:`mmw.sweep.race`; its settings :mod:`mmw.sweep.schedule`; its costs
:mod:`mmw.sweep.cost`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl

from mmw.errors import SpecError
from mmw.io import write_table
from mmw.selection import PAPER_CONSTRAINTS, Constraints
from mmw.sweep.cost import GPU_STAGED, CostModel
from mmw.sweep.evidence import finite_number
from mmw.sweep.race import IN, REASONS, Race
from mmw.sweep.race_bounds import Bounds, race_bounds, tuning_arrays
from mmw.sweep.definition import Sweep
from mmw.sweep.runner import Executor, Job, Progress
from mmw.sweep.schedule import Schedule
from mmw.sweep.units import race_name, read_unit, run_units, sweep_units, unit_path


@dataclass(frozen=True)
class RaceUnit:
    """What the race asks for: one configuration on one prompt shard (round ``shard``), ``prompts.offset`` /
    ``prompts.per_task``. The experiment that answers it is a stored :class:`mmw.sweep.units.Unit` (role ``race``)."""

    config_id: str
    shard: int
    offset: int
    per_task: int

    @property
    def key(self) -> str:
        return f"{self.config_id}-r{self.shard}"


class UnitRunner(Protocol):
    """Runs units and reads back their per-prompt rows (:mod:`mmw.sweep.evidence`'s columns).

    ``run`` must skip units already done (a unit never runs twice); ``rows`` returns None for a unit not done."""

    def run(self, units: Sequence[RaceUnit]) -> None: ...

    def rows(self, unit: RaceUnit) -> pl.DataFrame | None: ...


class DvcUnitRunner:
    """:class:`UnitRunner` over a sweep's executor (local or Ray) and its evidence store (:mod:`mmw.sweep.units`):
    a unit is the race unit ``<sweep>-<config_id>-r<round>`` of :func:`mmw.sweep.units.sweep_units` (its
    configuration with ``prompts.offset`` = tuning offset + shard start and ``prompts.per_task`` = shard size, so a
    shard's baseline is shared by every configuration through DVC's run-cache). Units run through the sweep's
    :func:`mmw.sweep.units.run_units`: one with an evidence file (or an experiment ref) is done and never runs again,
    each one that finishes gets its evidence file as it lands, and its rows are read back from that file alone (a
    clone without experiment refs or DVC cache resumes the race)."""

    def __init__(self, repo: Path, sweep: Sweep, executor: Executor, echo: Callable[[str], None] = print) -> None:
        self.repo, self.sweep, self.executor, self.echo = repo, sweep, executor, echo
        self.units = sweep_units(sweep)
        self.progress: list[Progress] = []

    def name(self, unit: RaceUnit) -> str:
        return race_name(self.sweep.name, unit.config_id, unit.shard)

    def job(self, unit: RaceUnit) -> Job:
        stored = self.units[self.name(unit)]
        return Job(name=stored.experiment, config_id=stored.config_id, overrides=dict(stored.overrides))

    def run(self, units: Sequence[RaceUnit]) -> None:
        label = f"{self.sweep.name}: round {units[0].shard + 1}" if units else self.sweep.name
        self.progress.append(run_units(self.repo, self.sweep, label, [self.job(u) for u in units], self.executor,
                                       self.echo))

    def rows(self, unit: RaceUnit) -> pl.DataFrame | None:
        path = unit_path(self.repo, self.sweep.name, self.units[self.name(unit)])
        if not path.is_file():
            return None
        stored = read_unit(path)
        return stored.rows if stored.meta.get("has_rows") else None


LOG_SCHEMA = {"round": pl.Int64, "group": pl.String, "config_id": pl.String, "prompts_per_task": pl.Int64,
              "decision": pl.String, "reason": pl.String, "quality": pl.Float64, "quality_low": pl.Float64,
              "quality_high": pl.Float64, "resistance": pl.Float64, "resistance_low": pl.Float64,
              "resistance_high": pl.Float64, "size": pl.Float64, "size_low": pl.Float64, "size_high": pl.Float64,
              "cells_stopped": pl.String, "cells_left": pl.String, "schedule": pl.String}


def schedule_fingerprint(schedule: Schedule, groups: Mapping[str, Sequence[str]],
                         constraints: Sequence[Constraints]) -> str:
    """What a round log was made under: a resume under another schedule, grid or constraints is refused."""
    blob = json.dumps({"shards": schedule.shards, "level": schedule.level, "budget_s": schedule.budget_s,
                       "keep": schedule.keep, "groups": {k: list(v) for k, v in sorted(groups.items())},
                       "constraints": [[c.max_quality_loss, c.min_tamper_resistance] for c in constraints],
                       **({"rule": schedule.rule} if schedule.rule != "union" else {})})
    return hashlib.blake2b(blob.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class AdaptiveOutcome:
    """``candidates``: per group, per constraint ``(loss, min R)``, the config ids for confirmation (best first);
    ``log``: the round log (:data:`LOG_SCHEMA`); ``cost_s``: the units' seconds under the cost model."""

    candidates: dict[str, dict[tuple[float, float], list[str]]]
    log: pl.DataFrame
    cost_s: float


def _observe(runner: UnitRunner, schedule: Schedule, ids: Sequence[str], r: int, attacks: Sequence[str] | None,
             size_column: str) -> Bounds:
    """Bounds of every configuration of a group on all its shards up to ``r`` (NaN where none is stored).
    ``attacks``: the attacks counted in R (None: those the group's rows hold, ``in_R``)."""
    pooled = {}
    for cid in ids:
        frames = [f for f in (runner.rows(RaceUnit(cid, s, *schedule.shard(s))) for s in range(r + 1)) if f is not None]
        if frames:
            pooled[cid] = pl.concat(frames, how="diagonal_relaxed")
    if attacks is None:
        attacks = sorted({a for rows in pooled.values() if "in_R" in rows.columns for a in rows.filter(
            (pl.col("source") == "attack") & pl.col("in_R").fill_null(False))["attack"].to_list()})
    alpha = schedule.alpha(len(ids), len(attacks))
    if size_column != "size_valid" and not any(
            size_column in rows.columns and rows[size_column].drop_nulls().len() for rows in pooled.values()):
        size_column = "size_valid"  # the runs do not write it: the table ranks by the valid size then too
    picked = [race_bounds(tuning_arrays(pooled[cid], attacks, size_column), alpha) if cid in pooled
              else Bounds(*[np.full(1, np.nan)] * 9, prompts=np.zeros(1, int)) for cid in ids]
    return Bounds(**{f: np.concatenate([getattr(b, f) for b in picked]) for f in Bounds.__dataclass_fields__})


def _log_rows(r: int, label: str, ids: Sequence[str], state: Race, fingerprint: str) -> pl.DataFrame:
    """Round ``r``'s decisions of one group: one row per configuration that ran it; ``cells_stopped`` names the
    group's cells that stopped at this round (futile: the planner's rule; budget: their share is spent)."""
    rows = []
    bounds = state.bounds
    assert bounds is not None
    stopped = "; ".join(f"{_cell(c)}: {'futile' if state.futile[i] else 'budget'}"
                        for i, c in enumerate(state.constraints) if state.stopped[i] == r) or None
    for j, cid in enumerate(ids):
        if not state.running[j]:
            continue
        out = [f"{_cell(c)}: {REASONS[state.codes[i, j]]}" for i, c in enumerate(state.constraints)
               if state.left_at[i, j] == r]
        left = [[c.max_quality_loss, c.min_tamper_resistance, REASONS[state.codes[i, j]]]
                for i, c in enumerate(state.constraints) if state.left_at[i, j] == r]
        dropped = bool((state.codes[:, j] != IN).all()) and bool((state.left_at[:, j] == r).any())
        rows.append({"round": r, "group": label, "config_id": cid, "prompts_per_task": state.schedule.shards[r],
                     "decision": "dropped" if dropped else "kept", "reason": "; ".join(out) or None,
                     "cells_stopped": stopped, "cells_left": json.dumps(left) if left else None,
                     "schedule": fingerprint, **{f: finite_number(getattr(bounds, f)[j]) for f in LOG_SCHEMA
                                                 if f.startswith(("quality", "resistance", "size"))}})
    return pl.DataFrame(rows, schema=LOG_SCHEMA)


def run_adaptive(groups: Mapping[str, Sequence[str]], schedule: Schedule, runner: UnitRunner, log_path: Path,
                 tasks: int, attacks: Sequence[str] | None, cost: CostModel = GPU_STAGED,
                 constraints: Sequence[Constraints] | None = None,
                 size_column: str | Mapping[str, str] = "size_valid", copies: Sequence[Path] = (),
                 echo: Callable[[str], None] | None = None) -> AdaptiveOutcome:
    """Race every group (``label -> config ids``, e.g. ``"T=0.7 distribution_shift"``) through ``schedule`` with
    ``runner`` and return each cell's confirmation candidates (confirm them with :mod:`mmw.sweep.confirm`).

    Round by round over all groups: the round's units (every group's survivors) go to the runner as one batch of
    independent jobs, then each group's elimination runs and the round log (:data:`LOG_SCHEMA`) is rewritten
    atomically to ``log_path`` (Parquet) and to each of ``copies``; ``echo`` gets one line per round (how many
    configurations ran, were dropped and why, which cells stopped). ``size_column``: the per-prompt size the race
    ranks by, one for all groups or per group label. After a kill, a call resumes: logged rounds are replayed from
    the units' stored rows (the runner skips units already done, so no finished unit runs again) and the race goes
    on."""
    constraints = list(constraints or [Constraints(loss, r) for loss, r in PAPER_CONSTRAINTS])
    fingerprint = schedule_fingerprint(schedule, groups, constraints)
    previous = pl.read_parquet(log_path) if Path(log_path).is_file() else pl.DataFrame(schema=LOG_SCHEMA)
    if previous.height and set(previous["schedule"].unique().to_list()) != {fingerprint}:
        raise SpecError("adaptive", f"{log_path} was written by another schedule, grid or constraints",
                        "the same sweep definition, or remove the round log to start over")
    logged_rounds = set(previous["round"].unique().to_list())
    n_cells = len(groups) * len(constraints)
    budget_cell = math.inf if schedule.budget_s is None else schedule.budget_s / n_cells

    def unit_cost(r: int) -> float:
        return float(cost.unit(schedule.shard(r)[1] * tasks))

    states = {label: Race((len(ids),), schedule, constraints, unit_cost, budget_cell) for label, ids in groups.items()}
    frames = [previous]
    for r in range(schedule.rounds):
        running = {label: state.plan(r) for label, state in states.items()}
        units = [RaceUnit(cid, r, *schedule.shard(r)) for label, ids in groups.items()
                 for cid, on in zip(ids, running[label], strict=True) if on]
        if not units:
            break
        runner.run(units)
        for label, ids in groups.items():
            if running[label].any():
                column = size_column if isinstance(size_column, str) else size_column[label]
                states[label].update(r, _observe(runner, schedule, ids, r, attacks, column))
        fresh = pl.concat([_log_rows(r, label, ids, states[label], fingerprint) for label, ids in groups.items()])
        if r not in logged_rounds:
            frames.append(fresh)
            log = pl.concat(frames).sort(["round", "group", "config_id"])
            for path in (log_path, *copies):
                write_table(log, path)
        if echo is not None:
            echo(round_line(fresh, schedule, r, replayed=r in logged_rounds))
    candidates = {}
    for label, ids in groups.items():
        result = states[label].result()
        candidates[label] = {(c.max_quality_loss, c.min_tamper_resistance):
                             [ids[i] for i in result.candidates[k] if i >= 0] for k, c in enumerate(constraints)}
    cost_s = float(sum(state.cost for state in states.values()))
    return AdaptiveOutcome(candidates, pl.concat(frames).sort(["round", "group", "config_id"]), cost_s)


def round_line(rows: pl.DataFrame, schedule: Schedule, r: int, replayed: bool = False) -> str:
    """One round's decisions in a line: configurations that ran, dropped (by reason), still running, cells
    stopped."""
    dropped = rows.filter(pl.col("decision") == "dropped")
    reasons: dict[str, int] = {}
    for text in dropped["reason"].drop_nulls().to_list():
        for why in sorted({part.split(": ", 1)[1] for part in text.split("; ")}):
            reasons[why] = reasons.get(why, 0) + 1
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
    stopped = [f"{group} ({text})" for group, text in rows.select("group", "cells_stopped").unique()
               .drop_nulls().sort("group").iter_rows()]
    start, size = schedule.shard(r)
    return (f"  round {r + 1}/{schedule.rounds}{' (replayed from evidence)' if replayed else ''}: prompts "
            f"[{start}, {start + size}) per task, {rows.height} configuration(s) ran; dropped {dropped.height}"
            + (f" ({why})" if why else "") + f", {rows.height - dropped.height} go on"
            + (f"; cells stopped: {'; '.join(stopped)}" if stopped else ""))


def _cell(constraint: Constraints) -> str:
    r = constraint.min_tamper_resistance
    return f"{constraint.max_quality_loss:.0%} q" + (f", R>{r:g}" if r else "")


def cells_left(log: pl.DataFrame) -> dict[str, set[tuple[float, float]]]:
    """Config id -> the cells ``(quality loss, min R)`` the race took it out of (the round log's ``cells_left``):
    its confirmation ranks only the configurations still contending in each cell."""
    out: dict[str, set[tuple[float, float]]] = {}
    for config, text in log.select("config_id", "cells_left").drop_nulls().iter_rows():
        out.setdefault(config, set()).update((float(loss), float(r)) for loss, r, _ in json.loads(text))
    return out
