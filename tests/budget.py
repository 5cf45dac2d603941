"""The test suite's time budget: how many tests each file holds and how long it takes (tests/budget.json).

The README's test command must stay inside its time target on a 2-core machine, so every test file has a measured
budget, and `tests/test_budget.py` fails when a file collects more tests than its budget records (a new test, a new
parametrisation, a new file) until the budget is refreshed with its measured time:

    .venv/bin/python tests/budget.py --update                  # recount every file; time the files that grew or
                                                               # are new (each alone, one process) and no others
    .venv/bin/python tests/budget.py --update --times run.xml  # take every file's seconds from a whole run's
                                                               # JUnit report (pytest ... --junitxml=run.xml)
    .venv/bin/python tests/budget.py --update --count-only     # recount only (a file's old seconds stay; a new
                                                               # file is "not timed")
    .venv/bin/python tests/budget.py                           # print the budget table and the check's verdict

``--update`` also rewrites the per-file table of docs/TESTING.md (between its ``budget`` markers). conftest.py reads
the seconds to hand the slowest files out first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
BUDGET = TESTS / "budget.json"
DOC = REPO / "docs/TESTING.md"
DOC_START, DOC_END = "<!-- budget:start (tests/budget.py --update writes this table) -->", "<!-- budget:end -->"
#: The README's test command on the 2-core CI machine: ``.venv/bin/python -m pytest`` (two worker processes).
TARGET_SECONDS = 20 * 60


def load() -> dict[str, Any]:
    return json.loads(BUDGET.read_text()) if BUDGET.is_file() else {"files": {}}


def file_of(nodeid: str) -> str:
    """``tests/test_x.py::test_y[a]`` -> ``test_x.py`` (the budget's key)."""
    return Path(nodeid.split("::", 1)[0]).name


def over_budget(counts: dict[str, int], budget: dict[str, Any]) -> list[str]:
    """One line per collected file with more tests than its budget records (or none), for the check's message."""
    files = budget.get("files", {})
    problems = []
    for name, count in sorted(counts.items()):
        entry = files.get(name)
        if entry is None:
            problems.append(f"{name}: {count} tests, no budget")
        elif count > entry["tests"]:
            problems.append(f"{name}: {count} tests > budget {entry['tests']}")
    return problems


def collect_counts() -> dict[str, int]:
    """Tests per file, as the README's command collects them (one process; no test runs)."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
    listed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    ids = [line for line in listed.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if listed.returncode != 0 or not ids:
        sys.exit(f"budget: collection failed (exit {listed.returncode}):\n"
                 f"{listed.stdout[-3000:]}{listed.stderr[-3000:]}")
    return dict(Counter(file_of(nodeid) for nodeid in ids))


def junit_seconds(report: Path) -> dict[str, float]:
    """Seconds per test file from a JUnit report (the sum of its test cases' times, setup and teardown included)."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        seconds[_case_file(case.get("classname", ""))] += float(case.get("time") or 0.0)
    return dict(seconds)


def _case_file(classname: str) -> str:
    """``tests.test_x`` or ``tests.test_x.TestGroup`` (JUnit's classname) -> ``test_x.py``."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        if (REPO / Path(*parts[:end])).with_suffix(".py").is_file():
            return parts[end - 1] + ".py"
    return parts[-1] + ".py"


def time_files(names: list[str]) -> dict[str, float]:
    """Run each file alone in one process (``-n 0``), as measured for the budget, and return its seconds."""
    measured = {}
    for name in names:
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "run.xml"
            print(f"budget: timing {name} alone ...", flush=True)
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                            f"--junitxml={report}", f"tests/{name}"], cwd=REPO, timeout=3600)
            measured[name] = round(junit_seconds(report).get(name, 0.0), 1)
    return measured


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    return f"{os.cpu_count()} cores, {cpu}".strip(", ")


def table(budget: dict[str, Any]) -> str:
    files = budget["files"]
    total = sum(entry["seconds"] or 0.0 for entry in files.values())
    lines = ["| file | tests | seconds |", "|---|---:|---:|"]
    for name, entry in sorted(files.items(), key=lambda item: -(item[1]["seconds"] or 0.0)):
        seconds = "not timed" if entry["seconds"] is None else f"{entry['seconds']:,.1f}"
        lines.append(f"| {name} | {entry['tests']} | {seconds} |")
    lines.append(f"| **all {len(files)} files** | **{sum(e['tests'] for e in files.values())}** | **{total:,.0f}** |")
    return "\n".join(lines)


def write_doc(budget: dict[str, Any]) -> None:
    text = DOC.read_text()
    block = f"{DOC_START}\n{table(budget)}\n{DOC_END}"
    pattern = re.compile(re.escape(DOC_START) + ".*?" + re.escape(DOC_END), re.S)
    if not pattern.search(text):
        print(f"budget: {DOC.relative_to(REPO)} has no budget markers; the table is not written there", file=sys.stderr)
        return
    write_atomic(DOC, pattern.sub(lambda _: block, text))


def write_atomic(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.write_text(text)
    os.replace(scratch, path)


def update(times: Path | None, count_only: bool = False) -> dict[str, Any]:
    old = load()
    counts = collect_counts()
    seconds = {name: entry.get("seconds") for name, entry in old["files"].items()}
    if times is not None:
        seconds.update({name: round(value, 1) for name, value in junit_seconds(times).items()})
    elif not count_only:
        changed = sorted(name for name, count in counts.items()
                         if old["files"].get(name, {}).get("tests") != count or seconds.get(name) is None)
        seconds.update(time_files(changed))
    budget = {
        "about": "tests and seconds per test file; written by `.venv/bin/python tests/budget.py --update`",
        "updated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "target_seconds": TARGET_SECONDS,
        "files": {name: {"tests": counts[name], "seconds": seconds.get(name)} for name in sorted(counts)},
    }
    write_atomic(BUDGET, json.dumps(budget, indent=1) + "\n")
    write_doc(budget)
    return budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="recount every file and time the changed ones")
    parser.add_argument("--times", type=Path, help="with --update: seconds per file from this JUnit report")
    parser.add_argument("--count-only", action="store_true", help="with --update: recount, time nothing")
    args = parser.parse_args()
    if (args.times is not None or args.count_only) and not args.update:
        parser.error("--times and --count-only go with --update")
    if args.times is not None and args.count_only:
        parser.error("--times and --count-only exclude each other")
    if args.times is not None and not args.times.is_file():
        parser.error(f"--times: no such file: {args.times}")
    budget = update(args.times, args.count_only) if args.update else load()
    print(table(budget))
    if not args.update:
        problems = over_budget(collect_counts(), budget)
        print("\n".join(problems) if problems else "every file is within its budget")
        sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
