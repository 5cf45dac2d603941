"""Kill-and-resume fault injection for a real `dvc repro` (tests/test_faults.py): put this folder on PYTHONPATH.

Only in a stage's own process (DVC sets $DVC_STAGE; the process is the `mmw` command, not a child it starts),
every ``os.replace`` (how ``mmw.io`` moves a finished file into place: parts, tables, JSON, the judgement cache) is
counted:

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

_STAGE = os.environ.get("DVC_STAGE")
_COUNT_DIR = os.environ.get("MMW_FAULT_COUNT")
_PLAN = os.environ.get("MMW_FAULT_PLAN")
_STATE = os.environ.get("MMW_FAULT_STATE")


def _stage_process() -> bool:
    return bool(sys.argv) and Path(sys.argv[0]).name == "mmw"


def _snapshot() -> dict[str, object]:
    """What the killed run had stored: part files per parts folder, and judgements in the cache."""
    parts = {str(d): len(list(d.glob("*.parquet"))) for d in Path("data").rglob("*.parts") if d.is_dir()}
    cache = os.environ.get("MMW_JUDGE_CACHE")
    judgements = sum(1 for p in Path(cache).rglob("*.json")) if cache and Path(cache).is_dir() else 0
    return {"parts": parts, "judgements": judgements}


if _STAGE and (_COUNT_DIR or (_PLAN and _STATE)):
    _real_replace = os.replace
    _calls = [0]
    _first: dict[str, object] = {}
    _target = json.loads(Path(_PLAN).read_text()).get(_STAGE) if _PLAN else None

    def _replace(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _stage_process():
            if _calls[0] == 0:
                _first.update(_snapshot())
            _calls[0] += 1
            marker = Path(_STATE, f"{_STAGE}.killed") if _STATE else None
            if _target is not None and _calls[0] == _target and marker is not None and not marker.exists():
                marker.write_text(json.dumps({"replace": _calls[0], "dst": str(dst), **_snapshot(),
                                              "first_judgements": _first["judgements"]}))
                os.kill(os.getpid(), signal.SIGKILL)
        return _real_replace(src, dst, *args, **kwargs)

    os.replace = _replace

    if _COUNT_DIR:
        def _write_count() -> None:
            if _stage_process():
                Path(_COUNT_DIR, f"{_STAGE}.count").write_text(str(_calls[0]))

        atexit.register(_write_count)


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


_run_the_next_sitecustomize()
