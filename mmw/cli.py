"""The ``mmw`` command line: one command per pipeline stage (see dvc.yaml), implemented in ``mmw.stages``.

Heavy imports (torch, transformers, the attacks) happen inside the commands, so ``mmw --help`` stays fast.
A ``SpecError`` (bad parameter) ends the command with its one-line message and exit code 2.

A stage run as its own process (the ``mmw`` script or ``python -m mmw``, as ``dvc repro`` runs it) ends the process
as soon as its outputs are written and its exit handlers (``atexit``) have run: every output is already in place
(written atomically), and tearing down an interpreter that holds torch, transformers and a model took 1.8 s on
the 2-core CPU and 2-6 s a stage on an H100 (module finalisation, freeing the weights and the CUDA caches one
object at a time), for nothing.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from mmw.errors import SpecError

app = typer.Typer(help="MarkMyWords watermark benchmark: pipeline stages (run them through `dvc repro`).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="params file to read")]


class Which(StrEnum):
    """Which generations a stage works on."""

    baseline = "baseline"
    watermarked = "watermarked"


#: True when this interpreter runs one ``mmw`` command and ends with it (:func:`main`); false when the app is called
#: inside another program (tests' ``CliRunner``), which must go on after the command.
_OWN_PROCESS = False


def _stage(module: str, *args: Any) -> None:
    """Run ``mmw.stages.<module>.run(*args)``, turning a SpecError into a one-line error and exit code 2; in its own
    process, a stage that succeeded ends the process at once (module docstring)."""
    try:
        importlib.import_module(f"mmw.stages.{module}").run(*args)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if _OWN_PROCESS:
        atexit._run_exitfuncs()  # what was registered to run at exit still runs (logging's flush, tracers, ...)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def main() -> None:
    """The ``mmw`` script and ``python -m mmw``: the app, in a process of its own."""
    global _OWN_PROCESS
    _OWN_PROCESS = True
    app(prog_name="mmw")


@app.command()
def key(params: ParamsOption = Path("params.yaml")) -> None:
    """Validate the params and write data/key.fingerprint (a one-way tag of the key; the key is never written)."""
    _stage("key", params)


@app.command()
def prompts(params: ParamsOption = Path("params.yaml")) -> None:
    """Build data/prompts.parquet from the task data and the generator's chat template."""
    _stage("prompts", params)


@app.command()
def generate(which: Which, params: ParamsOption = Path("params.yaml")) -> None:
    """Generate the baseline (no watermark) or the watermarked texts: data/generations/<which>.parquet."""
    _stage("generate", which.value, params)


@app.command()
def perturb(params: ParamsOption = Path("params.yaml")) -> None:
    """Attack the first part of each task's watermarked texts: data/perturbed.parquet."""
    _stage("perturb", params)


@app.command()
def detect(which: Which, params: ParamsOption = Path("params.yaml")) -> None:
    """Detect the watermark in the baseline, or in the watermarked and attacked texts."""
    _stage("detect", which.value, params)


@app.command()
def rate(which: Which, params: ParamsOption = Path("params.yaml")) -> None:
    """Judge ratings of the baseline (plus the judge's discrimination check), or of watermarked + attacked texts."""
    _stage("rate", which.value, params)


@app.command()
def aggregate(params: ParamsOption = Path("params.yaml")) -> None:
    """Compute the metrics and write reports/ (metrics.json, summary.md, plots)."""
    _stage("aggregate", params)


@app.command("low-entropy-inputs")
def low_entropy_inputs(params: ParamsOption = Path("params.yaml")) -> None:
    """Generate the low-entropy tasks' inputs (T = 1 book reports): data/low_entropy/inputs.parquet."""
    _stage("low_entropy", params)


@app.command()
def quality(params: ParamsOption = Path("params.yaml")) -> None:
    """Secondary quality (pass@1/accuracy, repetition, perplexity, MAUVE): reports/quality.json."""
    _stage("quality", params)


@app.command()
def timings() -> None:
    """Print the last wall time of each stage run in this workspace (reports/timings/, a log, not a DVC output)."""
    from mmw.reporting.run import timings_markdown

    typer.echo(timings_markdown())


