"""Kernel twins against the numpy reference, and every twin against the committed known-answer vectors.

The numba CPU twin runs in this process. The CUDA twin runs through numba's CUDA simulator, which must be switched
on before ``numba.cuda`` is first imported: ``test_cuda_twin_in_simulator`` re-runs this file in a subprocess with
``NUMBA_ENABLE_CUDASIM=1``, where ``TWIN`` is "cuda" and the same tests exercise the CUDA kernels on small inputs.
On a machine with a real GPU, ``pytest -m cuda`` also compares the GPU with the CPU twin at realistic sizes.

Exactness: integers (seeds, unit ids, unit counts, #trials <= observed) and uniforms must be identical; float
statistics may differ from the reference by 1 ulp because each twin uses its platform's ``log`` (numpy's SIMD
code, glibc, libdevice), so scores are compared to 1e-9 relative.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from numba import cuda, njit
from numba.extending import register_jitable

from mmw.watermark import prf
from mmw.watermark.detector import Detector
from mmw.errors import SpecError
from mmw.kernels import prf as kernel_prf
from mmw.kernels import stats
from mmw.kernels.backend import NumbaBackend, SamplerArrays, pack
from mmw.kernels.cuda import BAND, COLUMN_PAD, band_edit_dp
from mmw.watermark.randomness import FixedKey, MinHash, RandomnessSource, SlidingWindow
from mmw.watermark.samplers import build_sampler
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.scores import ReferenceBackend

sys.path.insert(0, str(Path(__file__).parent))
import make_kat  # noqa: E402

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
TWIN = "cuda" if SIMULATOR else "cpu"
#: This file re-run by ``test_cpu_twin_on_two_threads``.
TWO_THREAD_RUN = os.environ.get("MMW_TEST_TWO_THREADS") == "1"
KAT = json.loads(make_kat.PATH.read_text())
VOCAB = 1000
KEY = prf.key_from_string("kernel tests")
TRIALS = 3 if SIMULATOR else 19  # the simulator runs each GPU thread as a Python thread
ALPHA = 0.3

SAMPLERS = {
    "exponential": {"sampler": "exponential"},
    "inverse_transform": {"sampler": "inverse_transform"},
    "binary_huffman": {"sampler": "binary", "binary_code": "huffman"},
    "binary_fixed": {"sampler": "binary", "binary_code": "fixed"},
    "distribution_shift": {"sampler": "distribution_shift", "delta": 2.0, "gamma": 0.3},
    "reweight": {"sampler": "reweight", "reweight_alpha": 0.3, "gamma": 0.3},
    "permute_flip": {"sampler": "permute_flip"},
    "tournament": {"sampler": "tournament", "layers": 30},
    "tournament_decreasing": {"sampler": "tournament", "layers": 30, "layer_weights": "decreasing"},
}
# Every score x randomness combination that SchemeSpec allows (window 0 = constant randomness).
SCHEMES = {
    "sum_window0": {"score": "sum", "randomness": "window", "window": 0},
    "sum_window1": {"score": "sum", "randomness": "window", "window": 1},
    "sum_window3": {"score": "sum", "randomness": "window", "window": 3},
    "sum_minhash1": {"score": "sum", "randomness": "minhash", "window": 1},
    "sum_minhash3": {"score": "sum", "randomness": "minhash", "window": 3},
    "align_L2": {"score": "align", "randomness": "fixed", "key_length": 2},
    "align_L7": {"score": "align", "randomness": "fixed", "key_length": 7},
    "edit_fixed_L5": {"score": "edit", "randomness": "fixed", "key_length": 5, "psi": 0.3},
    "edit_fixed_L40": {"score": "edit", "randomness": "fixed", "key_length": 40, "psi": 0.0},
    "edit_window1": {"score": "edit", "randomness": "window", "window": 1, "psi": 0.7},
    "edit_minhash1": {"score": "edit", "randomness": "minhash", "window": 1, "psi": 2.0},
    "sum_selfhash1": {"score": "sum", "randomness": "selfhash", "window": 1},
    "sum_selfhash4": {"score": "sum", "randomness": "selfhash", "window": 4},
}
if SIMULATOR:  # keep the simulated kernels small: one scheme of each kernel family
    SCHEMES = {k: SCHEMES[k] for k in ("sum_window0", "sum_window1", "sum_minhash3", "align_L7", "edit_fixed_L5",
                                       "edit_window1", "sum_selfhash4")}


def accepted(sampler: str, scheme: str) -> bool:
    """Whether SchemeSpec accepts the combination (it rejects those that cannot detect, e.g. binary x edit)."""
    try:
        make_spec(sampler, scheme)
    except SpecError:
        return False
    return True


def grid(samplers, schemes) -> list[tuple[str, str]]:
    """(sampler, scheme) pairs that SchemeSpec accepts, for parametrization (among the schemes of this run: the
    simulator run keeps a subset)."""
    return [(a, b) for a in samplers for b in schemes if b in SCHEMES and accepted(a, b)]


def make_spec(sampler: str, scheme: str) -> SchemeSpec:
    params = {**SAMPLERS[sampler], **SCHEMES[scheme], "alpha": ALPHA}
    if params["score"] != "sum":
        params["trials"] = TRIALS
    return SchemeSpec.from_params(params)


def random_batch(seed: int) -> list[np.ndarray]:
    """Ragged texts: empty, 1 token, short, long enough for several DP bands, and repeated n-grams (dedup)."""
    rng = np.random.default_rng(seed)
    long = 20 if SIMULATOR else 70
    texts = [rng.integers(0, VOCAB, n) for n in (0, 1, 2, 5, long)]
    motif = rng.integers(0, VOCAB, 3)
    texts.append(np.concatenate([motif, motif, rng.integers(0, VOCAB, 2), motif, motif[:2]]))
    texts.append(np.full(6, rng.integers(0, VOCAB)))
    texts.append(rng.integers(0, 4, 9 if SIMULATOR else 33))  # tiny alphabet: many repeated (seed, token) pairs
    return [t.astype(np.int64) for t in texts]


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0, err_msg=what)


# ---------------------------------------------------------------------------------------------- twin vs reference
@pytest.mark.parametrize("sampler,scheme", grid(SAMPLERS, SCHEMES))
def test_twin_matches_reference(sampler, scheme):
    spec = make_spec(sampler, scheme)
    sampler_obj = build_sampler(spec, KEY, VOCAB)
    source = RandomnessSource.from_spec(spec)
    reference = ReferenceBackend(spec, sampler_obj, source, KEY)
    twin = NumbaBackend(spec, sampler_obj, source, KEY, device=TWIN)
    texts = random_batch(zlib.crc32(f"{sampler}/{scheme}".encode()))
    if spec.score == "sum":
        want, got = reference.sum_prefix_batch(texts), twin.sum_prefix_batch(texts)
    else:
        want, got = reference.empirical_prefix_batch(texts), twin.empirical_prefix_batch(texts)
    assert len(got) == len(texts)
    for b, ((value, integer), (want_value, want_integer)) in enumerate(zip(got, want)):
        assert_close(value, want_value, f"text {b} score")
        assert integer.dtype == want_integer.dtype == np.int64  # counts are integers in both (docs/PRF.md)
        np.testing.assert_array_equal(integer, want_integer, err_msg=f"text {b} count")
    if spec.score == "edit":
        # Twins that agree on a constant prove nothing: the all-gaps path costs 2 n psi, and the DP must find
        # cheaper paths (matches) on the longer texts.
        long = [(v, len(t)) for (v, _), t in zip(want, texts) if len(t) >= 5]
        assert all(v[-1] < 2 * n * spec.psi - 1e-9 for v, n in long), [v[-1] for v, _ in long]


def test_dedup_counts_each_draw_once():
    """A text that repeats one bigram: the window-1 sum has exactly one unit per distinct (previous, token) pair."""
    spec = make_spec("exponential", "sum_window1")
    sampler = build_sampler(spec, KEY, VOCAB)
    backend = NumbaBackend(spec, sampler, RandomnessSource.from_spec(spec), KEY, device=TWIN)
    text = np.array([5, 6, 5, 6, 5, 6, 5, 7], dtype=np.int64)
    total, count = backend.sum_prefix_batch([text])[0]
    np.testing.assert_array_equal(count, [0, 1, 2, 2, 2, 2, 2, 3])  # (5,6), (6,5), then (5,7)
    assert total[3] == total[6] and total[7] < total[6]


@pytest.mark.skipif(SIMULATOR, reason="CPU-only check")
@pytest.mark.parametrize("sampler,scheme", grid(SAMPLERS, ["sum_window1", "sum_minhash3", "align_L7",
                                                             "edit_fixed_L5", "edit_window1", "sum_selfhash4"]))
def test_detector_cpu_matches_reference(sampler, scheme):
    spec = make_spec(sampler, scheme)
    texts = random_batch(7)
    want = Detector(spec, KEY, VOCAB, device="reference").detect(texts)
    got = Detector(spec, KEY, VOCAB, device="cpu").detect(texts)
    for g, w in zip(got, want):
        assert (g.n_tokens, g.n_scored, g.size, g.detected) == (w.n_tokens, w.n_scored, w.size, w.detected)
        assert_close(g.pvalues, w.pvalues, "p-values")
        assert g.score == pytest.approx(w.score, rel=1e-9, abs=0)


def test_watermarked_text_is_detected_by_twin():
    """Power sanity: C1 text generated with the key is detected, the same text under another key is not."""
    spec = SchemeSpec.from_params({"sampler": "exponential", "randomness": "fixed", "key_length": 16,
                                   "score": "align", "trials": TRIALS, "alpha": ALPHA})
    sequence = FixedKey(kind="fixed", key_length=16).key_sequence(KEY)
    # With a flat model, C1 picks argmax_i u_i: the token with the largest keyed uniform at each step.
    candidates = np.arange(VOCAB, dtype=np.uint64)
    tokens = np.array([np.argmax(prf.unit_np(prf.prf_np(sequence[n % 16], candidates))) for n in range(12)])
    marked = Detector(spec, KEY, VOCAB, device=TWIN).detect([tokens])[0]
    other = Detector(spec, prf.key_from_string("another"), VOCAB, device=TWIN).detect([tokens])[0]
    assert marked.pvalue == pytest.approx(1 / (TRIALS + 1)) and marked.detected
    assert marked.score < -50 < other.score  # ~log(1/1000) per token with the key, ~-1 per token without


# ---------------------------------------------------------------------------------------------- GPU traversal on the CPU
@njit
def _band_dp_on_cpu(table, n_rows, columns, shift, psi, steps):
    """The CUDA edit kernel's banded sweep, compiled for the CPU (same register_jitable source)."""
    boundary = np.empty(n_rows + 1)
    out = np.full(n_rows, np.inf)
    up = np.empty(BAND)
    stp = np.empty(BAND)
    seeds = np.empty(BAND, dtype=np.uint64)
    empty_nodes = np.full((1, 1), -1, dtype=np.int64)
    padded = np.empty((n_rows, columns + BAND))  # the kernel's table layout: rows repeat their first BAND entries
    for c in range(columns + BAND):
        padded[:, c] = table[:, c % columns]
    band_edit_dp(n_rows, shift, columns, True, padded.ravel(), np.zeros(n_rows, dtype=np.int64), 0, np.uint64(0),
                 stats.FIXED, psi, steps, boundary, out, up, stp, np.empty(BAND), np.empty(BAND), seeds,
                 stats.EXPONENTIAL, 0.0,
                 np.zeros(1, dtype=np.int64), 1.0, empty_nodes, np.full((1, 1), -1, dtype=np.int8))
    return out


