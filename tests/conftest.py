"""Fixtures shared by several test files."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

# Two worker processes share two cores: one compute thread each (and in the stage processes they start, which
# inherit it before torch loads, so in-process and stage-process numbers keep one float reduction order). Two
# threads a worker left four spinning OpenMP threads on two cores. A test that needs more threads sets them itself.
# One process (`-n 0`) gets the same setting: without it a warm copy of the prefork server (whose torch set its thread
# count at the fork) and a plain stage process judged with different counts, and test_prefork's byte-for-byte
# comparison failed on the ratings (relative differences ~1e-7).
# numba's parallel kernels (kernels/cpu.py) likewise: their OpenMP pool of two threads spun at every region's end
# while the other worker held the second core (test_statistics, test_power and test_size in two workers: 469 CPU-s
# with two numba threads, 365 with one). tests/test_kernels.py runs the CPU twin on two threads in a process of its
# own, so a race between the kernels' threads still fails a test.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
if "torch" in sys.modules:  # a plugin loaded it first: the environment came too late for this process
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
if "numba" in sys.modules:
    sys.modules["numba"].set_num_threads(min(int(os.environ["NUMBA_NUM_THREADS"]),
                                             sys.modules["numba"].config.NUMBA_NUM_THREADS))

# The stage processes the tests' real pipelines start (DVC runs, sweeps, kills) run as warm copies of a server that
# has torch, transformers, numba and scipy imported (mmw.prefork): ~6 s less a stage on the 2-core machine. The
# shared tiny pipeline run (tests/pipeline_repo.py: traced, PYTHONPATH set) and the fault injection run plain stage
# processes, and tests/test_prefork.py holds a run through the server equal to the plain one byte for byte. An idle
# server (~0.5 GB) ends after four minutes: long enough to outlive the gaps between one file's runs (starting one
# takes ~10 s on the 2-core machine, more under load), short enough that few linger.
os.environ.setdefault("MMW_PREFORK", "1")
os.environ.setdefault("MMW_PREFORK_IDLE", "240")

# Research code that is no part of the library (the sweep's simulation study, bench/sweep_simulation.py) lives in
# bench/; its tests import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


# The suite runs in two processes (pytest-xdist, a file at a time: `--dist loadfile` in pyproject.toml), so the
# files that use something machine-wide take a lock for their whole run: `ray stop --force` stops every Ray node on
# the machine, and test_sandbox asserts that no sandboxed program is left running anywhere.
MACHINE_WIDE = {"test_ray": "ray", "test_pack": "ray",
                "test_sandbox": "sandbox", "test_sandbox_escapes": "sandbox", "test_quality": "sandbox"}

# Slowest files first, by the seconds each file took alone in one process (tests/budget.json, written by
# `tests/budget.py --update`), so the two processes do not end on one long file (`--no-loadscope-reorder` hands files
# out in this order): files without a budget keep their order after these. A file that shares a machine-wide lock with
# a slower file goes where the other process has had time to finish that file, so it does not wait for the lock.
_BUDGET_FILE = Path(__file__).with_name("budget.json")
BUDGET = json.loads(_BUDGET_FILE.read_text())["files"] if _BUDGET_FILE.is_file() else {}
WORKERS = 2


def file_order(seconds: dict[str, float]) -> list[str]:
    """Test file stems, slowest first, the later files of each machine-wide lock moved past their slower partner."""
    order = sorted(seconds, key=lambda stem: -seconds[stem])
    for lock in set(MACHINE_WIDE.values()):
        sharing = [stem for stem in order if MACHINE_WIDE.get(stem) == lock]
        for slower, later in zip(sharing, sharing[1:]):
            order.remove(later)
            start = order.index(slower)
            elapsed, at = 0.0, len(order)
            for index in range(start + 1, len(order)):  # the other process works through these meanwhile
                elapsed += seconds[order[index]] / (WORKERS - 1)
                if elapsed >= seconds[slower]:
                    at = index + 1
                    break
            order.insert(at, later)
    return order


SLOW_FILES = file_order({Path(name).stem: entry["seconds"] or 0.0 for name, entry in BUDGET.items()})

#: Tests collected per file this session (before -k/-m deselection), for tests/test_budget.py.
COLLECTED: Counter[str] = Counter()


def pytest_itemcollected(item: pytest.Item) -> None:
    COLLECTED[item.path.name] += 1


@pytest.fixture(scope="session")
def collected_per_file() -> dict[str, int]:
    """Tests collected per file this session, before any -k or -m deselection."""
    return dict(COLLECTED)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(scope="module", autouse=True)
def _machine_wide_lock(request: pytest.FixtureRequest) -> Iterator[None]:
    name = MACHINE_WIDE.get(request.node.path.stem)
    if name is None:
        yield
        return
    with FileLock(Path(tempfile.gettempdir()) / f"mmw-tests-{name}.lock"):
        yield


@pytest.fixture(autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    """A test that changes torch's thread count leaves it as it found it: later tests that compare in-process
    results with a stage run as its own process (packed sweep units) need the same float reduction order."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread (no OpenMP spin-waits on a busy 2-core machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