@app.command("install-argos")
def install_argos(path: Annotated[Path, typer.Argument(help="an .argosmodel file")]) -> None:
    """Install an Argos Translate language package from a local file (no network needed)."""
    from mmw.attacks.translation import install_argos_package

    try:
        pair = install_argos_package(path)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"installed {pair} from {path}")


@app.command("select")
def select_watermark(
    max_quality_loss: Annotated[float, typer.Option(help="largest accepted quality loss, 1 - relative quality "
                                                         "(paper: 0.01)")] = 0.01,
    min_tamper_resistance: Annotated[float, typer.Option(help="smallest accepted tamper resistance R "
                                                              "(paper: 0.2)")] = 0.2,
    max_fpr: Annotated[float | None, typer.Option(help="largest accepted upper 95% CI of the empirical "
                                                       "false-positive rate (default: not checked)")] = None,
    group: Annotated[str | None, typer.Option(help="the comparable group to select in, when the experiments "
                                                   "form several (the error lists them)")] = None,
    k: Annotated[int, typer.Option(help="re-evaluation runs to suggest for the pick (fresh seeds and keys)")] = 5,
    out: Annotated[Path, typer.Option(help="Markdown report; the plot goes next to it (.png)")] = Path(
        "reports/selection.md"),
) -> None:
    """Pick the watermark to deploy among this repository's DVC experiments (the paper's aggregate metric).

    Only comparable experiments compete (same model, token budget, prompts, seed, attacks, alpha, judge,
    detector; otherwise exit 2 naming the groups); re-evaluation runs (named reeval-*) never do. Picks the
    smallest size within the quality-loss and tamper-resistance targets, overall and per temperature x scheme
    family, writes a report, and prints the `dvc exp run` commands that re-evaluate the pick with K fresh seeds.
    Exit code 1 when no setting is feasible, 2 on bad options or when there is nothing to select from.
    """
    import polars as pl

    from mmw.io import write_text, write_with
    from mmw.selection import (
        Constraints,
        cell_picks,
        fresh_seed,
        is_reevaluation,
        read_experiments,
        rerun_command,
        select,
        single_group,
        with_group,
    )
    from mmw.reporting.selection import cells_markdown, selection_figure, selection_markdown

    try:
        constraints = Constraints(max_quality_loss, min_tamper_resistance, max_fpr)
        if k < 1:
            raise SpecError("--k", f"{k} re-evaluation runs", "an integer >= 1 (the paper: 5)")
        experiments = read_experiments(Path.cwd(), pool_filter=lambda name: not is_reevaluation(name))
        # Rows without metrics (queued, running, failed, uncommitted) cannot compete and do not form groups.
        measured = experiments.table.filter(pl.col("all.size").is_not_null() | pl.col("all.relative_quality")
                                            .is_not_null())
        pool = single_group(with_group(measured if measured.height else experiments.table), group)
        selection = select(pool, constraints)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    pick = selection.pick
    seed = fresh_seed(experiments.table)
    reruns = [rerun_command(experiments, pick["rev"], seed + i, name=pick["name"]) for i in range(k)] if pick else []
    figure = selection_figure(selection)
    write_text(selection_markdown(selection, reruns[0] if reruns else None)
               + cells_markdown(cell_picks(pool, [constraints])), out)
    plot = out.with_suffix(".png")
    write_with(plot, lambda path: figure.savefig(path, format="png", dpi=120))
    typer.echo(f"{selection.feasible.height} of {selection.table.height} settings feasible; report: {out}, "
               f"plot: {plot}")
    if pick is None:
        typer.echo("no feasible setting: relax the constraints or evaluate more settings", err=True)
        raise typer.Exit(1)
    typer.echo(f"pick: {pick['name']} (rev {pick['rev'][:7]}): size {pick['all.size']:g} tokens, relative quality "
               f"{pick['all.relative_quality']:.4g}, R {pick['all.tamper_resistance']:.4g}")
    typer.echo(f"re-evaluate it with {k} fresh seeds, each with a fresh secret key in MMW_KEY (never written); the "
               "reeval- names keep these runs out of later selections:")
    for rerun in reruns:
        command = rerun.command if rerun.exact else rerun.fallback
        typer.echo("  " + command.replace("dvc exp run", "MMW_KEY=$(openssl rand -hex 16) dvc exp run", 1))


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
app.add_typer(sweep_app, name="sweep")

