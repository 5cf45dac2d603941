"""The code sandbox: per-program overhead of each isolation mode, and the escape suite's counts per mode.

    nice -n 19 .venv/bin/python bench/sandbox.py --runs 40

Overhead: wall time of :func:`mmw.sandbox.run_python` on a trivial program (``print(1)``), ``--runs`` times per
mode, interleaved (bwrap, unsafe, bwrap, ...) so that load on a shared machine hits both alike; median and
interquartile range. Escapes: every attempt of tests/test_sandbox_escapes.py, hook on and hook bypassed, under
each mode; an attempt counts as succeeded when the suite's detector sees any sign of it.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mmw.sandbox import SandboxLimits, isolation, run_python  # noqa: E402
from test_sandbox_escapes import (  # noqa: E402
    BYPASS,
    LIMITS,
    PROVE_BYPASS,
    attempts,
    escaped,
    make_arena,
    run_as_caller,
)

MODES = ("bwrap", "unsafe")


def overhead(runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for mode in MODES:
        isolation(mode)  # probe outside the timing
    for _ in range(runs):
        for mode in MODES:
            started = time.perf_counter()
            result = run_python("print(1)", SandboxLimits(timeout_s=10, mode=mode))
            times[mode].append(time.perf_counter() - started)
            assert result.passed, result.stderr
    return times


def escapes() -> dict[str, tuple[int, int, list[str]]]:
    """mode -> (attempts tried, attempts that got through, their names)."""
    counts = {}
    with make_arena() as arena:
        for mode in MODES:
            tried, through = 0, []
            for name, source in attempts(arena).items():
                for bypass in (False, True):
                    before = len(arena.accepted)
                    program = (BYPASS + PROVE_BYPASS if bypass else "") + source
                    outcome = run_as_caller(program, replace(LIMITS, mode=mode))
                    tried += 1
                    if escaped(name, outcome, arena, before):
                        through.append(f"{name}{' (hook bypassed)' if bypass else ''}")
                    # A successful write or kill must not count again for the next attempt.
                    for leftover in (arena.outside / "escaped.txt", arena.shm):
                        leftover.unlink(missing_ok=True)
                    if arena.victim.poll() is not None:
                        raise SystemExit(f"{mode}: {name} killed the victim; the remaining counts would be wrong")
            counts[mode] = (tried, len(through), through)
    return counts


#: Writes 1 MiB files into every directory it can until 480 MiB or 5,000 files, then reports what went where.
FILL = """import os
written = {}
for d in ['/', '/etc', '/tmp', '/var/tmp', '/dev/shm', '/run', '/sandbox']:
    for i in range(5000):
        try:
            with open(os.path.join(d, f'fill{i}'), 'wb') as fh:
                fh.write(b'x' * (1 << 20))
            written[d] = written.get(d, 0) + 1
        except OSError:
            break
        if sum(written.values()) >= 480:
            break
print(written)
"""


def fill() -> str:
    """The filesystem-fill check: MiB (files of 1 MiB) that landed per directory, under the quality stage's
    limits with the hook switched off."""
    result = run_python(BYPASS + FILL, replace(LIMITS, mode="bwrap"))
    return result.stdout.strip() or result.stderr[-300:]


def main(runs: int = typer.Option(40, help="programs per mode for the overhead")) -> None:
    for mode, (tried, through, names) in escapes().items():
        print(f"escapes {mode}: {through}/{tried} got through: {', '.join(names) or 'none'}")
    print(f"filesystem fill (MiB written per directory, 1 MiB files): {fill()}")
    for mode, values in overhead(runs).items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(f"overhead {mode}: median {median * 1000:.0f} ms, IQR {q1 * 1000:.0f}-{q3 * 1000:.0f} ms "
              f"({len(values)} runs of print(1)); {isolation(mode).describe()}")


if __name__ == "__main__":
    typer.run(main)
