"""``mmw sweep``: run, collect, export and plan the sweeps of sweeps/<name>.yaml (docs/SWEEP.md).

``mmw.cli`` loads this module only when ``mmw sweep`` runs (or ``mmw --help`` lists it), so that the pipeline
stages, which run through ``mmw.cli``, do not depend on the sweep's command line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import click
import polars as pl
import typer
import yaml
from typer.core import TyperGroup

from mmw.errors import SpecError
from mmw.reporting.page import build_report
from mmw.sweep import load_sweep, run_sweep
from mmw.sweep.cost import cost_for_pack, packed_units
from mmw.sweep.schedule import dry_run_lines
from mmw.sweep.collect import collect
from mmw.sweep.definition import Sweep, apply_overrides
from mmw.sweep.pack import check_pack
from mmw.sweep.plan import check_confirmation, pilot_plan, sweep_plan
from mmw.sweep.tables import plan_markdown
from mmw.sweep.ray_executor import RayExecutor
from mmw.sweep.units import export, load_units, runs_dir


class _SweepVerbs(TyperGroup):
    """``mmw sweep``'s verbs. A word that is not a verb (``mmw sweep small``) is refused in one line that shows
    the command meant, instead of Click's usage block."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            typer.echo(f"error: sweep: {args[0]!r} is not a verb of `mmw sweep` (allowed: "
                       f"{', '.join(self.list_commands(ctx))}); to run that sweep: mmw sweep run {args[0]}", err=True)
            raise typer.Exit(2)
        return super().resolve_command(ctx, args)


sweep_app = typer.Typer(cls=_SweepVerbs, no_args_is_help=True, help=(
    "Sweeps of sweeps/<name>.yaml as DVC experiments: run, collect, export, plan (docs/SWEEP.md)."))
#: What ``mmw.cli`` loads: an app whose one entry is the ``sweep`` group.
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.add_typer(sweep_app, name="sweep")

SweepName = Annotated[str, typer.Argument(metavar="NAME", help="the sweep: sweeps/NAME.yaml")]
RepoOption = Annotated[Path, typer.Option(help="the repository (its params.yaml, sweeps/ and experiments)")]
OutOption = Annotated[Path, typer.Option(help="where the collected reports/sweeps/NAME/ is")]
ScaleOption = Annotated[str | None, typer.Option(help="the scale shown beside the table (default: from the "
                                                      "sweep's base)")]
TimingsOption = Annotated[bool, typer.Option(help="collect per-stage wall times (slow)")]


def _load_sweep(repo: Path, name: str, validate: bool = True) -> Sweep:
    """The expanded sweep and its counts on stdout; exit 2 with one line on an unknown or invalid one."""
    try:
        # Collecting and planning read what ran: today's params validation is not a condition for that.
        definition = load_sweep(repo, name, validate=validate)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    grids: dict[str, int] = {}
    for config in definition.configs:
        grids[config.grid] = grids.get(config.grid, 0) + 1
    typer.echo(f"sweep {name}: {len(definition.configs)} configs ("
               + ", ".join(f"{g} {n}" for g, n in grids.items()) + f"); re-evaluation k={definition.reevaluate.k}")
    confirmation = definition.confirmation
    if confirmation is not None and definition.tuning is not None:
        start, end = definition.tuning_offset, definition.tuning_offset + definition.tuning
        typer.echo(f"  tuning prompts [{start}, {end}) per task; confirmation [{confirmation.offset}, "
                   f"{confirmation.offset + confirmation.prompts}) per task, level {confirmation.level:g} per cell "
                   f"over at most {confirmation.max_tries} tries")
        for extension in confirmation.extend:
            shown = "; ".join(f"T = {c.temperature:g} {c.family} (R > {'/'.join(f'{r:g}' for r in c.min_r)}): "
                              f"{c.prompts} per task, K = {c.k}" for c in extension.cells)
            typer.echo(f"  {extension.name}: fresh prompts from {extension.offset} per task, seeds from "
                       f"{extension.first_seed}, level {extension.level:g} per cell; {shown}")
        if confirmation.extend:
            typer.echo(f"  a cell judged in every round errs with probability at most {confirmation.total_level:.4g} "
                       "(the union bound over its tries)")
    return definition


