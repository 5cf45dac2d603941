"""Packed sweep units against one DVC experiment per configuration: the same k configurations, wall times.

Makes a fresh copy of the pipeline (tests/pipeline_repo.py, the copy the heavy tests run) with a sweep definition
(default: sweeps/smoke.yaml, 3 configurations at T = 0.7, 1 prompt per task, 16 tokens, the small judge) and runs
its tuning units twice through :func:`mmw.sweep.run_units`, each with a judgement cache of its own:

1. ``LocalDvcExecutor``: one ``dvc exp run --temp`` per configuration (the baseline made by the first one and
   restored from DVC's run-cache by the others);
2. ``PackedExecutor(pack=0)``: all k in one pack (the baseline made once, the models loaded once).

Both write the same evidence files (the script checks that the per-prompt rows are equal). Printed: total wall time
of each, every unit's wall time, and the fixed cost per DVC unit derived from them: a DVC unit after the first does
the same work as a packed configuration after the first (its stages on a baseline already made) plus what a unit
pays whatever its size (DVC, one process per stage, imports, model loads), so

    fixed cost per DVC unit = mean wall of DVC units 2..k - mean wall of packed configurations 2..k.

    nice -n 19 .venv/bin/python bench/pack.py                 # sweeps/smoke.yaml
    nice -n 19 .venv/bin/python bench/pack.py --sweep NAME --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from pipeline_repo import make_pipeline_repo, run  # noqa: E402  (the copy the heavy tests run)


def _units(repo: Path, sweep: str) -> dict[str, object]:
    from mmw.sweep.units import read_unit, runs_dir

    return {p.stem: read_unit(p) for p in runs_dir(repo, sweep).glob("*.parquet")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="smoke", help="a definition under sweeps/ (its tuning units are run)")
    parser.add_argument("--workdir", type=Path, help="run in this new directory (default: a fresh temp dir, removed)")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()

    from mmw.sweep import load_sweep, pool_jobs, run_units
    from mmw.sweep.pack import PackedExecutor
    from mmw.sweep.runner import LocalDvcExecutor, read_log
    from mmw.sweep.units import runs_dir

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mmw-bench-pack-"))
    workdir.mkdir(parents=True, exist_ok=args.workdir is None)
    repo = make_pipeline_repo(workdir / "repo", yaml.safe_load((REPO / "params.yaml").read_text()))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "pipeline")
    sweep = load_sweep(repo, args.sweep)
    jobs = pool_jobs(sweep)
    k = len(jobs)
    result: dict[str, object] = {"sweep": args.sweep, "k": k, "cpus": os.cpu_count()}
    walls: dict[str, list[float]] = {}
    rows = {}
    for label, make in (("dvc", lambda: LocalDvcExecutor(repo)), ("pack", lambda: PackedExecutor(repo, 0))):
        os.environ["MMW_JUDGE_CACHE"] = str(workdir / f"judgements-{label}")
        shutil.rmtree(runs_dir(repo, args.sweep), ignore_errors=True)
        for ref in run(repo, "git", "for-each-ref", "--format=%(refname)", "refs/exps/").stdout.split():
            subprocess.run(["git", "update-ref", "-d", ref], cwd=repo, check=True)
        started = time.perf_counter()
        progress = run_units(repo, sweep, label, jobs, make(), print)
        total = time.perf_counter() - started
        if progress.done != k:
            raise SystemExit(f"{label}: {progress.done} of {k} units finished")
        log = read_log(repo, args.sweep)
        walls[label] = [log[j.name].wall_s for j in jobs]
        rows[label] = {uid: unit.rows for uid, unit in _units(repo, args.sweep).items()}
        result[f"{label}_total_s"] = round(total, 1)
        result[f"{label}_units_s"] = walls[label]
    same = all(rows["pack"][uid].equals(frame) for uid, frame in rows["dvc"].items()) and rows["dvc"].keys() == \
        rows["pack"].keys()
    fixed = statistics.mean(walls["dvc"][1:]) - statistics.mean(walls["pack"][1:])
    result.update(rows_identical=same, fixed_per_dvc_unit_s=round(fixed, 1),
                  pack_marginal_s=round(statistics.mean(walls["pack"][1:]), 1),
                  saving=round(1 - result["pack_total_s"] / result["dvc_total_s"], 3))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
