"""The PRF's twins agree on random inputs (the committed known-answer vectors are in test_kernels.py)."""

import numpy as np
import pytest
import torch

from mmw.watermark import prf


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


# ---------------------------------------------------------------------------------------------- independent vectors
# Published SplitMix64 outputs (Vigna's splitmix64.c; Rosetta Code "Pseudo-random numbers/Splitmix64" for seed
# 1234567). Output k of the generator seeded with s is mix64(s + k * GOLDEN). They come from outside this project,
# so a bug shared by every twin (and by the vectors in tests/data/kat.json, which the numpy reference generated)
# cannot hide behind them.
PUBLISHED = {
    0: [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC, 0x1B39896A51A8749B],
    1234567: [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
              16408922859458223821],
}
# mix64(0) = 0 (every step of the finalizer maps 0 to 0), so prf(y, -GOLDEN) = mix64(y ^ mix64(0)) = mix64(y):
# the keyed PRF reproduces the bare finalizer at this one input.
NEG_GOLDEN = (1 << 64) - prf.GOLDEN


def published_cases() -> list[tuple[int, int]]:
    """(finalizer input s + k * GOLDEN mod 2^64, published output)."""
    return [((seed + (k + 1) * prf.GOLDEN) % (1 << 64), out)
            for seed, outs in PUBLISHED.items() for k, out in enumerate(outs)]


def test_python_and_numpy_reproduce_published_splitmix64():
    for y, want in published_cases():
        assert prf.mix64_int(y) == want
        assert prf.prf_int(y, NEG_GOLDEN) == want
    ys = np.array([y for y, _ in published_cases()], dtype=np.uint64)
    wants = np.array([w for _, w in published_cases()], dtype=np.uint64)
    np.testing.assert_array_equal(prf.mix64_np(ys), wants)
    np.testing.assert_array_equal(prf.prf_np(ys, np.uint64(NEG_GOLDEN)), wants)


def test_torch_reproduces_published_splitmix64():
    ys = torch.tensor([prf.to_signed(y) for y, _ in published_cases()], dtype=torch.int64)
    wants = np.array([w for _, w in published_cases()], dtype=np.uint64)
    np.testing.assert_array_equal(prf.mix64_t(ys).numpy().view(np.uint64), wants)
    np.testing.assert_array_equal(prf.prf_t(ys, NEG_GOLDEN).numpy().view(np.uint64), wants)


def test_numba_reproduces_published_splitmix64():
    from numba import njit

    from mmw.kernels import prf as kernel_prf

    @njit
    def run(ys, x):
        out = np.empty_like(ys)
        for i in range(len(ys)):
            out[i] = kernel_prf.prf(ys[i], x)
        return out

    ys = np.array([y for y, _ in published_cases()], dtype=np.uint64)
    wants = np.array([w for _, w in published_cases()], dtype=np.uint64)
    np.testing.assert_array_equal(run(ys, np.uint64(NEG_GOLDEN)), wants)


def test_prf_is_keyed_on_the_inner_value():
    """prf(s, x) = mix64(s ^ mix64(x + GOLDEN)): with s = 0 and x = seed + k*GOLDEN, the inner value is published
    output k + 1, so the result is the finalizer of that published number (the key XOR is in the right place)."""
    for seed, outs in PUBLISHED.items():
        for k in range(len(outs) - 1):
            x = (seed + k * prf.GOLDEN) % (1 << 64)
            assert prf.prf_int(0, x) == prf.mix64_int(outs[k])
            assert prf.prf_int(outs[k], x) == 0  # s ^ inner = 0, and mix64(0) = 0


def test_unit_hand_derived_values():
    """unit(h) = ((h >> 12) + 0.5) * 2^-52: the ends of the range and the midpoint, worked by hand."""
    h = np.array([0, (1 << 12) - 1, 1 << 12, 1 << 63, (1 << 64) - 1], dtype=np.uint64)
    want = [2.0**-53, 2.0**-53, 1.5 * 2.0**-52, 0.5 + 2.0**-53, 1.0 - 2.0**-53]
    assert prf.unit_np(h).tolist() == want
    assert prf.unit_t(torch.from_numpy(h.view(np.int64))).tolist() == want
    assert [prf.unit_int(int(v)) for v in h] == want


def test_key_from_string_is_blake2b_of_the_utf8_key():
    """Hand-checkable: the key is the little-endian 64-bit BLAKE2b digest of the key's UTF-8 bytes."""
    import hashlib

    digest = hashlib.blake2b("mmw-benchmark-public-key".encode(), digest_size=8).digest()
    assert prf.key_from_string("mmw-benchmark-public-key") == sum(b << (8 * i) for i, b in enumerate(digest))


def test_python_int_inputs_at_the_sign_boundary():
    """prf_t reads python ints as uint64 values: 2^63 (the first value whose int64 bit pattern is negative) and
    2^64 - 1 must give the numpy reference's outputs, as seed and as input."""
    for value in (2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1):
        want = int(prf.prf_np(np.uint64(value), np.uint64(5)))
        got = prf.prf_t(value, torch.tensor([5], dtype=torch.int64)).numpy().view(np.uint64)[0]
        assert int(got) == want, value
        want = int(prf.prf_np(np.uint64(7), np.uint64(value)))
        got = prf.prf_t(torch.tensor([7], dtype=torch.int64), value).numpy().view(np.uint64).reshape(-1)[0]
        assert int(got) == want, value
        assert prf.to_signed(value) == int(np.uint64(value).view(np.int64))


def test_domain_tags_are_the_documented_ascii_words():
    """docs/PRF.md: each domain tag is its four ASCII letters read big-endian, times 2^32 (so never a token id)."""
    documented = {"WIND": 0x57494E44, "MINH": 0x4D494E48, "FIXD": 0x46495844, "SCAL": 0x5343414C, "NODE": 0x4E4F4445,
                  "PERM": 0x5045524D, "TRIL": 0x5452494C, "SHFT": 0x53484654, "SKIP": 0x534B4950, "SMPL": 0x534D504C,
                  "SELF": 0x53454C46}
    constants = [prf.WINDOW, prf.MINHASH, prf.FIXED, prf.SCALAR, prf.NODE, prf.PERM, prf.TRIAL, prf.SHIFT, prf.SKIP,
                 prf.SAMPLE, prf.SELFHASH]
    for (word, value), constant in zip(documented.items(), constants, strict=True):
        assert prf._tag(word) == value << 32 == constant, word
