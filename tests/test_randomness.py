"""Text-dependent randomness at the edges: a text no longer than the window has no seeds, and from one token past
the window on, the detector's seeds (numpy) are the generator's (torch) for every position."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmw.watermark.prf import MASK64
from mmw.watermark.randomness import FixedKey, MinHash, SelfHash, SlidingWindow

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


def test_the_spec_builds_the_source_it_names() -> None:
    """randomness/window in params pick the seeds: window H hashes the H previous tokens in order, minhash H takes
    the minimum of their hashes, and min-hash over one token is built as the window of one (the same scheme; the
    seeds of a MinHash of width 1 would differ by their domain tag). Checked against the committed known-answer
    seeds, so a swapped branch cannot pass."""
    import json
    from pathlib import Path

    from mmw.watermark.randomness import RandomnessSource
    from mmw.watermark.scheme import SchemeSpec

    kat = json.loads((Path(__file__).with_name("data") / "kat.json").read_text())
    tokens = np.array(kat["tokens"], dtype=np.int64)
    cases = {"window_0": ("window", 0), "window_1": ("window", 1), "window_3": ("window", 3),
             "minhash_2": ("minhash", 2), "minhash_4": ("minhash", 4)}
    for name, (randomness, window) in cases.items():
        spec = SchemeSpec.from_params({"sampler": "exponential", "randomness": randomness, "window": window,
                                       "score": "sum"})
        seeds = RandomnessSource.from_spec(spec).seeds_np(tokens, kat["key"])
        assert [int(s) for s in seeds] == kat["seeds"][name], name
    one = SchemeSpec.from_params({"sampler": "exponential", "randomness": "minhash", "window": 1, "score": "sum"})
    assert [int(s) for s in RandomnessSource.from_spec(one).seeds_np(tokens, kat["key"])] == kat["seeds"]["window_1"]
    fixed = SchemeSpec.from_params({"sampler": "exponential", "randomness": "fixed", "key_length": 7,
                                    "score": "align"})
    source = RandomnessSource.from_spec(fixed)
    assert isinstance(source, FixedKey) and source.key_length == 7
    assert [int(s) for s in source.key_sequence(kat["key"])] == kat["fixed"]["sequence"]
    own = SchemeSpec.from_params({"sampler": "exponential", "randomness": "selfhash", "window": 4, "score": "sum"})
    source = RandomnessSource.from_spec(own)
    assert isinstance(source, SelfHash) and source.window == 4 and source.context == 3


def test_fixed_key_seeds_start_at_the_text_unless_shifted() -> None:
    """The detector reads a fixed key from its first entry (shift 0 by default); a shift rotates the sequence."""
    source = FixedKey("fixed", key_length=5)
    sequence = source.key_sequence(KEY)
    tokens = np.arange(12)
    np.testing.assert_array_equal(source.seeds_np(tokens, KEY), sequence[np.arange(12) % 5])
    np.testing.assert_array_equal(source.seeds_np(tokens, KEY, shift=3), sequence[(np.arange(12) + 3) % 5])


def test_selfhash_has_no_single_seed_a_position() -> None:
    """Self-hashing gives each candidate its own seed: asking for one seed a row is a programming error that says
    what to call instead."""
    with pytest.raises(TypeError, match=r"^randomness=selfhash has one seed per candidate: use candidate_seeds_t$"):
        SelfHash("selfhash", window=2).seeds_t(torch.zeros(1, 3, dtype=torch.int64), KEY, 0, torch.zeros(1))


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("length", range(0, 7))
def test_selfhash_seed_is_the_min_hash_over_the_window_that_ends_with_the_candidate(window: int, length: int) -> None:
    """The detector's seed of the token at position n (numpy) is the generator's seed of that candidate (torch, one
    seed per candidate), and both are the unsigned min of prf(prf(k, SELFHASH), t) over T[n-H+1..n], hand-computed
    with python ints. Positions before H - 1 have no seed."""
    from mmw.watermark import prf
    from mmw.watermark.randomness import SelfHash

    source = SelfHash("selfhash", window=window)
    vocab = torch.arange(300, dtype=torch.int64)
    tokens = np.array([17, 4, 99, 4, 17, 250][:length], dtype=np.int64)
    seeds = source.seeds_np(tokens, KEY)
    assert seeds.dtype == np.uint64 and len(seeds) == max(length - window + 1, 0)
    base = prf.prf_int(KEY, prf.SELFHASH)
    for i, seed in enumerate(seeds):
        position = window - 1 + i
        hand = min(prf.prf_int(base, int(t)) for t in tokens[position - window + 1: position + 1])
        context = torch.from_numpy(tokens[i:position]).reshape(1, -1)
        candidates = source.candidate_seeds_t(context, KEY, vocab)
        assert candidates.shape == (1, len(vocab))
        assert int(seed) == hand == int(candidates[0, tokens[position]]) & MASK64, (length, i)
    if length == 6 and window == 3:  # a candidate whose own hash is below the context's takes its own seed
        own = [prf.prf_int(base, c) for c in range(300)]
        floor = min(prf.prf_int(base, int(t)) for t in tokens[3:5])
        assert {int(s) & MASK64 for s in candidates[0]} == {min(h, floor) for h in own}
