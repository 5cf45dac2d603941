"""The PRF's twins agree on random inputs (the committed known-answer vectors are in test_kernels.py)."""

import numpy as np
import pytest
import torch

from mmw import prf


@pytest.fixture(params=[0, 1, 2])
def rng(request):
    return np.random.default_rng(request.param)


def random_u64(rng, n):
    return rng.integers(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, size=n, dtype=np.uint64)


def test_torch_numpy_python_agree_bitwise(rng):
    seeds, xs = random_u64(rng, 500), random_u64(rng, 500)
    ref = prf.prf_np(seeds, xs)
    got = prf.prf_t(torch.from_numpy(seeds.view(np.int64)), torch.from_numpy(xs.view(np.int64))).numpy().view(np.uint64)
    np.testing.assert_array_equal(ref, got)
    for s, x, r in zip(seeds[:50], xs[:50], ref[:50]):
        assert prf.prf_int(int(s), int(x)) == int(r)
    np.testing.assert_array_equal(prf.unit_np(ref), prf.unit_t(torch.from_numpy(ref.view(np.int64))).numpy())


def test_unit_strictly_inside_open_interval():
    extremes = np.array([0, 1, 2**12 - 1, 2**64 - 1, 2**64 - 2**12], dtype=np.uint64)
    u = prf.unit_np(extremes)
    assert np.all(u > 0) and np.all(u < 1)
    assert np.all(np.log(u) > -np.inf) and np.all(np.log(1 - u) > -np.inf)


def test_unit_is_uniform():
    from scipy import stats

    u = prf.unit_np(prf.prf_np(np.uint64(7), np.arange(200_000, dtype=np.uint64)))
    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_bits_are_balanced_and_avalanche():
    """Each output bit is ~fair, and flipping one input bit flips ~half the output bits."""
    xs = np.arange(100_000, dtype=np.uint64)
    h = prf.prf_np(np.uint64(123), xs)
    bits = (h[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    frac = bits.mean(axis=0)
    assert np.all(np.abs(frac - 0.5) < 5 * 0.5 / np.sqrt(len(xs)))
    flipped = prf.prf_np(np.uint64(123), xs ^ np.uint64(1))
    changed = np.unpackbits((h ^ flipped).view(np.uint8)).reshape(len(xs), 64).sum(1)
    assert abs(changed.mean() - 32) < 0.1


def test_unsigned_min_matches_numpy():
    rng = np.random.default_rng(5)
    x = random_u64(rng, 4 * 7).reshape(4, 7)
    got = prf.unsigned_min_t(torch.from_numpy(x.view(np.int64)), dim=1).numpy().view(np.uint64)
    np.testing.assert_array_equal(got, x.min(axis=1))


def test_key_from_string_is_stable_and_distinct():
    assert prf.key_from_string("a") == prf.key_from_string("a")
    assert prf.key_from_string("a") != prf.key_from_string("b")
    assert 0 <= prf.key_from_string("secret") < 2**64