SweepName = Annotated[str, typer.Argument(metavar="NAME", help="the sweep: sweeps/NAME.yaml")]
RepoOption = Annotated[Path, typer.Option(help="the repository (its params.yaml, sweeps/ and experiments)")]
OutOption = Annotated[Path, typer.Option(help="where the collected reports/sweeps/NAME/ is")]
ScaleOption = Annotated[str | None, typer.Option(help="the scale shown beside the table (default: from the "
                                                      "sweep's base)")]
TimingsOption = Annotated[bool, typer.Option(help="collect per-stage wall times (slow)")]


def _load_sweep(repo: Path, name: str, validate: bool = True) -> Any:
    """The expanded sweep and its counts on stdout; exit 2 with one line on an unknown or invalid one."""
    from mmw.sweep import load_sweep

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
    if definition.split is not None:
        split = definition.split
        typer.echo(f"  tuning prompts [{split.tuning_offset}, {split.tuning_offset + split.tuning}) per task; "
                   f"confirmation [{split.offset}, {split.offset + split.prompts}) per task, level {split.level:g} "
                   f"per cell over at most {split.max_tries} tries")
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
    import dataclasses

    from mmw.sweep import run_sweep

    definition = _load_sweep(repo, name)
    if pack is not None:
        from mmw.sweep.pack import check_pack

        try:
            definition = dataclasses.replace(definition, pack=check_pack(pack, "--pack"))
            if definition.schedule is not None:  # the budget must still pay for round 1, priced with this pack
                from mmw.sweep.adaptive import cost_for_pack

                definition.schedule.check(definition.split.tuning, definition.baselines(), definition.tasks,
                                          cost_for_pack(definition.pack),
                                          max_tries=definition.split.max_tries)
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
        from mmw.sweep.adaptive import cost_for_pack, dry_run_lines

        for line in dry_run_lines(definition.schedule, definition.baselines(), definition.split.tuning,
                                  definition.tasks, cost_for_pack(definition.pack)):
            typer.echo(line)
    if definition.pack != 1:
        from mmw.sweep.adaptive import packed_units

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
            from mmw.sweep.ray_executor import RayExecutor

            executor = RayExecutor(repo, address=ray, echo=typer.echo, task_timeout_s=task_timeout,
                                   timeout_retries=timeout_retries, pack=definition.pack)
        pool, reruns = run_sweep(repo, definition, executor=executor, configs=configs, reevaluate=reevaluate,
                                 echo=typer.echo)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if reevaluate:  # the sweep has its answer (or all of it there is): write its tables and the report
        from mmw.reporting.page import build_report

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
    import dataclasses

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
    from mmw.sweep.units import export, load_units, runs_dir

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
) -> None:
    """Print the prompts and the time each unresolved cell of a collected sweep needs.

    A sweep with `confirm` is planned from its confirmation runs' per-prompt spread; one without (its picks re-run
    on their tuning prompts) as a pilot, from the spread of each pick's re-runs. Exit 2 when the sweep has not been
    collected yet."""
    definition = _load_sweep(repo, name, validate=False)
    _plan_sweep(definition, out / name, level, max_tries)