@sweep_app.command("run")
def sweep_run(
    name: SweepName,
    repo: RepoOption = Path("."),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="expand and validate, print the counts, run nothing")]
    = False,
    configs: Annotated[bool, typer.Option(help="run the configs not done yet (--no-configs: only confirm / "
                                               "re-evaluate)")] = True,
    reevaluate: Annotated[bool, typer.Option(help="then confirm / re-evaluate the picks with the definition's K "
                                                  "seeds")] = True,
    scale: ScaleOption = None,
    timings: TimingsOption = True,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS",
        help="run the configs as Ray tasks on the cluster at ADDRESS (`auto`: the one `ray start` made here, "
             "`ray://HEAD:10001`: a remote one); see docs/RAY.md")] = None,
    task_timeout: Annotated[float | None, typer.Option(
        "--task-timeout", metavar="SECONDS", help="with --ray: a config's wall-time limit on its worker; past it "
        "the config is killed and recorded as failed (timed out)")] = None,
    timeout_retries: Annotated[int, typer.Option(
        help="with --ray: how often a timed-out config is submitted again before it stays failed")] = 1,
    uniform: Annotated[bool, typer.Option("--uniform", help="an adaptive sweep as the plain grid (every config on "
                                          "every tuning prompt), collected into reports/sweeps/NAME/uniform/ for "
                                          "comparison")] = False,
    pack: Annotated[int | None, typer.Option(
        "--pack", metavar="N", help="configurations per unit (default: the definition's `pack`, else 1 = one DVC "
        "experiment each): up to N configurations that share a baseline run in one process that loads the models "
        "once; 0 = all that share one")] = None,
) -> None:
    """Run a sweep (configs, then confirmation runs), collect it and write the report.

    Runs the configs not done yet as DVC experiments (failed and missing ones are retried; with an `adaptive`
    section, as a race over rounds of prompt shards, dropping what is confidently out), then the
    confirmation (or re-evaluation) runs of the picks, then collects it into reports/sweeps/NAME/ and writes
    reports/index.html. Progress, failures and an ETA are printed after every run; an interrupted run resumes
    without repeating a finished experiment.

    Exit code 2 on an unknown sweep or an invalid entry (before anything runs), 1 when some config failed.
    """
    definition = _load_sweep(repo, name)
    if pack is not None:
        try:
            definition = dataclasses.replace(definition, pack=check_pack(pack, "--pack"))
            if definition.schedule is not None:  # the budget must still pay for round 1, priced with this pack
                definition.schedule.check(definition.tuning, definition.baselines(), definition.tasks,
                                          cost_for_pack(definition.pack),
                                          max_tries=definition.confirmation.max_tries)
        except SpecError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
    if uniform and definition.schedule is None:
        typer.echo(f"error: --uniform: sweep {name} has no adaptive section (it runs as the grid already); "
                   "allowed: --uniform only with an adaptive definition", err=True)
        raise typer.Exit(2)
    if uniform:
        definition = dataclasses.replace(definition, uniform=True)
    elif definition.schedule is not None:
        for line in dry_run_lines(definition.schedule, definition.baselines(), definition.tuning,
                                  definition.tasks, cost_for_pack(definition.pack)):
            typer.echo(line)
    if definition.pack != 1:
        typer.echo(f"  packed: {definition.pack or 'every configuration that shares a baseline'} to a unit (the "
                   f"baseline run once, the models loaded once): {len(definition.configs)} configurations in "
                   f"{packed_units(definition.baselines(), definition.pack)} units")
    if dry_run:
        return
    try:
        executor = None
        if task_timeout is not None and ray is None:
            raise SpecError("--task-timeout", "only applies to Ray tasks", "--ray ADDRESS --task-timeout SECONDS")
        if ray is not None:
            executor = RayExecutor(repo, address=ray, echo=typer.echo, task_timeout_s=task_timeout,
                                   timeout_retries=timeout_retries, pack=definition.pack)
        pool, reruns = run_sweep(repo, definition, executor=executor, configs=configs, reevaluate=reevaluate,
                                 echo=typer.echo)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if reevaluate:  # the sweep has its answer (or all of it there is): write its tables and the report
        if uniform:  # beside the race's tables; the page stays the race's
            _collect_sweep(repo, definition, repo / "reports" / "sweeps" / name / "uniform", scale, timings)
            typer.echo(f"wrote {repo / 'reports' / 'sweeps' / name / 'uniform'}/")
        else:
            _collect_sweep(repo, definition, repo / "reports" / "sweeps" / name, scale, timings)
            info = build_report(repo, name, repo / "reports" / "index.html", repo / "params.yaml")
            typer.echo(f"wrote {repo / 'reports' / 'sweeps' / name}/ and {info.path}")
    if any(p is not None and p.failed for p in (pool, reruns)):
        raise typer.Exit(1)


