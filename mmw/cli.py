"""The ``mmw`` command line: one command per pipeline stage (see dvc.yaml), implemented in ``mmw.stages``.

Heavy imports (torch, transformers, the attacks) happen inside the commands, so ``mmw --help`` stays fast.
A ``SpecError`` (bad parameter) ends the command with its one-line message and exit code 2.
"""

from __future__ import annotations

import importlib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from mmw.errors import SpecError

app = typer.Typer(help="MarkMyWords watermark benchmark: pipeline stages (run them through `dvc repro`).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

ParamsOption = Annotated[Path, typer.Option("--params", "-p", help="params file to read")]


class Which(StrEnum):
    """Which generations a stage works on."""

    baseline = "baseline"
    watermarked = "watermarked"


def _stage(module: str, *args: Any) -> None:
    """Run ``mmw.stages.<module>.run(*args)``, turning a SpecError into a one-line error and exit code 2."""
    try:
        importlib.import_module(f"mmw.stages.{module}").run(*args)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


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
    out: Annotated[Path, typer.Option(help="Markdown report; the plot goes next to it (.png)")] = Path(
        "reports/selection.md"),
) -> None:
    """Pick the watermark to deploy among this repository's DVC experiments (the paper's aggregate metric).

    Keeps the settings within the quality-loss and tamper-resistance targets, picks the smallest watermark size,
    writes a report and prints the `dvc exp run` command that re-evaluates the pick with a fresh seed. Exit code 1
    when no setting is feasible, 2 on bad options or when there is nothing to select from.
    """
    from mmw.io import write_text, write_with
    from mmw.selection import (
        Constraints,
        fresh_seed,
        read_experiments,
        rerun_command,
        select,
        selection_figure,
        selection_markdown,
    )

    try:
        constraints = Constraints(max_quality_loss, min_tamper_resistance, max_fpr)
        experiments = read_experiments(Path.cwd())
        selection = select(experiments.table, constraints)
    except SpecError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    pick = selection.pick
    rerun = rerun_command(experiments, pick["rev"], fresh_seed(experiments.table)) if pick else None
    figure = selection_figure(selection)
    write_text(selection_markdown(selection, rerun), out)
    plot = out.with_suffix(".png")
    write_with(plot, lambda path: figure.savefig(path, format="png", dpi=120))
    typer.echo(f"{selection.feasible.height} of {selection.table.height} settings feasible; report: {out}, "
               f"plot: {plot}")
    if pick is None or rerun is None:
        typer.echo("no feasible setting: relax the constraints or evaluate more settings", err=True)
        raise typer.Exit(1)
    typer.echo(f"pick: {pick['name']} (rev {pick['rev'][:7]}): size {pick['all.size']:g} tokens, relative quality "
               f"{pick['all.relative_quality']:.4g}, R {pick['all.tamper_resistance']:.4g}")
    typer.echo("re-evaluate it with a fresh seed and a fresh secret key (set MMW_KEY; it is never written):")
    typer.echo("  export MMW_KEY=...   # a new secret key")
    typer.echo(f"  {rerun.command if rerun.exact else rerun.fallback}")
