"""Text-dependent randomness at the edges: a text no longer than the window has no seeds, and from one token past
the window on, the detector's seeds (numpy) are the generator's (torch) for every position."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmw.prf import MASK64
from mmw.randomness import MinHash, SlidingWindow

KEY = 0x5EED_1234_ABCD


@pytest.mark.parametrize("source", [SlidingWindow("window", window=3), MinHash("minhash", window=3)],
                         ids=["window", "minhash"])
@pytest.mark.parametrize("length", range(0, 7))
def test_seeds_for_every_scored_position_and_none_before(source, length: int) -> None:
    tokens = np.array([17, 4, 99, 4, 17, 250][:length], dtype=np.int64)
    seeds = source.seeds_np(tokens, KEY)
    assert seeds.dtype == np.uint64 and len(seeds) == max(length - source.window, 0)
    for i, seed in enumerate(seeds):  # position window + i is generated from the window tokens before it
        context = torch.from_numpy(tokens[i:i + source.window]).unsqueeze(0)
        expected = int(source.seeds_t(context, KEY, 0, torch.zeros(1, dtype=torch.int64))[0]) & MASK64
        assert int(seed) == expected, (length, i)
