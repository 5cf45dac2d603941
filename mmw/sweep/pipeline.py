"""The pipeline as the sweep sees it: the stages of ``dvc.yaml`` in order, which of them a pack shares, and running
one in process.

The sweep drives the pipeline in two ways, both behind :class:`mmw.sweep.runner.Executor`: ``dvc exp run`` (DVC
reads ``dvc.yaml`` itself) and the packed executor, which runs the same stage commands in one process. This module
is the one place the sweep reads ``dvc.yaml``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmw.errors import SpecError
from mmw.sweep.definition import VARYING

#: ``dvc.yaml`` commands whose stage module is not named like the command.
MODULES = {"low-entropy-inputs": "low_entropy"}
#: The params file a stage reads, relative to its workspace.
PARAMS = Path("params.yaml")

@dataclass(frozen=True)
class Stage:
    """One stage of ``dvc.yaml``: its name, the ``mmw.stages`` module and arguments its command runs, its outputs,
    and whether a pack runs it once (``shared``) or per configuration."""

    name: str
    module: str
    args: tuple[str, ...]
    outs: tuple[str, ...]
    shared: bool


def _paths(entries: Sequence[Any]) -> list[str]:
    """The paths of ``deps`` / ``outs`` / ``metrics`` entries (a string or a one-key mapping)."""
    return [str(next(iter(e))) if isinstance(e, Mapping) else str(e) for e in entries or []]


def stage_plan(dvc_yaml: Path) -> tuple[list[Stage], list[str]]:
    """The pipeline's stages in ``dvc.yaml`` order (each after its inputs) and the source data paths its stages
    read (``data/...`` deps no stage writes). A stage is per configuration when it always runs (the key), reads
    ``scheme`` params, or reads an output of a per-configuration stage (or the key's); every other one is shared."""
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}
    per_config: set[str] = set()
    plan: list[Stage] = []
    written = {out for stage in stages.values() for out in _paths(stage.get("outs", [])) + _paths(
        stage.get("metrics", []))}
    sources: list[str] = []
    for name, stage in stages.items():
        words = str(stage["cmd"]).split()
        if len(words) < 2 or Path(words[0]).name != "mmw":
            raise SpecError("dvc.yaml", f"stage {name} runs {stage['cmd']!r}, not an mmw stage command",
                            "`scripts/mmw <command> [args]` commands (a pack runs them in one process)")
        command, args = words[1], tuple(words[2:])
        module = MODULES.get(command, command)
        params = [p if isinstance(p, str) else str(next(iter(p))) for p in stage.get("params", []) or []]
        deps = _paths(stage.get("deps", []))
        outs = tuple(_paths(stage.get("outs", [])) + _paths(stage.get("metrics", [])))
        shared = not (stage.get("always_changed") or any(p.split(".")[0] == VARYING for p in params)
                      or any(d in per_config for d in deps))
        if not shared:
            per_config.update(outs)
        sources += [d for d in deps if d.startswith("data/") and d not in written and d not in sources]
        plan.append(Stage(name, module, args, outs, shared))
    return plan, sources


def run_stage(stage: Stage) -> None:
    """Run one stage in this process, as its ``dvc.yaml`` command would (in the current directory)."""
    importlib.import_module(f"mmw.stages.{stage.module}").run(*stage.args, PARAMS)
