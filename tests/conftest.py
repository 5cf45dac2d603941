"""Fixtures shared by several test files."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

# Two worker processes share two cores: one compute thread each (and in the stage processes they start, which
# inherit it before torch loads, so in-process and stage-process numbers keep one float reduction order). Two
# threads a worker left four spinning OpenMP threads on two cores. A test that needs more threads sets them itself.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")
    if "torch" in sys.modules:  # a plugin loaded it first: the environment came too late for this process
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Research code that is no part of the library (the sweep's simulation study, bench/sweep_simulation.py) lives in
# bench/; its tests import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


# The suite runs in two processes (pytest-xdist, a file at a time: `--dist loadfile` in pyproject.toml), so the
# files that use something machine-wide take a lock for their whole run: `ray stop --force` stops every Ray node on
# the machine, and test_sandbox asserts that no sandboxed program is left running anywhere.
MACHINE_WIDE = {"test_ray": "ray", "test_pack": "ray",
                "test_sandbox": "sandbox", "test_sandbox_escapes": "sandbox", "test_quality": "sandbox"}

# Slowest files first (seconds, one process, a 2-core AMD EPYC VM), so the two processes do not end on one long
# file; files not named keep their order after these. The two "ray" files sit apart, so neither waits long for the
# other's lock.
SLOW_FILES = ["test_sweep",  # 931
              "test_ray",  # 576
              "test_faults",  # 427
              "test_selection",  # 348
              "test_statistics",  # 260
              "test_dvc",  # 243
              "test_pack",  # 310
              "test_judge", "test_engine", "test_adaptive", "test_plugins", "test_deps", "test_kernels"]  # 128-173


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