@pytest.mark.skipif(SIMULATOR, reason="CPU-only check")
@pytest.mark.parametrize("n_rows,columns", [(1, 1), (3, 2), (15, 4), (16, 16), (17, 5), (40, 13), (33, 100)])
def test_banded_edit_sweep_equals_row_by_row(n_rows, columns):
    """Bands of columns swept down the rows (GPU order) give the reference's row-by-row diagonal, bit for bit."""
    from mmw.watermark.scores import edit_diagonal

    rng = np.random.default_rng(n_rows * 1000 + columns)
    table = -rng.standard_exponential((n_rows, columns))
    for psi in (0.0, 0.37, 3.0):
        steps = psi * np.arange(n_rows + 1 + COLUMN_PAD)
        for shift in range(min(columns, 3)):
            pair = table[:, (shift + np.arange(n_rows)) % columns]
            np.testing.assert_array_equal(_band_dp_on_cpu(table, n_rows, columns, shift, psi, steps),
                                          edit_diagonal(pair, psi))


# ---------------------------------------------------------------------------------------------- input checks
def test_backend_rejects_bad_input():
    spec = make_spec("exponential", "sum_window1")
    sampler = build_sampler(spec, KEY, VOCAB)
    source = RandomnessSource.from_spec(spec)
    with pytest.raises(SpecError, match="detect.device"):
        NumbaBackend(spec, sampler, source, KEY, device="tpu")
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 1000\)"):
        NumbaBackend(spec, sampler, source, KEY, device=TWIN).sum_prefix_batch([np.array([1, VOCAB])])
    with pytest.raises(SpecError, match="scheme.score"):
        NumbaBackend(spec, sampler, FixedKey(kind="fixed", key_length=4), KEY, device=TWIN)


