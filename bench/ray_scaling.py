"""Wall time of one small sweep on a local Ray cluster with 1 and with 2 worker nodes (1 CPU each), from scratch.

Each run gets a fresh copy of the pipeline (its own DVC cache: no run-cache carried over), the two-config sweep of
tests/test_ray.py, and ``mmw sweep run t --no-reevaluate --ray ADDRESS`` from a plain shell. Prints one JSON line per
run and the ratio. Usage: ``python bench/ray_scaling.py [--nodes 1 2]``.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from pipeline_repo import BIN, plain_shell_env, run  # noqa: E402  (the copy the heavy tests run)
from test_ray import THREADS, _free_port, _repo  # noqa: E402  (the sweep and board the fault test runs)

KEY = "bench-ray-scaling-key-0123456789"


def one(nodes: int, base: Path) -> dict[str, float | int]:
    """Start a head (+ nodes - 1 workers) with 1 CPU each, run the sweep, stop the cluster."""
    repo = _repo(base / f"nodes{nodes}")
    env = plain_shell_env({**THREADS, "MMW_KEY": KEY, "RAY_USAGE_STATS_ENABLED": "0"})
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    ray = str(BIN / "ray")
    port = _free_port()
    common = ["--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", "100000000", "--disable-usage-stats"]
    try:
        subprocess.run([ray, "start", "--head", "--port", str(port), "--include-dashboard", "false", *common],
                       env=env, check=True, capture_output=True)
        for _ in range(nodes - 1):
            subprocess.run([ray, "start", "--address", f"127.0.0.1:{port}", "--dashboard-agent-listen-port",
                            str(_free_port()), "--dashboard-agent-grpc-port", str(_free_port()),
                            "--metrics-export-port", str(_free_port()), "--runtime-env-agent-port",
                            str(_free_port()), *common], env=env, check=True, capture_output=True)
        started = time.perf_counter()
        run(repo, "mmw", "sweep", "run", "t", "--no-reevaluate", "--ray", f"127.0.0.1:{port}",
            env={**THREADS, "MMW_KEY": KEY})
        wall = time.perf_counter() - started
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True)
    return {"nodes": nodes, "configs": 2, "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    walls = {}
    with tempfile.TemporaryDirectory(prefix="mmw-ray-bench-") as base:
        for nodes in args.nodes:
            result = one(nodes, Path(base))
            walls[nodes] = result["wall_s"]
            print(json.dumps(result), flush=True)
    if 1 in walls and len(walls) > 1:
        for nodes, wall in walls.items():
            if nodes != 1:
                print(f"speed-up {nodes} nodes vs 1: {walls[1] / wall:.2f}x")


if __name__ == "__main__":
    main()
