"""Time a full `dvc repro` of the pipeline from scratch, and each stage's share.

Copies the pipeline (dvc.yaml, DVC config, the code its stages depend on) and a params file into a fresh git
repository, runs `dvc repro` there, and reads the per-stage wall times the stages record in
reports/timings/<stage>.json. The gap between the total and the sum of the stages is DVC's own work plus each
stage process's start-up (interpreter, imports) before its timer starts.

    python bench/pipeline.py                       # default params.yaml
    python bench/pipeline.py --params params-full.yaml --workdir /tmp/full-run

The run directory is kept (its reports/ hold the metrics and summary of the timed run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from pipeline_repo import make_pipeline_repo  # noqa: E402  (the copy the heavy tests run, so both time the same thing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml", help="params file to benchmark")
    parser.add_argument("--workdir", type=Path, help="run in this new directory (default: a fresh temp dir)")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mmw-bench-"))
    workdir.mkdir(parents=True, exist_ok=args.workdir is None)
    make_pipeline_repo(workdir, yaml.safe_load(args.params.read_text()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    started = time.perf_counter()
    subprocess.run(["dvc", "repro"], cwd=workdir, env=env, check=True)
    total = time.perf_counter() - started

    timings = {path.stem: json.loads(path.read_text())["wall_s"]
               for path in sorted((workdir / "reports/timings").glob("*.json"))}
    stage_sum = sum(timings.values())
    print(f"\n`dvc repro` wall time: {total:.1f} s ({os.cpu_count()} CPUs)")
    print(f"{'stage':<24}{'seconds':>10}{'share':>8}")
    for stage, seconds in sorted(timings.items(), key=lambda item: -item[1]):
        print(f"{stage:<24}{seconds:>10.1f}{100 * seconds / total:>7.0f}%")
    print(f"{'start-up + DVC':<24}{total - stage_sum:>10.1f}{100 * (total - stage_sum) / total:>7.0f}%")
    print(f"\nmetrics: {workdir / 'reports/metrics.json'}\nsummary: {workdir / 'reports/summary.md'}")
    if args.out:
        args.out.write_text(json.dumps({"total_s": total, "stages_s": timings, "workdir": str(workdir)}, indent=2))


if __name__ == "__main__":
    main()