def test_pack_and_empty_batch():
    tokens, offsets = pack([np.array([1, 2]), np.array([], dtype=np.int64), np.array([3])])
    np.testing.assert_array_equal(tokens, [1, 2, 3])
    np.testing.assert_array_equal(offsets, [0, 2, 2, 3])
    spec = make_spec("exponential", "align_L7")
    backend = NumbaBackend(spec, build_sampler(spec, KEY, VOCAB), RandomnessSource.from_spec(spec), KEY, TWIN)
    assert backend.empirical_prefix_batch([]) == []
    (observed, n_le), = backend.empirical_prefix_batch([np.zeros(0, dtype=np.int64)])
    assert observed.shape == n_le.shape == (0,)


# ---------------------------------------------------------------------------------------------- known answers
def _u64(values) -> np.ndarray:
    return np.array([int(v) for v in values], dtype=np.uint64)


KAT_TOKENS = np.array(KAT["tokens"], dtype=np.int64)
KAT_KEY = np.uint64(KAT["key"])
KAT_SCORED = KAT_TOKENS[1:]
KAT_SEEDS = _u64(KAT["seeds"]["window_1"])
LOG_STATISTICS = ("statistic", "node_statistic")  # transcendental: <= 1 ulp; everything else exact


def kat_samplers() -> dict[str, tuple[SchemeSpec, object]]:
    out = {}
    for name, entry in KAT["statistics"].items():
        if name.startswith("distribution_shift"):
            params = {"sampler": "distribution_shift", "delta": 2.0, "gamma": entry["gamma"]}
        elif name.startswith("binary"):
            params = {"sampler": "binary", "binary_code": name.split("_", 1)[1]}
        else:
            params = {"sampler": name}
        spec = SchemeSpec.from_params({**params, "randomness": "window", "window": 1, "score": "sum"})
        out[name] = (spec, build_sampler(spec, int(KAT_KEY), KAT["vocab_size"]))
    return out


