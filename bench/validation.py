"""Measure the validation tasks on a pipeline copy: size, detection rate and quality per task, baseline vs
watermarked, for the default scheme and for exponential sampling (docs/VALIDATION.md).

Copies the pipeline (tests/pipeline_repo.py) into a fresh directory with a small board, runs `dvc repro`, then
switches the scheme to exponential sampling and runs `dvc repro` again (only the watermarked side reruns), and
prints/writes per task: detection rate, size, judge Q baseline/watermarked, the task measure (pass@1 /
accuracy) baseline/watermarked, perplexity, repetition, and MAUVE with its run time.

    python bench/validation.py --tasks rfc_summary legal_research --per-task 3 --tokens 150 --out run.json
    python bench/validation.py --markdown run.json      # the tables again, from a saved result
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
from pipeline_repo import make_pipeline_repo  # noqa: E402

EXPONENTIAL = {"sampler": "exponential", "randomness": "window", "window": 1, "key_length": None, "delta": None,
               "gamma": None, "skip_prob": None, "binary_code": None, "score": "sum", "psi": None, "trials": None}
PER_TASK_KEYS = ("generations", "detection_rate", "size", "quality_baseline", "quality_watermarked",
                 "relative_quality", "fpr", "mean_tokens")


def board(tasks: list[str], per_task: int, tokens: int, judge: str, model: str | None = None,
          dtype: str | None = None) -> dict:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["prompts"].update(tasks=tasks, per_task=per_task)
    raw["model"].update(max_new_tokens=tokens, batch_size=8)
    raw["model"].update({k: v for k, v in (("name", model), ("dtype", dtype)) if v is not None})
    # One cheap attack: aggregate needs at least one (its figure has a panel per attacked group).
    raw["attacks"]["specs"] = [{"name": "lowercase"}]
    raw["detect"]["audit_keys"] = 0
    raw["rate"]["judge"] = judge
    return raw


def collect(workdir: Path) -> dict:
    metrics = json.loads((workdir / "reports/metrics.json").read_text())
    quality = json.loads((workdir / "reports/quality.json").read_text())
    tasks = {}
    for task, q in quality["groups"].items():
        m = metrics.get(task, {})
        tasks[task] = {**{k: m.get(k) for k in PER_TASK_KEYS}, **{k: v for k, v in q.items()}}
    timings = {p.stem: json.loads(p.read_text())["wall_s"] for p in (workdir / "reports/timings").glob("*.json")}
    return {"tasks": tasks, "mauve": quality["mauve"], "sandbox": quality.get("sandbox"), "timings_s": timings}


def _fmt(value, percent: bool = False) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    return f"{100 * value:.0f}%" if percent else f"{value:.3g}"


def markdown(results: dict) -> str:
    """One table per run: per task, detection, size, judge Q and task measure (baseline -> watermarked)."""
    lines = []
    for name, run in results["runs"].items():
        lines += [f"**{name}** (`{run['scheme']['sampler']}`, repro {run['repro_s']:.0f} s; MAUVE "
                  f"{_fmt((run['mauve'] or {}).get('value'))} in {_fmt((run['mauve'] or {}).get('wall_s'))} s)", "",
                  "| task | n | detected | FPR | size E | judge Q base → wm | measure | task score base → wm "
                  "| perplexity base → wm | repeated 2-grams base → wm | mean tokens |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for task, m in run["tasks"].items():
            lines.append(
                f"| {task} | {m.get('generations') or m.get('n_watermarked')} | {_fmt(m.get('detection_rate'), True)} "
                f"| {_fmt(m.get('fpr'), True)} | {_fmt(m.get('size'))} | {_fmt(m.get('quality_baseline'))} → "
                f"{_fmt(m.get('quality_watermarked'))} | {m.get('measure') or '–'} | "
                f"{_fmt(m.get('task_score_baseline'), True)} → {_fmt(m.get('task_score_watermarked'), True)} | "
                f"{_fmt(m.get('perplexity_baseline'))} → {_fmt(m.get('perplexity_watermarked'))} | "
                f"{_fmt(m.get('repetition_2_baseline'), True)} → {_fmt(m.get('repetition_2_watermarked'), True)} | "
                f"{_fmt(m.get('mean_tokens'))} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+")
    parser.add_argument("--markdown", type=Path, help="print the tables of a saved result and exit")
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=150)
    parser.add_argument("--judge", default="embedded:qwen2.5-coder-1.5b")
    parser.add_argument("--model", help="generator (default: params.yaml's)")
    parser.add_argument("--dtype", help="generator dtype (default: params.yaml's)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    if not args.tasks:
        parser.error("--tasks is required")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mmw-validation-"))
    workdir.mkdir(parents=True, exist_ok=True)
    raw = board(args.tasks, args.per_task, args.tokens, args.judge, args.model, args.dtype)
    make_pipeline_repo(workdir, raw)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    results = {"board": {"tasks": args.tasks, "per_task": args.per_task, "max_new_tokens": args.tokens,
                         "judge": args.judge, "model": raw["model"]["name"], "dtype": raw["model"]["dtype"]},
               "runs": {}}
    for name, scheme in (("default", None), ("exponential", EXPONENTIAL)):
        if scheme is not None:
            raw["scheme"].update(scheme)
            (workdir / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        started = time.perf_counter()
        subprocess.run(["dvc", "repro"], cwd=workdir, env=env, check=True)
        results["runs"][name] = {"scheme": dict(raw["scheme"]), "repro_s": round(time.perf_counter() - started, 1),
                                 **collect(workdir)}
        results["runs"][name]["scheme"].pop("key", None)
        print(json.dumps(results["runs"][name]["tasks"], indent=1))
    print(markdown(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
        args.out.with_suffix(".md").write_text(markdown(results))
    print(f"workdir: {workdir}")


if __name__ == "__main__":
    main()
