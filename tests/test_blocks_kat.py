"""Known answers for SelfHash seeding and DiPmark reweighting, computed independently of mmw.

The reference below is written from the definitions alone (docs/PRF.md: ``prf(s, x) = mix(s ^ mix(x + GOLDEN))``
with splitmix64's finalizer; SelfHash: the unsigned min of the keyed hashes over the window that ends with the
candidate; DiPmark: ``F -> max(F - a, 0) + max(F - (1 - a), 0)`` on the cumulative mass in the keyed order). The
literal vectors were derived from that reference and by hand (the reweighted masses), so a change of the hashing,
the window, the seed derivation, the green rule or the reweighting formula fails here, in the generator's torch
path and in the detector's kernels alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmw.watermark.detector import Detector
from mmw.watermark.randomness import SelfHash
from mmw.watermark.samplers import build_sampler
from mmw.watermark.scheme import SchemeSpec

MASK = (1 << 64) - 1
KEY = 0x0123456789ABCDEF
SELF_TAG = int.from_bytes(b"SELF", "big") << 32  # the SelfHash domain tag: ASCII "SELF" in the high 32 bits
TOKENS = [7, 300, 7, 300, 49151, 0, 12, 12, 12, 300]  # repeated pairs on purpose (deduplication)
WINDOW = 3


def _mix(x: int) -> int:
    """splitmix64's finalizer (Steele, Lea and Flood 2014), written out here, not imported."""
    x &= MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _prf(seed: int, x: int) -> int:
    return _mix((seed & MASK) ^ _mix(x + 0x9E3779B97F4A7C15))


def _unit(h: int) -> float:
    return ((h >> 12) + 0.5) * 2.0**-52


def _selfhash_seeds(tokens: list[int], key: int, window: int) -> list[int]:
    base = _prf(key, SELF_TAG)
    return [min(_prf(base, t) for t in tokens[n - window + 1:n + 1]) for n in range(window - 1, len(tokens))]


# Derived once from the reference above; pinned so that the reference itself cannot drift either.
SELFHASH_BASE = 0x7F4CB23898EDD530
SELFHASH_SEEDS = [0x3B4BB0DF17623478] * 4 + [0xB7AD50C3AA4799F1] * 2 + [0xF4299DBEC16FCEF8, 0x3B4BB0DF17623478]
# C4's green rule (unit < gamma = 0.5) at positions 2..9; positions 7 and 9 repeat (seed, token) pairs.
SELFHASH_GREEN = [False, True, False, False, False, False, True, True]


def test_selfhash_reference_matches_the_pinned_vectors() -> None:
    assert _prf(KEY, SELF_TAG) == SELFHASH_BASE
    assert _selfhash_seeds(TOKENS, KEY, WINDOW) == SELFHASH_SEEDS
    green = [_unit(_prf(s, t)) < 0.5 for s, t in zip(SELFHASH_SEEDS, TOKENS[WINDOW - 1:])]
    assert green == SELFHASH_GREEN


def test_selfhash_detector_seeds_match_the_reference() -> None:
    seeds = SelfHash("selfhash", window=WINDOW).seeds_np(np.asarray(TOKENS, dtype=np.int64), KEY)
    assert [int(s) for s in seeds] == SELFHASH_SEEDS


def test_selfhash_generator_seeds_match_the_reference() -> None:
    """The torch path gives every candidate its own seed; the observed candidate's is the detector's."""
    source = SelfHash("selfhash", window=WINDOW)
    vocab = torch.tensor([0, 7, 12, 300, 49151], dtype=torch.int64)
    for n in range(WINDOW - 1, len(TOKENS)):
        context = torch.tensor([TOKENS[:n]], dtype=torch.int64)
        seeds = source.candidate_seeds_t(context, KEY, vocab)[0].tolist()
        for candidate, seed in zip(vocab.tolist(), seeds):
            expected = _selfhash_seeds(TOKENS[n - WINDOW + 1:n] + [candidate], KEY, WINDOW)[0]
            assert seed & MASK == expected
        assert seeds[vocab.tolist().index(TOKENS[n])] & MASK == SELFHASH_SEEDS[n - WINDOW + 1]


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_selfhash_c4_detection_counts_the_pinned_greens(device: str) -> None:
    """Through the detector (numpy reference and numba kernel): 6 distinct (seed, token) units, 2 of them green."""
    spec = SchemeSpec.from_params(dict(sampler="distribution_shift", delta=2.0, gamma=0.5, randomness="selfhash",
                                       window=WINDOW, score="sum"))
    result = Detector(spec, KEY, 49152, device=device).detect([np.asarray(TOKENS, dtype=np.int64)])[0]
    units = {}
    for seed, token, green in zip(SELFHASH_SEEDS, TOKENS[WINDOW - 1:], SELFHASH_GREEN):
        units.setdefault((seed, token), green)
    assert len(units) == 6 and sum(units.values()) == 2
    assert result.score == -2.0
    # P(Binomial(6, 1/2) >= 2) = 57 / 64
    assert result.pvalue == pytest.approx(57 / 64, rel=1e-12)


