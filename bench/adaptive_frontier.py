"""Agreement against cost for the race's settings on the paper grid's shape, beside the oracle floor.

    nice -n 19 .venv/bin/python bench/adaptive_frontier.py --sweeps 200 [--jobs 2] [--out FILE]

Each setting (rule, cumulative shards per task, level) is one simulation of ``--sweeps`` sweeps of the paper grid
(bench/adaptive.py's set-up: 1,152 configurations, 64 cells, tuning 64 prompts per task, confirmation 32 x K = 3),
priced with packs that decode their configurations together (``GPU_PACKED``, ``pack: 0``), the cost model of a
real packed race. Beside each: the **oracle floor** for its round 1 (:func:`sweep_simulation.oracle_priced`):
a race that, after round 1, runs only what the grid's confirmation will try agrees with the grid in every cell,
so no race with that round 1 that reaches full agreement can pay less. And the race **told after round 1 which
cells the grid leaves unresolved** (:func:`sweep_simulation.informed_priced`): the same decisions in every other
cell, hence the same agreement, with the grid-unresolved cells stopped — what a perfect futility stop would save.
"""

from __future__ import annotations

import argparse
import json
import time
from multiprocessing import Pool
from pathlib import Path

import yaml
from adaptive import TARGET, hours

from mmw.sweep.cost import GPU_PACKED
from mmw.sweep.schedule import Schedule
from mmw.sweep.confirm import Confirmation
from mmw.sweep.definition import expand
from sweep_simulation import (adaptive_summary, informed_priced, oracle_priced, paper_groups, priced,
                                simulate_adaptive, tried_per_group)

ROOT = Path(__file__).resolve().parent.parent
TUNING, CONFIRM, K = 64, 32, 3
#: (rule, cumulative shards per task, level): the default screen, its level, its schedule, and the union rule.
SETTINGS = [("screen", (4, 12, 32, 64), level) for level in (0.02, 0.05, 0.1, 0.2)] + [
    ("screen", (2, 8, 24, 64), 0.05), ("screen", (4, 16, 64), 0.05), ("screen", (4, 8, 16, 32, 64), 0.05),
    ("union", (8, 24, 64), 0.05)]
MODEL = GPU_PACKED.with_fixed(GPU_PACKED.unit_s, 0)


def one(setting: tuple[str, tuple[int, ...], float], sweeps: int) -> dict:
    rule, shards, level = setting
    configs = expand("paper", yaml.safe_load((ROOT / "params.yaml").read_text()), ROOT / "sweeps",
                     validate=False).configs
    schedule = Schedule(shards=list(shards), level=level, rule=rule)
    settings = Confirmation(prompts=CONFIRM, level=0.05, max_tries=schedule.keep, resamples=200)
    start = time.perf_counter()
    result = simulate_adaptive(paper_groups(configs), schedule, sweeps, TUNING, CONFIRM, K, settings, MODEL)
    s = adaptive_summary(result, MODEL, CONFIRM, K)
    grid = priced(result, "uniform", MODEL, CONFIRM, K)
    oracle = oracle_priced(result, shards[0], TUNING, MODEL, CONFIRM, K)
    informed = informed_priced(result, MODEL, CONFIRM, K)
    grid_h = hours(s, "uniform", schedule, MODEL, TUNING, CONFIRM, K)
    baselines_s = grid_h * 3600 - s["uniform_total_s"]  # the grid's baselines, charged to the oracle too
    n = max(s["resolved_cells"], 1)
    return {"rule": rule, "shards": list(shards), "level": level, "sweeps": sweeps,
            "agreement": s["agreement"], "agreement_se": (s["agreement"] * (1 - s["agreement"]) / n) ** 0.5,
            "race_false": s["adaptive_false"], "grid_false": s["uniform_false"],
            "tuning_ratio": s["tuning_ratio"], "total_ratio": s["total_ratio"],
            "oracle_tuning_ratio": oracle[0] / grid[0], "oracle_total_ratio": sum(oracle) / sum(grid),
            "informed_tuning_ratio": informed[0] / grid[0], "informed_total_ratio": sum(informed) / sum(grid),
            "grid_h100_h": grid_h, "race_h100_h": hours(s, "adaptive", schedule, MODEL, TUNING, CONFIRM, K),
            "oracle_h100_h": (sum(oracle) / sweeps + baselines_s) / 3600,
            "grid_tried_per_group": tried_per_group(result),
            "seconds": time.perf_counter() - start}


def table(rows: list[dict]) -> str:
    lines = ["| rule | shards per task | level | agreement | race ÷ grid: tuning / all | told the unresolved cells: "
             "tuning / all | oracle floor: tuning / all | H100-h: grid / race / oracle |", "|---" * 8 + "|"]
    for r in rows:
        lines.append(f"| {r['rule']} | {r['shards']} | {r['level']} | {100 * r['agreement']:.1f} % ± "
                     f"{100 * r['agreement_se']:.1f} | {r['tuning_ratio']:.3f} / {r['total_ratio']:.3f} | "
                     f"{r['informed_tuning_ratio']:.3f} / {r['informed_total_ratio']:.3f} | "
                     f"{r['oracle_tuning_ratio']:.3f} / {r['oracle_total_ratio']:.3f} | "
                     f"{r['grid_h100_h']:.1f} / {r['race_h100_h']:.1f} / {r['oracle_h100_h']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    with Pool(args.jobs) as pool:
        rows = pool.starmap(one, [(s, args.sweeps) for s in SETTINGS])
    out = {"sweeps": args.sweeps, "target": TARGET, "cost_model": "GPU_PACKED, pack 0", "rows": rows,
           "seconds": time.perf_counter() - start}
    print(table(rows))
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
