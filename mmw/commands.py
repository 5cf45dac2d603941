"""The ``mmw`` commands that are not pipeline stages: select, report, timings, plots-template, install-argos,
plugin new.

``mmw.cli`` loads this module only when one of these commands runs (or ``mmw --help`` lists them), so that the
pipeline stages, which run through ``mmw.cli``, do not depend on it: editing these commands invalidates no stage.
Heavy imports happen inside the commands, so listing them stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mmw.cli import ParamsOption
from mmw.errors import SpecError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


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


@app.command("verify", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify(ctx: typer.Context) -> None:
    """Compare a re-run with the committed numbers: exact, within uncertainty, or differs (`mmw verify --help`)."""
    from mmw.verify import app as verify_app

    verify_app(ctx.args, prog_name="mmw verify")


@app.command("exps", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exps(ctx: typer.Context) -> None:
    """The experiments side by side in the terminal's width: the params that differ and the headline metrics
    (`--width N`; other options pass to `dvc exp show`)."""
    from mmw.reporting.exps import main as exps_main

    raise typer.Exit(exps_main(ctx.args))


plugin_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                         help="Outside watermarks as plugins (docs/PLUGINS.md).")
app.add_typer(plugin_app, name="plugin")


@plugin_app.command("new")
def plugin_new(
    name: Annotated[str, typer.Argument(help="the plugin's name: entry point, package and distribution")],
    directory: Annotated[Path, typer.Option("--dir", help="the folder to create the package NAME in")] = Path("."),
) -> None:
    """Write a plugin package to fill in: entry point, processor and detector with the contract in their
    docstrings, and a test that runs mmw's contract check (docs/PLUGINS.md)."""
    from mmw.watermark.plugins.scaffold import new_plugin

    try:
        files = new_plugin(name, directory)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    root = files[0].parent
    typer.echo(f"wrote {root}/ ({len(files)} files). Fill in watermark_scores and green_units in "
               f"{root / name / 'watermark.py'}, then:\n"
               f"  .venv/bin/python -m pip install --no-deps -e {root}\n"
               f"  .venv/bin/python -m pytest {root / 'tests'}")