@sweep_app.command("collect")
def sweep_collect(name: SweepName, repo: RepoOption = Path("."), out: OutOption = Path("reports/sweeps"),
                  scale: ScaleOption = None, timings: TimingsOption = True,
                  uniform: Annotated[bool, typer.Option("--uniform", help="an adaptive sweep's plain-grid runs "
                                                        "(`mmw sweep run --uniform`), into OUT/NAME/uniform/")]
                  = False) -> None:
    """Collect a sweep's experiments into tables: OUT/NAME/ (table.md and Parquet files).

    Results, attacks, re-evaluations, the paper's table (with `confirm`: the confirmed table, per-prompt rows,
    tries, split and plan), randomness and delta tables (with `adaptive`: the race's round log, rounds and cost);
    readable without the DVC cache."""
    definition = _load_sweep(repo, name, validate=False)
    if uniform:
        definition = dataclasses.replace(definition, uniform=True)
    _collect_sweep(repo, definition, out / name / "uniform" if uniform else out / name, scale, timings)


@sweep_app.command("export")
def sweep_export(name: SweepName, repo: RepoOption = Path(".")) -> None:
    """Write the evidence file of every finished experiment of a sweep that has none yet.

    reports/sweeps/NAME/runs/<unit>.parquet, one per unit (per-prompt rows, params, metrics, wall times; never the
    key or the texts), from the experiment refs of any commit in this repository. Commit that directory and the
    sweep continues on any machine: `mmw sweep run NAME` skips the units it holds, `mmw sweep collect NAME` reads
    them. `mmw sweep run` writes them as each unit lands and `mmw sweep collect` exports first, so this is only
    needed for a sweep started by an older version. Exit 2 on evidence of another definition, generator or judge."""
    definition = _load_sweep(repo, name, validate=False)
    try:
        written = export(repo, definition, typer.echo)
        stored = load_units(repo, definition)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{runs_dir(repo, name)}: {len(stored)} unit(s), {len(written)} written now")


@sweep_app.command("plan")
def sweep_plan_command(
    name: SweepName, repo: RepoOption = Path("."), out: OutOption = Path("reports/sweeps"),
    level: Annotated[float | None, typer.Option(help="for a sweep without `confirm` (a pilot): the per-cell error "
                                                     "level to plan for (default 0.05)")] = None,
    max_tries: Annotated[int | None, typer.Option(help="for a pilot: the tries per cell the level is split over "
                                                       "(default 2)")] = None,
    prompts: Annotated[int | None, typer.Option(help="check a confirmation of this many prompts per task: every "
                                                     "task must hold them (exit 2 naming the task otherwise)")] = None,
    margin: Annotated[float | None, typer.Option(help="with --prompts: the margin in rating points (0-100) to "
                                                      "confirm; exit 2 below its distribution-free floor")] = None,
) -> None:
    """Print the prompts and the time each unresolved cell of a collected sweep needs.

    A sweep with `confirm` is planned from its confirmation runs' per-prompt spread; one without (its picks re-run
    on their tuning prompts) as a pilot, from the spread of each pick's re-runs. Exit 2 when the sweep has not been
    collected yet."""
    definition = _load_sweep(repo, name, validate=False)
    if prompts is not None:
        alpha = definition.confirmation.per_try if definition.confirmation else (level or 0.05) / (max_tries or 2)
        try:
            check_confirmation(definition, repo, prompts, margin, alpha)
        except SpecError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
    _plan_sweep(definition, out / name, level, max_tries)


