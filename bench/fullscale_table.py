"""Full-scale runs side by side: one column a ``gpu_fullscale.json`` (``bench/gpu_fullscale.py --in-process`` under
``MMW_BENCH_SPLIT=1``), one row a stage's seconds or a split of them, the judge's ms a judgement and the token counts
(runs of one tree and one compiler cache must agree on these). A stage a run did not run shows ``-``.

    python bench/fullscale_table.py LABEL=PATH [LABEL=PATH ...] [--markdown]
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Callable
from typing import Any

Run = dict[str, Any]


def stage(run: Run, name: str) -> dict[str, Any]:
    return next(s for s in run["stages"] if s["stage"] == name)


def split(run: Run, name: str) -> dict[str, Any]:
    splits = run["splits"]
    splits = ast.literal_eval(splits) if isinstance(splits, str) else splits  # older files kept its repr
    return next(s for s in splits if s["split"] == name)


def judge_ms(run: Run) -> str:
    """ms a judgement on the baseline's texts / the attacked ones / all, by the backend's own timer."""
    b, w = stage(run, "rate_baseline")["timing"], stage(run, "rate_watermarked")["timing"]
    per = [1000 * t["judging_s"] / t["judgements_made"] for t in (b, w)]
    both = 1000 * (b["judging_s"] + w["judging_s"]) / (b["judgements_made"] + w["judgements_made"])
    return f"{per[0]:.2f} / {per[1]:.2f} / {both:.2f}"


def ahead_jobs(run: Run, name: str) -> str:
    """Generation stage ``name``'s wait in :func:`mmw.engines.ahead.settle` and the seconds of each job that ran
    beside its decode (runs before ``MMW_BENCH_SPLIT`` recorded them: ``-``)."""
    line = split(run, name)
    jobs = "; ".join(f"{name} {seconds:.2f}" for name, seconds in line["ahead_jobs"].items())
    return f"{line['ahead_wait']:.2f}; {jobs}"


def rows() -> list[tuple[str, Callable[[Run], Any]]]:
    out: list[tuple[str, Callable[[Run], Any]]] = [
        ("key, low_entropy_inputs, prompts",
         lambda r: round(sum(stage(r, s)["wall_s"] for s in ("key", "low_entropy_inputs", "prompts")), 1))]
    for name in ("generate_baseline", "generate_watermarked"):
        out += [(name, lambda r, n=name: stage(r, n)["wall_s"]),
                ("- load; prefill; eager steps; decode loop", lambda r, n=name: "; ".join(
                    f"{split(r, n).get(k, 0):.2f}" for k in ("load_model", "prefill", "eager_steps", "decode_loop"))),
                ("- Dynamo (graphs)",
                 lambda r, n=name: f"{split(r, n)['dynamo_compile_s']:.2f} ({split(r, n)['dynamo_graphs']})"),
                ("- the decode's wait for the set-up beside it; each job", lambda r, n=name: ahead_jobs(r, n))]
    out += [(name, lambda r, n=name: stage(r, n)["wall_s"]) for name in ("perturb", "detect_baseline",
                                                                           "detect_watermarked")]
    out.append(("- numba kernels (detect_baseline)", lambda r: split(r, "detect_baseline").get("detect_kernels")))
    for name in ("rate_baseline", "rate_watermarked"):
        out += [(name, lambda r, n=name: stage(r, n)["wall_s"]),
                ("- load; the judge's set-up; judging", lambda r, n=name: "; ".join(
                    [f"{split(r, n).get(k, 0):.2f}" for k in ("load_model", "judge_init")]
                    + [f"{stage(r, n)['timing']['judging_s']:.2f}"])),
                ("- Dynamo (graphs)",
                 lambda r, n=name: f"{split(r, n)['dynamo_compile_s']:.2f} ({split(r, n)['dynamo_graphs']})")]
    out += [("quality (scoring)",
             lambda r: f"{stage(r, 'quality')['wall_s']:.1f} ({stage(r, 'quality')['timing']['scoring_s']:.2f})"),
            ("aggregate", lambda r: stage(r, "aggregate")["wall_s"]),
            ("sum of the stages", lambda r: round(sum(s["wall_s"] for s in r["stages"]), 1)),
            ("process wall (imports before the first stage)",
             lambda r: f"{float(r['process_wall_s']):.1f} ({float(r['warm_imports_s']):.1f})"),
            ("judge, ms a judgement: baseline / attacked / all", judge_ms),
            ("tokens generated, baseline / watermarked", lambda r: " / ".join(
                f"{stage(r, n)['timing']['tokens']:,}" for n in ("generate_baseline", "generate_watermarked")))]
    return out


def cell(fn: Callable[[Run], Any], run: Run) -> str:
    try:
        return str(fn(run))
    except (StopIteration, KeyError, TypeError, ZeroDivisionError, ValueError, SyntaxError):
        return "-"


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    specs = [a for a in argv if a != "--markdown"]
    if not specs or any("=" not in a for a in specs):
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for spec in specs:
        label, path = spec.split("=", 1)
        with open(path) as f:
            runs.append((label, json.load(f)))
    table = [(name, [cell(fn, run) for _, run in runs]) for name, fn in rows()]
    if markdown:
        print("| seconds (splits) | " + " | ".join(label for label, _ in runs) + " |")
        print("|---" * (len(runs) + 1) + "|")
        for name, values in table:
            label = "— " + name[2:] if name.startswith("- ") else name
            print(f"| {label} | " + " | ".join(values) + " |")
        return 0
    width = max(len(name) for name, _ in table)
    widths = [max(len(label), *(len(v[i]) for _, v in table)) for i, (label, _) in enumerate(runs)]
    print(" " * width, *(label.rjust(w) for (label, _), w in zip(runs, widths, strict=True)))
    for name, values in table:
        print(name.ljust(width), *(v.rjust(w) for v, w in zip(values, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
