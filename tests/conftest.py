"""Fixtures shared by several test files."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Research code that is no part of the library (the sweep's simulation study, bench/sweep_simulation.py) lives in
# bench/; its tests import it from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


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