def assert_kat(name: str, field: str, got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if field in LOG_STATISTICS:
        np.testing.assert_array_max_ulp(got, want.astype(np.float64), maxulp=1)
    else:
        np.testing.assert_array_equal(got, want, err_msg=f"{name}.{field}")


@pytest.mark.skipif(SIMULATOR, reason="CPU-only check")
def test_kat_numpy_reference_reproduces_committed_vectors():
    built = make_kat.build()
    for section in ("key", "tokens", "tags", "mix64", "prf", "unit", "seeds", "fixed", "trial_keys"):
        assert built[section] == KAT[section], section
    for name, entry in KAT["statistics"].items():
        for field, want in entry.items():
            assert_kat(name, field, built["statistics"][name][field], want)


def as_t(values) -> torch.Tensor:
    """uint64 values as the int64 tensor with the same bits (the torch twin's representation)."""
    return torch.from_numpy(np.asarray(values, dtype=np.uint64).view(np.int64))


def from_t(tensor: torch.Tensor) -> np.ndarray:
    return tensor.numpy().view(np.uint64)


@pytest.mark.skipif(SIMULATOR, reason="CPU-only check")
def test_kat_torch_twin():
    np.testing.assert_array_equal(from_t(prf.mix64_t(as_t(_u64(KAT["mix64"]["x"])))), _u64(KAT["mix64"]["out"]))
    np.testing.assert_array_equal(from_t(prf.prf_t(as_t(_u64(KAT["prf"]["seed"])), as_t(_u64(KAT["prf"]["x"])))),
                                  _u64(KAT["prf"]["out"]))
    np.testing.assert_array_equal(prf.unit_t(as_t(_u64(KAT["unit"]["h"]))).numpy(), KAT["unit"]["out"])
    tokens = torch.from_numpy(KAT_TOKENS)
    key = int(KAT_KEY)
    for name, source in (("window_0", SlidingWindow(kind="window", window=0)),
                         ("window_1", SlidingWindow(kind="window", window=1)),
                         ("window_3", SlidingWindow(kind="window", window=3)),
                         ("minhash_2", MinHash(kind="minhash", window=2)),
                         ("minhash_4", MinHash(kind="minhash", window=4))):
        h = source.window
        if h == 0:  # constant randomness: any context gives the same seed
            context = tokens[:, None]
        else:  # the seed of position n from the h tokens before it
            context = torch.stack([tokens[n - h: n] for n in range(h, len(tokens))])
        seeds = source.seeds_t(context, key, 0, torch.zeros(len(context), dtype=torch.int64))
        assert seeds.dtype == torch.int64, name  # uint64 bits in int64: the dtype every torch op supports on CUDA
        np.testing.assert_array_equal(from_t(seeds), _u64(KAT["seeds"][name]), err_msg=name)
    fixed = FixedKey(kind="fixed", key_length=KAT["fixed"]["key_length"])
    shift = torch.tensor([KAT["fixed"]["shift"]])
    assert fixed.seeds_t(tokens[None, :1], key, 0, shift).dtype == torch.int64
    got = [int(from_t(fixed.seeds_t(tokens[None, :1], key, n, shift))[0]) for n in range(len(tokens))]
    assert got == KAT["fixed"]["seeds"]
    assert fixed.shifts_for_rows(KAT["fixed"]["row_seeds"]).tolist() == KAT["fixed"]["row_shifts"]
    seeds_t = as_t(KAT_SEEDS)
    scored = torch.from_numpy(KAT_SCORED)
    rows = torch.arange(len(scored))
    for name, (spec, sampler) in kat_samplers().items():
        entry = KAT["statistics"][name]
        if name == "exponential":
            np.testing.assert_array_equal(sampler.uniforms_t(seeds_t)[rows, scored].numpy(), entry["uniform"])
        elif name == "inverse_transform":
            np.testing.assert_array_equal(prf.unit_t(prf.prf_t(seeds_t, prf.SCALAR)).numpy(), entry["v"])
            np.testing.assert_array_equal(sampler.order[:16], entry["order_head"])
        elif name.startswith("binary"):  # the uniform w drawn at each node on the token's path, as choose() does
            nodes = sampler.code.path_nodes[KAT_SCORED]
            valid = nodes >= 0
            w = prf.unit_t(prf.prf_t(seeds_t[:, None], torch.from_numpy(nodes) + prf.NODE)).numpy()
            np.testing.assert_array_equal(w[valid], entry["node_w"])
        else:
            np.testing.assert_array_equal(sampler.green_t(seeds_t)[rows, scored].numpy(), entry["green"])


# Numba twins: one per-index function, two launchers (a CPU loop and a CUDA grid).
@register_jitable
def _kat_scalars(q, mix_in, mix_out, prf_seed, prf_x, prf_out, unit_in, unit_out, key, trial_out, fixed_out,
                 key_length, shift):
    if q < mix_in.shape[0]:
        mix_out[q] = kernel_prf.mix64(mix_in[q])
        prf_out[q] = kernel_prf.prf(prf_seed[q], prf_x[q])
    if q < unit_in.shape[0]:
        unit_out[q] = kernel_prf.unit(unit_in[q])
    if q < trial_out.shape[0]:
        trial_out[q] = stats.key_at(key, q + 1)
    if q < fixed_out.shape[0]:
        fixed_out[q] = stats.fixed_seed(kernel_prf.prf(key, stats.TAG_FIXED), (q + shift) % key_length)


@register_jitable
def _kat_per_token(q, tokens, key, window1, window3, minhash2, minhash4, window0, seeds, kind, gamma, rank,
                   denominator, path_nodes, path_bits, statistic, first_unit_id, first_unit_value):
    """Seeds for position q of tokens, and the statistic / first unit of token q + 1 under seeds[q]."""
    win = stats.source_base(stats.WINDOW, key)
    mh = stats.source_base(stats.MINHASH, key)
    window0[q] = stats.text_seed(stats.WINDOW, tokens, q, 0, win)
    if q >= 1:
        window1[q - 1] = stats.text_seed(stats.WINDOW, tokens, q, 1, win)
    if q >= 3:
        window3[q - 3] = stats.text_seed(stats.WINDOW, tokens, q, 3, win)
    if q >= 2:
        minhash2[q - 2] = stats.text_seed(stats.MINHASH, tokens, q, 2, mh)
    if q >= 4:
        minhash4[q - 4] = stats.text_seed(stats.MINHASH, tokens, q, 4, mh)
    if q < seeds.shape[0]:
        token = tokens[q + 1]
        statistic[q] = stats.token_statistic(kind, token, seeds[q], gamma, rank, denominator, path_nodes,
                                             path_bits)
        h, value = stats.token_unit(kind, token, seeds[q], 0, gamma, rank, denominator, path_nodes, path_bits)
        first_unit_id[q] = h
        first_unit_value[q] = value


def _kat_launchers(twin: str):
    if twin == "cpu":
        @njit
        def scalars(*args):
            for q in range(32):
                _kat_scalars(q, *args)

        @njit
        def per_token(tokens, *args):
            for q in range(tokens.shape[0]):
                _kat_per_token(q, tokens, *args)

        return scalars, per_token

    @cuda.jit
    def scalars_kernel(mix_in, mix_out, prf_seed, prf_x, prf_out, unit_in, unit_out, key, trial_out, fixed_out,
                       key_length, shift):
        _kat_scalars(cuda.grid(1), mix_in, mix_out, prf_seed, prf_x, prf_out, unit_in, unit_out, key, trial_out,
                     fixed_out, key_length, shift)

    @cuda.jit
    def per_token_kernel(tokens, key, window1, window3, minhash2, minhash4, window0, seeds, kind, gamma, rank,
                         denominator, path_nodes, path_bits, statistic, first_unit_id, first_unit_value):
        q = cuda.grid(1)
        if q < tokens.shape[0]:
            _kat_per_token(q, tokens, key, window1, window3, minhash2, minhash4, window0, seeds, kind, gamma, rank,
                           denominator, path_nodes, path_bits, statistic, first_unit_id, first_unit_value)

    return (lambda *args: scalars_kernel[1, 32](*args)), (lambda *args: per_token_kernel[1, 32](*args))


def test_kat_numba_twin():
    """The numba functions (CPU twin here, CUDA twin in the simulator run) reproduce the committed vectors."""
    check_kat_numba(TWIN)


@pytest.mark.cuda
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU")
def test_kat_numba_on_gpu():
    from mmw.kernels.backend import cuda_available

    if not cuda_available():
        pytest.skip("no CUDA GPU")
    check_kat_numba("cuda")


def check_kat_numba(twin: str) -> None:
    scalars, per_token = _kat_launchers(twin)
    mix_in, prf_seed, prf_x = _u64(KAT["mix64"]["x"]), _u64(KAT["prf"]["seed"]), _u64(KAT["prf"]["x"])
    unit_in = _u64(KAT["unit"]["h"])
    mix_out, prf_out = np.zeros_like(mix_in), np.zeros_like(mix_in)
    unit_out = np.zeros(len(unit_in))
    trial_out = np.zeros(len(KAT["trial_keys"]), dtype=np.uint64)
    fixed_out = np.zeros(len(KAT_TOKENS), dtype=np.uint64)
    scalars(mix_in, mix_out, prf_seed, prf_x, prf_out, unit_in, unit_out, KAT_KEY, trial_out, fixed_out,
            KAT["fixed"]["key_length"], KAT["fixed"]["shift"])
    np.testing.assert_array_equal(mix_out, _u64(KAT["mix64"]["out"]))
    np.testing.assert_array_equal(prf_out, _u64(KAT["prf"]["out"]))
    np.testing.assert_array_equal(unit_out, KAT["unit"]["out"])
    np.testing.assert_array_equal(trial_out, _u64(KAT["trial_keys"]))
    np.testing.assert_array_equal(fixed_out, _u64(KAT["fixed"]["seeds"]))

    n = len(KAT_TOKENS)
    for name, (spec, sampler) in kat_samplers().items():
        arrays = SamplerArrays.of(sampler)
        seeds = {k: np.zeros(len(v), dtype=np.uint64) for k, v in KAT["seeds"].items()}
        statistic, first_value = np.zeros(n - 1), np.zeros(n - 1)
        first_id = np.zeros(n - 1, dtype=np.uint64)
        per_token(KAT_TOKENS, KAT_KEY, seeds["window_1"], seeds["window_3"], seeds["minhash_2"], seeds["minhash_4"],
                  seeds["window_0"], KAT_SEEDS, arrays.kind, arrays.gamma, arrays.rank, arrays.denominator,
                  arrays.path_nodes, arrays.path_bits, statistic, first_id, first_value)
        for k, v in seeds.items():
            np.testing.assert_array_equal(v, _u64(KAT["seeds"][k]), err_msg=k)
        entry = KAT["statistics"][name]
        assert_kat(name, "statistic", statistic, entry["statistic"])
        if name == "exponential":
            np.testing.assert_array_equal(first_id, _u64(entry["unit_id"]))
        elif name == "inverse_transform":
            np.testing.assert_array_equal(first_id, KAT_SEEDS)  # C2's draw is identified by the seed alone
        elif name.startswith("binary"):  # the first node of every token is the root
            starts = np.concatenate([[0], np.cumsum(entry["depth"])[:-1]])
            np.testing.assert_array_equal(first_id, _u64(entry["node_id"])[starts])
            assert_kat(name, "node_statistic", first_value, np.asarray(entry["node_statistic"])[starts])
        else:
            np.testing.assert_array_equal(first_value == -1.0, entry["green"])


# ---------------------------------------------------------------------------------------------- e-process
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_anytime_twin_matches_the_reference(sampler):
    """The twin's mixture e-process of a ragged batch (empty texts, texts with no unit yet) equals the numpy
    reference ``mmw.watermark.size``: log e-values to 1e-12 relative, anytime sizes exactly."""
    from mmw.watermark.size import anytime_bets, anytime_log_evalues, anytime_size, anytime_threshold

    spec = make_spec(sampler, "sum_window1")
    rng = np.random.default_rng(zlib.crc32(sampler.encode()))
    lengths = [0, 1, 5, 40, 3, 120] if SIMULATOR else [*rng.integers(0, 300, 60), 0, 1]
    outs = []
    for n in lengths:
        units = max(int(n) - 2, 0)  # the first two tokens carry no unit, as a window's unscored context
        draws = (rng.random(units) < 0.3) * 1.0 if sampler in ("distribution_shift", "reweight") else rng.exponential(size=units)
        if sampler == "tournament":  # a unit is minus its ones among 30 fair g-values
            draws = rng.binomial(30, 0.5, size=units) * 1.0
        if sampler == "tournament_decreasing":  # ... or minus their weighted count, here of marked bits (P(1) = 0.6:
            # the drift of 0.5 per unit is small beside the weighted count's spread)
            draws = ((rng.random((units, 30)) < 0.6) @ np.rint(np.linspace(10, 1, 30))) * 1.0
        # null draws with a watermark-like downward drift of 0.5 per unit, so that some texts cross
        sign = 1.0 if sampler.startswith("binary") else -1.0  # C4 -green, C1/C2 -Exp(1), C3 +Exp(1), -ones
        total = np.concatenate([np.zeros(n - units), np.cumsum(sign * draws - 0.5)])
        outs.append((total, np.concatenate([np.zeros(n - units, np.int64), np.arange(1, units + 1)])))
    bets = anytime_bets(spec)
    backend = Detector(spec, KEY, VOCAB, device=TWIN).backend
    assert isinstance(backend, NumbaBackend) and backend.device == TWIN
    crossed = 0
    for (total, count), (log_e, size) in zip(outs, backend.anytime_batch(outs, bets, anytime_threshold(ALPHA)),
                                             strict=True):
        expected = anytime_log_evalues(total, count, bets)
        np.testing.assert_allclose(log_e, expected, rtol=1e-12, atol=1e-12)
        assert size == anytime_size(expected, ALPHA)
        crossed += size is not None
    assert crossed > 0


# ---------------------------------------------------------------------------------------------- CUDA twin
@pytest.mark.skipif(SIMULATOR, reason="this is the launcher of the simulator run")
def test_cuda_twin_in_simulator():
    """Re-run this file with the CUDA simulator on: every test above then exercises the CUDA kernels."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
                            env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


@pytest.mark.skipif(SIMULATOR or TWO_THREAD_RUN or numba.config.NUMBA_NUM_THREADS > 1,
                    reason="the tests above already run the CPU twin on several threads")
def test_cpu_twin_on_two_threads():
    """The suite runs numba on one thread a worker (tests/conftest.py); re-run this file's CPU tests with two, so a
    race between the parallel kernels' threads (a shared write inside a ``prange``) still fails."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "MMW_TEST_TWO_THREADS": "1"}
    parallel = "(twin or dedup or detector_cpu or pack_and_empty or two_thread_run) and not in_simulator"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
                             "-k", parallel, __file__], env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