# ------------------------------------------------------------------------------------------------ reweighting
SEED = 0xDEADBEEFCAFEF00D
VOCAB = 6
ORDER = [2, 3, 4, 0, 5, 1]  # token ids sorted by unit(prf(SEED, i)): 0.109, 0.116, 0.485, 0.842, 0.922, 0.953
PROBS = [0.05, 0.10, 0.15, 0.20, 0.25, 0.25]  # by token id
# By hand: the mass in ORDER is 0.15 0.20 0.25 0.05 0.25 0.10, F = 0.15 0.35 0.60 0.65 0.90 1.00, and
#   a = 0.5:  2 max(F - 0.5, 0)                     = 0 0 0.20 0.30 0.80 1  -> q = 0 0 0.20 0.10 0.50 0.20
#   a = 0.25: max(F - 0.25, 0) + max(F - 0.75, 0)   = 0 0.10 0.35 0.40 0.80 1 -> q = 0 0.10 0.25 0.05 0.40 0.20
REWEIGHTED = {0.5: [0.0, 0.0, 0.20, 0.10, 0.50, 0.20], 0.25: [0.0, 0.10, 0.25, 0.05, 0.40, 0.20]}


def _sampler(alpha: float, gamma: float = 0.5):
    spec = SchemeSpec.from_params(dict(sampler="reweight", reweight_alpha=alpha, gamma=gamma, randomness="window",
                                       window=1, score="sum"))
    return build_sampler(spec, KEY, VOCAB)


def test_reweight_order_is_the_keyed_uniforms_ascending() -> None:
    units = [_unit(_prf(SEED, i)) for i in range(VOCAB)]
    assert sorted(range(VOCAB), key=units.__getitem__) == ORDER


@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_reweighted_distribution_matches_the_hand_derived_masses(alpha: float) -> None:
    sampler = _sampler(alpha)
    seeds = torch.tensor([SEED - (1 << 64)], dtype=torch.int64)  # the uint64 seed as torch's int64
    order, q = sampler.reweighted(torch.tensor([PROBS], dtype=torch.float64), seeds)
    assert order[0].tolist() == ORDER
    assert q[0].tolist() == pytest.approx(REWEIGHTED[alpha], abs=1e-12)


@pytest.mark.parametrize(("u", "token"), [(0.1, 4), (0.25, 0), (0.5, 5), (0.9, 1)])
def test_reweight_draw_is_the_inverse_cdf_of_the_reweighted_order(u: float, token: int) -> None:
    """alpha = 0.5: cumulative q in ORDER is 0 0 0.2 0.3 0.8 1 over tokens 2 3 4 0 5 1."""
    sampler = _sampler(0.5)
    logits = torch.log(torch.tensor([PROBS], dtype=torch.float64))
    seeds = torch.tensor([SEED - (1 << 64)], dtype=torch.int64)
    assert sampler.choose(logits, seeds, 1.0, torch.tensor([u], dtype=torch.float64)).tolist() == [token]


@pytest.mark.parametrize(("gamma", "greens"), [(0.5, {0, 1, 5}), (0.1, {1, 5})])
def test_reweight_green_list_is_the_last_gamma_of_the_order(gamma: float, greens: set[int]) -> None:
    """DiPmark's detector: a token is green when its keyed uniform is >= 1 - gamma (the end of ORDER, which the
    reweighting favours)."""
    sampler = _sampler(0.5, gamma)
    tokens = np.arange(VOCAB, dtype=np.int64)
    stat = sampler.statistic(tokens, np.full(VOCAB, SEED, dtype=np.uint64))
    assert set(np.flatnonzero(stat == -1.0).tolist()) == greens
    assert {i for i in range(VOCAB) if _unit(_prf(SEED, i)) >= 1.0 - gamma} == greens


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("gamma", [0.5, 0.25])
def test_reweight_detection_counts_the_independent_greens(device: str, gamma: float) -> None:
    """Through the detector (numpy reference and numba kernel), window-1 seeds (pinned in tests/data/kat.json):
    the score is minus the number of distinct (seed, token) units whose keyed uniform is >= 1 - gamma."""
    from mmw.watermark.randomness import SlidingWindow

    spec = SchemeSpec.from_params(dict(sampler="reweight", reweight_alpha=0.5, gamma=gamma, randomness="window",
                                       window=1, score="sum"))
    tokens = np.asarray(TOKENS, dtype=np.int64)
    seeds = [int(s) for s in SlidingWindow("window", window=1).seeds_np(tokens, KEY)]
    units = {(s, int(t)): _unit(_prf(s, int(t))) >= 1.0 - gamma for s, t in zip(seeds, TOKENS[1:])}
    result = Detector(spec, KEY, 49152, device=device).detect([tokens])[0]
    assert result.score == -float(sum(units.values()))
    assert result.n_scored == len(units)
