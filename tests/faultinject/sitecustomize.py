"""Kill-and-resume fault injection for a real `dvc repro` (tests/test_faults.py).

Loaded in one of two ways: this folder on ``PYTHONPATH`` (the shared traced run: every stage is a plain process that
runs this file when it starts), or :func:`install` from a ``.pth`` file of the run's own venv (the faulty run: its
stages run as copies of the warm stage server, mmw.prefork, which runs this file once when it starts, and every copy
it forks inherits the wrapper). So nothing is read when this file runs: the stage, the plan and the state folder
are read from the environment of the process that moves a file (a copy gets its caller's environment).

Only in a stage's own process (DVC sets $DVC_STAGE; the process is the `mmw` command, not a child it starts, nor
the server), every ``os.replace`` (how ``mmw.io`` moves a finished file into place: parts, tables, JSON, the
judgement cache) is counted:

* ``MMW_FAULT_COUNT=<dir>``: at exit, write ``<dir>/<stage>.count`` (the number of replaces of a clean run);
* ``MMW_FAULT_PLAN=<file>`` (JSON ``{stage: n}``) and ``MMW_FAULT_STATE=<dir>``: at the n-th replace, before the
  file moves into place, write ``<dir>/<stage>.killed`` (what was stored at that moment) and SIGKILL the process,
  once per stage (a marker that exists means the kill happened: the rerun runs clean).

The product code carries no test branch: this file wraps a standard-library function from outside.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
from pathlib import Path

_VARIABLES = ("MMW_FAULT_COUNT", "MMW_FAULT_PLAN")


def _stage() -> str | None:
    """The stage this process runs, if it is a stage's own `mmw` process."""
    if sys.argv and Path(sys.argv[0]).name == "mmw":
        return os.environ.get("DVC_STAGE") or None
    return None


def _snapshot() -> dict[str, object]:
    """What the killed run had stored: part files per parts folder, and judgements in the cache."""
    parts = {str(d): len(list(d.glob("*.parquet"))) for d in Path("data").rglob("*.parts") if d.is_dir()}
    cache = os.environ.get("MMW_JUDGE_CACHE")
    judgements = sum(1 for p in Path(cache).rglob("*.json")) if cache and Path(cache).is_dir() else 0
    return {"parts": parts, "judgements": judgements}


def install() -> None:
    """Wrap ``os.replace`` (once a process; a forked copy inherits the wrapper and counts from zero)."""
    if getattr(os.replace, "_mmw_fault", False):
        return
    real_replace = os.replace
    counted = {"pid": os.getpid(), "calls": 0, "first": {}, "target": None}

    def calls() -> dict[str, object]:
        if counted["pid"] != os.getpid():  # a copy forked from a process that counted: its own count
            counted.update(pid=os.getpid(), calls=0, first={}, target=None)
        return counted

    def replace(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
        stage = _stage()
        if stage:
            state = calls()
            folder = os.environ.get("MMW_FAULT_STATE")
            if state["calls"] == 0:  # the process's first move: what was stored before it, and its planned kill
                plan = os.environ.get("MMW_FAULT_PLAN")
                state["first"] = _snapshot()
                state["target"] = json.loads(Path(plan).read_text()).get(stage) if plan and folder else None
            state["calls"] += 1
            marker = Path(folder, f"{stage}.killed") if state["calls"] == state["target"] else None  # once a stage
            if marker is not None and not marker.exists():
                marker.write_text(json.dumps({"replace": state["calls"], "dst": str(dst), **_snapshot(),
                                              "first_judgements": state["first"]["judgements"],
                                              "warm_copy": os.environ.get("_MMW_PREFORK_COPY") == "1"}))
                os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst, *args, **kwargs)

    def write_count() -> None:
        stage, folder = _stage(), os.environ.get("MMW_FAULT_COUNT")
        if stage and folder:
            Path(folder, f"{stage}.count").write_text(str(calls()["calls"]))

    replace._mmw_fault = True  # type: ignore[attr-defined]
    os.replace = replace
    atexit.register(write_count)


def _run_the_next_sitecustomize() -> None:
    """Python imports only the first ``sitecustomize`` on its path; run the next one after this folder too (the
    shared traced run puts this folder before tests/deptrace, so one run is counted and traced)."""
    import importlib.util

    here = Path(__file__).resolve().parent
    entries = [Path(entry or ".").resolve() for entry in sys.path]
    after = entries[entries.index(here) + 1:] if here in entries else []
    for folder in after:
        source = folder / "sitecustomize.py"
        if source.is_file():
            spec = importlib.util.spec_from_file_location("_mmw_next_sitecustomize", source)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            return


if any(os.environ.get(name) for name in _VARIABLES):
    install()
_run_the_next_sitecustomize()