def _plan_sweep(definition: Sweep, dest: Path, level: float | None, max_tries: int | None) -> None:
    """Print the prompts and time each unresolved cell of a collected sweep needs (exit 2 without one); a sweep
    without a confirm section is planned as a pilot."""
    confirmation = definition.confirmation
    try:
        if confirmation is not None and (level is not None or max_tries is not None):
            raise SpecError("--level" if level is not None else "--max-tries", f"sweep {definition.name} sets it in "
                            "its confirm section", "leave it out (it applies to a sweep without confirm)")
        missing = [f for f in ("table", "results", "reevaluations") if not (dest / f"{f}.parquet").is_file()]
        if missing:
            raise SpecError("sweep", f"{dest} has no {', '.join(missing)}.parquet",
                            f"mmw sweep collect {definition.name} first")
        table, results, reevaluations = (pl.read_parquet(dest / f"{f}.parquet")
                                         for f in ("table", "results", "reevaluations"))
        if confirmation is not None and ("status" not in table.columns or "n_prompts" not in table.columns):
            raise SpecError("sweep", f"{dest}/table.parquet was collected without confirmation",
                            f"mmw sweep collect {definition.name} again")
        if confirmation is None and "config_id" not in table.columns:
            raise SpecError("sweep", f"{dest}/table.parquet has no picks", f"mmw sweep collect {definition.name} again")
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if confirmation is not None and definition.tuning is not None:
        randomness = dest / "randomness.parquet"
        plan = sweep_plan(table, results, reevaluations, confirmation, definition.tuning, definition.reevaluate.k,
                          pl.read_parquet(randomness) if randomness.is_file() else None)
        typer.echo(plan_markdown(plan, confirmation.level, definition.reevaluate.k))
        return
    level, max_tries = 0.05 if level is None else level, max_tries or 2
    plan = pilot_plan(table, results, reevaluations, level, max_tries, definition.reevaluate.k)
    typer.echo(f"pilot: sweep {definition.name} has no confirm section; every picked cell is planned from the spread "
               f"of its pick's re-runs on the tuning prompts (same prompts every run: the prompt counts are lower "
               f"bounds), level {level:g} split over {max_tries} tries per cell")
    typer.echo(plan_markdown(plan, level, definition.reevaluate.k))


def _collect_sweep(repo: Path, definition: Sweep, dest: Path, scale: str | None, timings: bool) -> None:
    """Write a sweep's tables to ``dest`` (reports/sweeps/<name>/) and say what they hold."""
    try:
        collected = collect(repo, definition, dest, scale or _scale_of(definition, repo), with_timings=timings,
                            echo=typer.echo)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    counts = collected.results["status"].value_counts().sort("status").iter_rows()
    typer.echo(f"collected {dest}: " + ", ".join(f"{s} {n}" for s, n in counts)
               + f"; {collected.reevaluations.height} re-evaluation runs")


def _scale_of(definition: Sweep, repo: Path) -> str:
    """``<prompts per task> prompts/task x <tokens> tokens, <model>, judge <judge>`` of a sweep's first config: its
    overrides, else the repository's params.yaml (what the table states)."""
    params = repo / "params.yaml"
    board = yaml.safe_load(params.read_text()) if params.is_file() else {}
    try:
        merged = apply_overrides(board, definition.configs[0].overrides if definition.configs else {})
    except (KeyError, TypeError):  # a sweep collected against a params.yaml that has changed since
        merged = board

    def get(dotted: str) -> Any:
        value: Any = merged
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "?" if value is None else value

    return (f"{get('prompts.per_task')} prompts/task x {get('model.max_new_tokens')} tokens, {get('model.name')}, "
            f"judge {get('rate.judge')}")
