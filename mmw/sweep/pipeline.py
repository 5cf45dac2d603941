"""The pipeline as the sweep sees it: the one interface through which the sweep reads ``dvc.yaml`` and
``dvc.lock`` and runs stages.

The sweep drives the pipeline in two ways, both behind :class:`mmw.sweep.runner.Executor`: a ``dvc exp run`` per
unit (:func:`exp_run_command`: DVC reads ``dvc.yaml`` itself), locally or on a Ray node, and the packed executor,
which runs the same stage commands in one process (:func:`stage_plan`, :func:`run_stage`). What a finished
experiment's stages wrote is read from its ``dvc.lock`` (:func:`locked_outputs`).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmw.errors import SpecError
from mmw.selection.rerun import override_value
from mmw.sweep.definition import VARYING

#: The pipeline's definition and its lock, relative to the repository.
DVC_YAML, DVC_LOCK = "dvc.yaml", "dvc.lock"

#: ``dvc.yaml`` commands whose stage module is not named like the command.
MODULES = {"low-entropy-inputs": "low_entropy"}
#: Stage commands that serve DVC alone: the code fingerprints (stages/code.py) tell DVC which stages an edit reaches;
#: a pack runs this process's code, whatever it is, so it has nothing to fingerprint.
DVC_ONLY = frozenset({"code"})
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


def _inside(path: str, folders: set[str]) -> bool:
    """Whether ``path`` is one of ``folders`` or inside one (``data/code/key.md5`` in the output ``data/code``)."""
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def stage_plan(repo: Path) -> tuple[list[Stage], list[str]]:
    """The stages of ``repo``'s pipeline in ``dvc.yaml`` order (each after its inputs) and the source data paths
    its stages read (``data/...`` deps no stage writes). A stage is per configuration when it always runs (the
    key), reads ``scheme`` params, or reads an output of a per-configuration stage (or the key's); every other
    one is shared."""
    stages = (yaml.safe_load((repo / DVC_YAML).read_text()) or {}).get("stages") or {}
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
        if command in DVC_ONLY:
            continue
        module = MODULES.get(command, command)
        params = [p if isinstance(p, str) else str(next(iter(p))) for p in stage.get("params", []) or []]
        deps = _paths(stage.get("deps", []))
        outs = tuple(_paths(stage.get("outs", [])) + _paths(stage.get("metrics", [])))
        shared = not (stage.get("always_changed") or any(p.split(".")[0] == VARYING for p in params)
                      or any(d in per_config for d in deps))
        if not shared:
            per_config.update(outs)
        sources += [d for d in deps if d.startswith("data/") and not _inside(d, written) and d not in sources]
        plan.append(Stage(name, module, args, outs, shared))
    return plan, sources


def run_stage(stage: Stage) -> None:
    """Run one stage in this process, as its ``dvc.yaml`` command would (in the current directory)."""
    importlib.import_module(f"mmw.stages.{stage.module}").run(*stage.args, PARAMS)


def schedule_ahead(stages: Sequence[Stage]) -> None:
    """Have the set-up of ``stages`` that declare one (their module's ``schedule_ahead``: the rate stage's judge) run
    while an earlier stage of this process decodes (:mod:`mmw.engines.ahead`): beside the last decoding stage
    before it in ``stages``, or the first one for a module that sets ``AHEAD_BESIDE_FIRST`` (a short set-up that
    would crowd the last decode's; the next decode where none is). Call in their workspace, inside
    :func:`mmw.engines.models.shared_loads`, before running them in one process; a stage whose params are invalid
    schedules nothing (it reports the error when it runs)."""
    from mmw.engines import ahead

    first = last = None  # the first and the last stage before this one that decode (a module with DECODES)
    for stage in stages:
        module = importlib.import_module(f"mmw.stages.{stage.module}")
        hook = getattr(module, "schedule_ahead", None)
        if hook is not None:
            try:
                with ahead.beside(first if getattr(module, "AHEAD_BESIDE_FIRST", False) else last):
                    hook(*stage.args, PARAMS)
            except SpecError:
                pass
        if getattr(module, "DECODES", False):
            last = ahead.host(stage.module, *stage.args)
            first = first or last


def cached_file(repo: Path, digest: str | None) -> Path | None:
    """The file of md5 ``digest`` in ``repo``'s local DVC cache (DVC 3's layout, ``.dvc/cache/files/md5/ab/cdef..``),
    or None when it is not there (a directory's digest, another cache folder, a file only a remote holds)."""
    if not digest or digest.endswith(".dir"):
        return None
    path = repo / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]
    return path if path.is_file() else None


def locked_outputs(repo: Path, sha: str) -> dict[str, dict[str, str | None]]:
    """Per stage, the md5 of each output in the ``dvc.lock`` committed at ``sha`` (empty when there is none)."""
    shown = subprocess.run(["git", "show", f"{sha}:{DVC_LOCK}"], cwd=repo, capture_output=True, text=True)
    lock = (yaml.safe_load(shown.stdout) if shown.returncode == 0 else None) or {}
    return {name: {o["path"]: o.get("md5") for o in (stage.get("outs") or [])}
            for name, stage in (lock.get("stages") or {}).items()}


def dvc_executable() -> str:
    """The ``dvc`` installed next to this interpreter, else the one on PATH."""
    found = shutil.which("dvc", path=str(Path(sys.executable).parent)) or shutil.which("dvc")
    if found is None:
        raise SpecError("dvc", "command not found next to this Python nor on PATH", "pip install 'mmw[pipeline]'")
    return found


def _hydra_value(value: Any) -> str:
    """``value`` in the override grammar ``dvc exp run -S`` parses (Hydra): lists and mappings as literals."""
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    return override_value(value)


def set_args(overrides: Mapping[str, Any]) -> list[str]:
    """``-S key=value`` arguments for ``dvc exp run``."""
    args: list[str] = []
    for key, value in overrides.items():
        args += ["-S", f"{key}={_hydra_value(value)}"]
    return args


def exp_run_command(name: str, overrides: Mapping[str, Any], temp: bool) -> list[str]:
    """The ``dvc exp run`` of one unit named ``name``, its params set to ``overrides``: in a temporary copy of the
    workspace (``temp``, a local run) or in the workspace itself (a Ray node's clone)."""
    return [dvc_executable(), "exp", "run", *(["--temp"] if temp else []), "-n", name, *set_args(overrides)]
