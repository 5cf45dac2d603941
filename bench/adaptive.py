"""The adaptive (racing) sweep against the uniform grid on the paper grid's shape, simulated, and the paper grid's
cost in H100-hours from the simulation's unit counts x the measured per-unit costs.

    nice -n 19 .venv/bin/python bench/adaptive.py --sweeps 1000 [--shards 8,24,64] [--budget 0.25] [--out FILE]

Per simulated sweep: 1,152 configs (sweeps/paper.yaml) in 16 groups (temperature x sampler) x 4 constraints =
64 cells; synthetic truth (mmw.sweep.simulate.config_truth), per-prompt noise of mmw.sweep.simulate; tuning
``--tuning`` prompts per task (3 tasks), confirmation ``--confirm`` per task x K runs. Cost: mmw.sweep.adaptive's
cost model (``GPU_STAGED``: one H100, 302.5 s a config and 191 s a baseline at 296 prompts, of which 95 s / 60 s
fixed per unit), baselines per temperature and shard included.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import polars as pl
import yaml

from mmw.sweep.adaptive import GPU_STAGED, CostModel, Schedule
from mmw.sweep.confirm import ConfirmSettings
from mmw.sweep.definition import expand
from mmw.sweep.simulate import adaptive_summary, paper_groups, simulate_adaptive

ROOT = Path(__file__).resolve().parent.parent
TEMPERATURES = 4
#: The paper grid as written today (bench/RESULTS.md "Cost model for the paper's grid"): every config on all 296
#: prompts, 24 baselines, ~150 re-evaluations, one H100.
TODAY_H = (1152 * 302.5 + 24 * 191.0 + 150 * 302.5) / 3600


def hours(summary: dict[str, float], name: str, schedule: Schedule, cost: CostModel, tuning: int, confirm: int,
          k: int, tasks: int = 3) -> float:
    """H100-hours of one simulated sweep: units (tuning and confirmation) plus baselines (one per temperature and
    tuning shard; K per temperature for confirmation)."""
    shards = [tuning] if name == "uniform" else [schedule.shard(r)[1] for r in range(schedule.rounds)]
    baselines = TEMPERATURES * sum(float(cost.baseline(s * tasks)) for s in shards)
    baselines += TEMPERATURES * k * float(cost.baseline(confirm * tasks))
    return (summary[f"{name}_total_s"] + baselines) / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--shards", default="8,24,64", help="cumulative tuning prompts per task after each round")
    parser.add_argument("--level", type=float, default=0.05)
    parser.add_argument("--budget", type=float, default=None, help="race budget as a share of the grid's tuning cost")
    parser.add_argument("--tuning", type=int, default=64)
    parser.add_argument("--confirm", type=int, default=32)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--quality-sd", type=float, default=0.2)
    parser.add_argument("--reckless", action="store_true", help="no multiplicity correction (negative control)")
    parser.add_argument("--unit-s", type=float, default=None,
                        help="fixed seconds per unit instead of GPU_STAGED's 95 (per-prompt cost unchanged)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    configs = expand("paper", yaml.safe_load((ROOT / "params.yaml").read_text()), ROOT / "sweeps",
                     validate=False).configs
    groups = paper_groups(configs)
    schedule = Schedule(tuple(int(v) for v in args.shards.split(",")), args.level, corrected=not args.reckless)
    cost = GPU_STAGED if args.unit_s is None else CostModel(args.unit_s, GPU_STAGED.prompt_s,
                                                            GPU_STAGED.baseline_unit_s, GPU_STAGED.baseline_prompt_s)
    settings = ConfirmSettings(level=0.05, max_tries=schedule.keep, resamples=200)
    start = time.perf_counter()
    result = simulate_adaptive(groups, schedule, args.sweeps, args.tuning, args.confirm, args.k, settings,
                               cost, budget_fraction=args.budget, quality_sd=args.quality_sd)
    summary = adaptive_summary(result, cost, args.confirm, args.k)
    summary["seconds"] = time.perf_counter() - start
    summary["uniform_h100_h"] = hours(summary, "uniform", schedule, cost, args.tuning, args.confirm, args.k)
    summary["adaptive_h100_h"] = hours(summary, "adaptive", schedule, cost, args.tuning, args.confirm, args.k)
    summary["today_h100_h"] = TODAY_H
    resolved = result.filter(pl.col("uniform_status") != "unresolved").with_columns(
        agree=(pl.col("adaptive_status") == pl.col("uniform_status"))
        & (pl.col("adaptive_pick") == pl.col("uniform_pick")))
    per_constraint = resolved.group_by("max_quality_loss", "min_tamper_resistance").agg(
        resolved=pl.len(), agreement=pl.col("agree").mean()).sort("max_quality_loss", "min_tamper_resistance")
    summary["per_constraint"] = per_constraint.to_dicts()
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **summary}, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **summary}, indent=1))


if __name__ == "__main__":
    main()