def _plan_sweep(definition: Any, dest: Path, level: float | None, max_tries: int | None) -> None:
    """Print the prompts and time each unresolved cell of a collected sweep needs (exit 2 without one); a sweep
    without a confirm section is planned as a pilot."""
    import polars as pl

    from mmw.sweep.confirm import ConfirmSettings
    from mmw.reporting.sweep import plan_markdown
    from mmw.sweep.plan import pilot_plan, sweep_plan

    split = definition.split
    try:
        if split is not None and (level is not None or max_tries is not None):
            raise SpecError("--level" if level is not None else "--max-tries", f"sweep {definition.name} sets it in "
                            "its confirm section", "leave it out (it applies to a sweep without confirm)")
        settings = ConfirmSettings(level=0.05 if level is None else level, max_tries=max_tries or 2) \
            if split is None else None
        missing = [f for f in ("table", "results", "reevaluations") if not (dest / f"{f}.parquet").is_file()]
        if missing:
            raise SpecError("sweep", f"{dest} has no {', '.join(missing)}.parquet",
                            f"mmw sweep collect {definition.name} first")
        table, results, reevaluations = (pl.read_parquet(dest / f"{f}.parquet")
                                         for f in ("table", "results", "reevaluations"))
        if split is not None and ("status" not in table.columns or "n_prompts" not in table.columns):
            raise SpecError("sweep", f"{dest}/table.parquet was collected without confirmation",
                            f"mmw sweep collect {definition.name} again")
        if split is None and "config_id" not in table.columns:
            raise SpecError("sweep", f"{dest}/table.parquet has no picks", f"mmw sweep collect {definition.name} again")
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if settings is None:
        randomness = dest / "randomness.parquet"
        plan = sweep_plan(table, results, reevaluations, split, definition.reevaluate.k,
                          pl.read_parquet(randomness) if randomness.is_file() else None)
        typer.echo(plan_markdown(plan, split.level, definition.reevaluate.k))
        return
    plan = pilot_plan(table, results, reevaluations, settings.level, settings.max_tries, definition.reevaluate.k)
    typer.echo(f"pilot: sweep {definition.name} has no confirm section; every picked cell is planned from the spread "
               f"of its pick's re-runs on the tuning prompts (same prompts every run: the prompt counts are lower "
               f"bounds), level {settings.level:g} split over {settings.max_tries} tries per cell")
    typer.echo(plan_markdown(plan, settings.level, definition.reevaluate.k))


def _collect_sweep(repo: Path, definition: Any, dest: Path, scale: str | None, timings: bool) -> None:
    """Write a sweep's tables to ``dest`` (reports/sweeps/<name>/) and say what they hold."""
    from mmw.sweep.collect import collect

    try:
        collected = collect(repo, definition, dest, scale or _scale_of(definition, repo), with_timings=timings,
                            echo=typer.echo)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    counts = collected.results["status"].value_counts().sort("status").iter_rows()
    typer.echo(f"collected {dest}: " + ", ".join(f"{s} {n}" for s, n in counts)
               + f"; {collected.reevaluations.height} re-evaluation runs")


def _scale_of(definition: Any, repo: Path) -> str:
    """``<prompts per task> prompts/task x <tokens> tokens, <model>, judge <judge>`` of a sweep's first config: its
    overrides, else the repository's params.yaml (what the table states)."""
    import yaml

    from mmw.sweep.definition import apply_overrides

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


@app.command("verify", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify(ctx: typer.Context) -> None:
    """Compare a re-run with the committed numbers: exact, within uncertainty, or differs (`mmw verify --help`)."""
    from mmw.verify import app as verify_app  # its own module: not a dependency of every stage

    verify_app(ctx.args, prog_name="mmw verify")


@app.command("report")
def report(
    sweep: Annotated[str | None, typer.Option(help="sweep to report (reports/sweeps/NAME); default: the one "
                                                   "collected last, else the single run in reports/metrics.json")]
    = None,
    out: Annotated[Path, typer.Option(help="the page to write")] = Path("reports/index.html"),
    params: ParamsOption = Path("params.yaml"),
) -> None:
    """Write reports/index.html: one self-contained page (no network needed) with the paper's table, figures,
    attacks, false positives, judge and provenance; for a sweep also the CSVs behind its `dvc plots`."""
    from mmw.reporting.page import build_report

    try:
        info = build_report(Path.cwd(), sweep, out, params)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {info.path} ({info.source}; {info.bytes / 1024:.0f} KiB in {info.seconds:.1f} s)")


@app.command("plots-template")
def plots_template() -> None:
    """Rebuild vendor/vega/dvc-plots.html (DVC's plots page with Vega inlined) from the pinned npm packages."""
    from mmw.reporting.dvc_template import VENDOR_DIR, build

    try:
        path = build(Path.cwd() / VENDOR_DIR)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