@pytest.mark.skipif(not TWO_THREAD_RUN, reason="checks the two-thread run of this file")
def test_the_two_thread_run_computes_on_two_threads():
    assert numba.get_num_threads() == 2


@pytest.mark.cuda
@pytest.mark.skipif(SIMULATOR, reason="needs a real GPU")
@pytest.mark.parametrize("sampler,scheme", grid(SAMPLERS, ["sum_window1", "sum_minhash3", "align_L7",
                                                             "edit_fixed_L40", "edit_window1", "sum_selfhash4"]))
def test_gpu_matches_cpu_twin(sampler, scheme):
    from mmw.kernels.backend import cuda_available

    if not cuda_available():
        pytest.skip("no CUDA GPU")
    spec = make_spec(sampler, scheme)
    sampler_obj = build_sampler(spec, KEY, VOCAB)
    source = RandomnessSource.from_spec(spec)
    rng = np.random.default_rng(3)
    texts = [rng.integers(0, VOCAB, n).astype(np.int64) for n in rng.integers(0, 300, 40)] + random_batch(4)
    cpu = NumbaBackend(spec, sampler_obj, source, KEY, device="cpu")
    gpu = NumbaBackend(spec, sampler_obj, source, KEY, device="cuda")
    method = "sum_prefix_batch" if spec.score == "sum" else "empirical_prefix_batch"
    for (value, integer), (want_value, want_integer) in zip(getattr(gpu, method)(texts), getattr(cpu, method)(texts)):
        assert_close(value, want_value, "score")
        np.testing.assert_array_equal(integer, want_integer)


