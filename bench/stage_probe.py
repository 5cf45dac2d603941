"""Run one ``mmw`` command under cProfile and say where its process time went: imports, the stage's own work,
and what is left after it (interpreter exit, CUDA teardown; measured by the caller as wall minus ``end_s``).

    python bench/stage_probe.py OUT_PREFIX generate watermarked --params params.yaml

writes ``OUT_PREFIX.txt`` (the 45 largest cumulative and 30 largest own times) and prints one JSON line,
``{"probe": {"start_s": ..., "end_s": ...}}``: seconds since the process started (from ``/proc/self/stat``)
at which the probe began and ended. ``bench/gpu_fullscale.py --probe`` runs every stage this way.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import runpy
import sys
import time


def process_age_s() -> float:
    """Seconds since this process was created (its start time in /proc is in clock ticks since boot)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    prefix, args = sys.argv[1], sys.argv[2:]
    start = process_age_s()
    t0 = time.perf_counter()
    sys.argv = ["mmw", *args]
    profiler = cProfile.Profile()
    code = 0
    profiler.enable()
    try:
        runpy.run_module("mmw", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        profiler.disable()
    end = start + time.perf_counter() - t0
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
    with open(prefix + ".txt", "w") as f:
        f.write(text.getvalue())
    print(json.dumps({"probe": {"start_s": round(start, 3), "end_s": round(end, 3)}}), flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
