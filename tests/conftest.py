"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread (no OpenMP spin-waits on a busy 2-core machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