def test_cached_kernels_are_dropped_where_numba_keeps_them_when_a_source_they_inline_changes(tmp_path, monkeypatch):
    """kernels/disk_cache.py: numba keys a cached kernel by its own file only, so a twin's cache is dropped when the
    spec it inlines changes, in the folder numba really writes (beside the file, or under NUMBA_CACHE_DIR, named
    after the path the file was imported by: here through a link, as mmw/kernels links to kernels/; a real numba
    compile in a subprocess says where), and kept while the sources are the same."""
    from mmw.kernels.disk_cache import cache_folders, drop_stale

    real = tmp_path / "kernels"
    real.mkdir()
    (real / "cpu.py").write_text("from numba import njit\n\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    for name in ("stats.py", "prf.py"):
        (real / name).write_text(f"# {name}\n")
    here = tmp_path / "linked"
    here.symlink_to(real)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba"))

    def compile_twice() -> None:
        subprocess.run([sys.executable, "-c", "import cpu; assert cpu.twice(3) == 6"], cwd=tmp_path, check=True,
                       env={**os.environ, "PYTHONPATH": str(here)})  # imported by the link's path

    compile_twice()
    beside, user = cache_folders(here / "cpu.py")
    assert list(user.glob("cpu.twice-*.nbi")) and not list(beside.glob("*.nb?"))  # numba wrote under NUMBA_CACHE_DIR
    drop_stale(here / "cpu.py")  # never stamped: dropped
    assert not list(user.glob("cpu.*.nb?"))
    compile_twice()
    (user / "cuda.other-1.py311.nbi").write_text("another twin")
    drop_stale(here / "cpu.py")  # the same sources: kept
    assert list(user.glob("cpu.twice-*.nbi")) and list(user.glob("cpu.twice-*.nbc"))
    (real / "stats.py").write_text("# stats.py, changed\n")
    drop_stale(here / "cpu.py")  # the spec changed: dropped, the other twin's kept
    assert not list(user.glob("cpu.*.nb?")) and (user / "cuda.other-1.py311.nbi").exists()
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert cache_folders(here / "cpu.py") == [beside]
