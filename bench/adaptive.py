"""The adaptive (racing) sweep against the uniform grid on the paper grid's shape, simulated, and the paper grid's
cost in H100-hours from the simulation's unit counts x the measured per-unit costs.

    nice -n 19 .venv/bin/python bench/adaptive.py --sweeps 1000 [--rule screen|union] [--shards 4,12,32,64]
        [--level 0.05] [--budget 0.25] [--out FILE]

Per simulated sweep: 1,152 configs (sweeps/paper.yaml) in 16 groups (temperature x sampler) x 4 constraints =
64 cells; synthetic truth (sweep_simulation.config_truth), per-prompt noise of sweep_simulation; tuning
``--tuning`` prompts per task (3 tasks), confirmation ``--confirm`` per task x K runs. Cost: mmw.sweep.adaptive's
cost model (``GPU_STAGED``: one H100, 302.5 s a config and 191 s a baseline at 296 prompts, of which 95 s / 60 s
fixed per unit), baselines per temperature and shard included. The decisions do not depend on the cost model
(without ``--budget``), so one simulation prices them under every fixed cost per unit and packing of the frontier
(``FRONTIER``), and the fixed cost per unit at which the race would cost ``TARGET`` of the grid; and under
``GPU_PACKED`` (packs that decode their configurations together, measured on an H100) as ``decode_together``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from mmw.sweep.cost import GPU_PACKED, GPU_STAGED, CostModel
from mmw.sweep.schedule import Schedule
from mmw.sweep.confirm import Confirmation
from mmw.sweep.definition import expand
from sweep_simulation import UncorrectedSchedule, adaptive_summary, paper_groups, priced, simulate_adaptive

ROOT = Path(__file__).resolve().parent.parent
TEMPERATURES = 4
#: The paper grid as written today (bench/RESULTS.md "Cost model for the paper's grid"): every config on all 296
#: prompts, 24 baselines, ~150 re-evaluations, one H100.
TODAY_H = (1152 * 302.5 + 24 * 191.0 + 150 * 302.5) / 3600
#: Fixed seconds per unit and configurations per unit (1: one each, as the runner does today; 8; 0: every
#: configuration of a group and shard in one unit) the frontier prices.
FRONTIER = [(f, p) for p in (1, 8, 0) for f in (0.0, 10.0, 30.0, 95.0)]
#: The issue's cost target: the race at most this share of the grid's cost.
TARGET = 0.2
DEFAULT_SHARDS = {"screen": "4,12,32,64", "union": "8,24,64"}


def hours(summary: dict[str, float], name: str, schedule: Schedule, cost: CostModel, tuning: int, confirm: int,
          k: int, tasks: int = 3) -> float:
    """H100-hours of one simulated sweep: units (tuning and confirmation) plus baselines (one per temperature and
    tuning shard; K per temperature for confirmation)."""
    shards = [tuning] if name == "uniform" else [schedule.shard(r)[1] for r in range(schedule.rounds)]
    baselines = TEMPERATURES * sum(float(cost.baseline(s * tasks)) for s in shards)
    baselines += TEMPERATURES * k * float(cost.baseline(confirm * tasks))
    return (summary[f"{name}_total_s"] + baselines) / 3600


def break_even(result: pl.DataFrame, per_unit: int, confirm: int, k: int, target: float = TARGET) -> dict[str, str]:
    """The fixed seconds per unit at which the race costs at most ``target`` of the grid (tuning alone, and with
    confirmation), ``per_unit`` configurations to a unit: ``(P_race + F U_race) / (P_grid + F U_grid) <= target``
    solved for ``F >= 0`` (prompt seconds ``P``, units ``U``): ``"F <= x"``, ``"F >= x"``, ``"any"`` or
    ``"none"``."""
    prompts = GPU_STAGED.with_fixed(0.0, per_unit)
    units = CostModel(1.0, 0.0, configs_per_unit=per_unit)
    out = {}
    for part, index in (("tuning", [0]), ("total", [0, 1])):
        p_r, p_g, u_r, u_g = (sum(priced(result, name, model, confirm, k)[i] for i in index)
                              for name, model in (("adaptive", prompts), ("uniform", prompts), ("adaptive", units),
                                                  ("uniform", units)))
        slack, slope = target * p_g - p_r, u_r - target * u_g  # the target holds where slope * F <= slack
        if slope > 0:
            out[part] = f"F <= {slack / slope:.1f} s" if slack >= 0 else "none"
        elif slope < 0:
            out[part] = f"F >= {slack / slope:.1f} s" if slack < 0 else "any"
        else:
            out[part] = "any" if slack >= 0 else "none"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--shards", default=None, help="cumulative tuning prompts per task after each round "
                        f"(default: {DEFAULT_SHARDS})")
    parser.add_argument("--level", type=float, default=0.05)
    parser.add_argument("--rule", choices=("screen", "union"), default="screen", help="the race's elimination rule")
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
    shards = args.shards or DEFAULT_SHARDS[args.rule]
    schedule = (UncorrectedSchedule if args.reckless else Schedule)(
        shards=[int(v) for v in shards.split(",")], level=args.level, rule=args.rule)
    cost = GPU_STAGED if args.unit_s is None else GPU_STAGED.with_fixed(args.unit_s)
    settings = Confirmation(prompts=args.confirm, level=0.05, max_tries=schedule.keep, resamples=200)
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
    n_resolved, n_cells = summary["resolved_cells"], summary["cells"]
    summary["se"] = {"agreement": (summary["agreement"] * (1 - summary["agreement"]) / max(n_resolved, 1)) ** 0.5,
                     **{f"{name}_false": (summary[f"{name}_false"] * (1 - summary[f"{name}_false"]) / n_cells) ** 0.5
                        for name in ("uniform", "adaptive")}}
    units = np.array(result.filter(pl.col("cell") == 0)["adaptive_round_units"].to_list(), dtype=float)
    summary["units_per_round"] = (units.sum(0) / args.sweeps).tolist()  # configurations per round, per sweep
    frontier = []
    if args.budget is None:  # the decisions are the same under every cost model: price them all
        for fixed, per_unit in FRONTIER:
            model = cost.with_fixed(fixed, per_unit)
            priced_summary = adaptive_summary(result, model, args.confirm, args.k)
            frontier.append({"unit_s": fixed, "configs_per_unit": per_unit,
                             "tuning_ratio": priced_summary["tuning_ratio"],
                             "total_ratio": priced_summary["total_ratio"],
                             "uniform_h100_h": hours(priced_summary, "uniform", schedule, model, args.tuning,
                                                     args.confirm, args.k),
                             "adaptive_h100_h": hours(priced_summary, "adaptive", schedule, model, args.tuning,
                                                      args.confirm, args.k)})
        summary["break_even_unit_s"] = {str(p): break_even(result, p, args.confirm, args.k) for p in (1, 8, 0)}
        # The same decisions priced with packs that decode their configurations together (GPU_PACKED: a decode
        # of up to 296 rows costs the same whatever its rows), the runner's `pack: 0` / `pack: 8`.
        summary["decode_together"] = []
        for per_unit in (0, 8):
            model = GPU_PACKED.with_fixed(GPU_PACKED.unit_s, per_unit)
            priced_summary = adaptive_summary(result, model, args.confirm, args.k)
            summary["decode_together"].append({
                "configs_per_unit": per_unit, "tuning_ratio": priced_summary["tuning_ratio"],
                "total_ratio": priced_summary["total_ratio"],
                "uniform_h100_h": hours(priced_summary, "uniform", schedule, model, args.tuning, args.confirm, args.k),
                "adaptive_h100_h": hours(priced_summary, "adaptive", schedule, model, args.tuning, args.confirm,
                                         args.k)})
    summary["frontier"] = frontier
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **summary}, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **summary}, indent=1))


if __name__ == "__main__":
    main()
