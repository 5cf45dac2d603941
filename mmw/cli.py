"""The ``mmw`` command line: one command per pipeline stage (see dvc.yaml), implemented in ``mmw.stages``.

Every stage of dvc.yaml runs through this module, so each stage depends on it: it holds the stage commands and
nothing else. The other commands (``mmw sweep``, ``select``, ``report``, ``timings``...) live in ``mmw.sweep.cli``
and ``mmw.commands``, which :class:`_Commands` imports only when one of them runs or ``mmw --help`` lists them:
editing them invalidates no stage. Heavy imports (torch, transformers, the attacks) happen inside the stages, so
``mmw --help`` stays fast.
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

import typer
import typer.main
from typer.core import TyperGroup

from mmw.errors import SpecError


class _Commands(TyperGroup):
    """The stage commands, defined here, plus the other commands, each loaded from its module when it is asked for
    (click's lazily loaded subcommands): a stage's process never imports them."""

    #: command -> the module whose ``app`` (a Typer app) defines it, in the order ``mmw --help`` lists them.
    LAZY = {"timings": "mmw.commands", "install-argos": "mmw.commands", "select": "mmw.commands",
            "sweep": "mmw.sweep.cli", "report": "mmw.commands", "plots-template": "mmw.commands",
            "verify": "mmw.commands", "exps": "mmw.commands", "plugin": "mmw.commands"}

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*super().list_commands(ctx), *self.LAZY]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name not in self.LAZY:
            return super().get_command(ctx, cmd_name)
        group = typer.main.get_command(importlib.import_module(self.LAZY[cmd_name]).app)
        assert isinstance(group, TyperGroup), f"{self.LAZY[cmd_name]}.app must be a group of commands"
        return group.get_command(ctx, cmd_name)


app = typer.Typer(cls=_Commands, help="MarkMyWords watermark benchmark: pipeline stages (run them through "
                  "`dvc repro`), sweeps, selection and the report.",
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
    # A stage in a warm copy of a server (mmw.prefork), if one serves; never under per-process hooks (PYTHONPATH:
    # the tests' tracers), which must see the stage's own imports.
    if os.environ.get("MMW_PREFORK") == "1" and not os.environ.get("PYTHONPATH"):
        from mmw import prefork

        if prefork.enabled(sys.argv) and (code := prefork.forward(sys.argv, f"{__name__}:main")) is not None:
            sys.exit(code)
    _OWN_PROCESS = True
    app(prog_name="mmw")


@app.command()
def code(params: ParamsOption = Path("params.yaml")) -> None:
    """Fingerprint the code each stage runs (data/code/<stage>.md5, from meta.code in the dvc.yaml beside params)."""
    _stage("code", params)


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
