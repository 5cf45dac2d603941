"""The tournament sampler (SynthID-Text): its exact distribution against a brute-force tournament, the chunked form
of that law against the layer-by-layer one (and its CUDA kernels, in numba's simulator), distortion over
keys in both modes, the repeated-context mask, its exact null and anytime e-process (mean and weighted mean
score), and its validation."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats
from typer.testing import CliRunner

from mmw.watermark import nulls, prf
from mmw.calibration import binomial_band, false_positive_rate, generate_synthetic, null_sequences, \
    uniform_subset_model
from mmw.cli import app
from mmw.watermark.detector import Detector
from mmw.errors import SpecError
from mmw.watermark.processor import WatermarkStep, row_state
from mmw.watermark.samplers import build_sampler
from mmw.watermark.samplers.base import Plain, inverse_cdf
from mmw.watermark.samplers.parts import decreasing_weights
from mmw.watermark.samplers.tournament import CHUNKED_FROM_VOCAB, g_values_np, tournament_probs, tournament_probs_chunked
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import anytime_bets

KEY = prf.key_from_string("tournament tests")
VOCAB = 1000
ALPHA = 0.02
ROOT = Path(__file__).resolve().parents[1]
SMALL_LOGITS = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))


def spec_of(**extra) -> SchemeSpec:
    return SchemeSpec.from_params({"sampler": "tournament", "randomness": "window", "window": 1, "score": "sum",
                                   "alpha": ALPHA, **extra})


# ---------------------------------------------------------------------------------------------- exact distribution
def brute_force(p: np.ndarray, g: np.ndarray, leaves: int) -> np.ndarray:
    """The winner's law of a tournament played out: leaves ** m candidates drawn i.i.d. from p; round l splits the
    survivors into matches of ``leaves`` and each match's winner is drawn uniformly among its players with the
    largest g_l. p: [V]; g: 0/1 [V, m] -> [V]."""
    v, m = g.shape
    out = np.zeros(v)
    for candidates in itertools.product(range(v), repeat=leaves ** m):
        weight = np.prod(p[list(candidates)])
        # The law of the survivor of each subtree, as a vector over tokens (ties broken uniformly).
        survivors = [np.eye(v)[c] for c in candidates]
        for layer in range(m):
            nxt = []
            for q in range(0, len(survivors), leaves):
                law = np.zeros(v)
                for picks in itertools.product(*[np.flatnonzero(s) for s in survivors[q: q + leaves]]):
                    chance = np.prod([survivors[q + i][t] for i, t in enumerate(picks)])
                    best = max(g[t, layer] for t in picks)
                    winners = [t for t in picks if g[t, layer] == best]
                    for t in winners:
                        law[t] += chance / len(winners)
                nxt.append(law)
            survivors = nxt
        out += weight * survivors[0]
    return out


@pytest.mark.parametrize("leaves,layers", [(2, 1), (2, 3), (3, 1), (4, 1)])
def test_exact_distribution_equals_a_played_out_tournament(leaves, layers):
    rng = np.random.default_rng(leaves * 10 + layers)
    p = rng.dirichlet(np.ones(3))
    for _ in range(3):
        hashes = rng.integers(-2**63, 2**63 - 1, size=3, dtype=np.int64)
        bits = ((hashes.view(np.uint64)[:, None] >> np.arange(63, 63 - layers, -1).astype(np.uint64)) & 1)
        played = brute_force(p, bits.astype(int), leaves)
        exact = tournament_probs(torch.from_numpy(p)[None], torch.from_numpy(hashes)[None], layers, leaves)[0]
        np.testing.assert_allclose(exact.numpy(), played, rtol=1e-12, atol=1e-15)
        chunked = tournament_probs_chunked(torch.from_numpy(p)[None], torch.from_numpy(hashes)[None], layers, leaves,
                                           chunk_bits=2)[0]
        np.testing.assert_allclose(chunked.numpy(), played, rtol=1e-12, atol=1e-15)


def random_law(rows: int, vocab: int, scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """probs float64 [rows, vocab] (softmax of Gaussian logits times ``scale``), row seeds, and the PRF hashes."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * scale, -1)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=gen)
    return probs, seeds, prf.prf_t(seeds.unsqueeze(-1), torch.arange(vocab).unsqueeze(0))


@pytest.mark.parametrize("layers,leaves,chunk_bits", [(30, 2, 10), (30, 2, 7), (7, 3, 3), (30, 4, 10), (64, 2, 10)])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_chunked_law_equals_the_layer_by_layer_law(layers, leaves, chunk_bits, scale):
    """Same law up to rounding: flat and peaked rows, uneven last chunks, the distortionary mode, m = 64."""
    probs, _, hashes = random_law(4, 3000, scale, layers * 10 + leaves)
    reference = tournament_probs(probs, hashes, layers, leaves)
    chunked = tournament_probs_chunked(probs, hashes, layers, leaves, chunk_bits)
    assert float((chunked - reference).abs().sum(-1).max()) < 1e-12


def test_chunked_law_does_not_depend_on_the_token_order():
    """Integer histograms: the law of a token is bit-identical whatever order the vocabulary is summed in (a GPU's
    atomic adds land in any order)."""
    probs, _, hashes = random_law(3, 5000, 3.0, 5)
    order = torch.randperm(5000, generator=torch.Generator().manual_seed(1))
    law = tournament_probs_chunked(probs, hashes, 30, 2)
    assert torch.equal(tournament_probs_chunked(probs[:, order], hashes[:, order], 30, 2), law[:, order])


def test_a_large_vocabulary_draws_the_same_tokens_as_the_layer_by_layer_law():
    """At a vocabulary that takes the chunked form, ``choose`` gives the layer-by-layer law's inverse-CDF token on
    every row, and ``choose_or_plain`` the plain sampler's token on the plain rows."""
    vocab, rows = CHUNKED_FROM_VOCAB * 2, 32
    sampler = build_sampler(spec_of(layers=30), KEY, vocab)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=gen)
    u = torch.rand(rows, generator=gen, dtype=torch.float64)
    hashes = prf.prf_t(seeds.unsqueeze(-1), torch.arange(vocab).unsqueeze(0))
    reference = inverse_cdf(tournament_probs(torch.softmax(logits.double() / 0.7, -1), hashes, 30, 2), u)
    assert torch.equal(sampler.choose(logits, seeds, 0.7, u), reference)
    plain_rows = torch.arange(rows) % 3 == 0
    plain = Plain(None, 0, vocab).choose(logits, None, 0.7, u)
    assert torch.equal(sampler.choose_or_plain(logits, seeds, 0.7, u, plain_rows),
                       torch.where(plain_rows, plain, reference))


SIMULATED_KERNELS = """
import numpy as np, torch
from mmw.watermark import prf
from mmw.kernels import tournament as kernels
from mmw.watermark.samplers.tournament import FIXED_POINT, apply_tables, scatter_histogram
gen = torch.Generator().manual_seed(3)
rows, vocab = 2, 700
probs = torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 3, -1)
seeds = torch.randint(-2**62, 2**62, (rows,), generator=gen)
hashes = prf.prf_t(seeds.unsqueeze(-1), torch.arange(vocab).unsqueeze(0))
for n_tables, start, width in [(0, 0, 10), (1, 10, 10), (2, 20, 5), (4, 40, 10)]:  # 4: one table not cached
    tables = [torch.rand(rows, 1024, generator=gen, dtype=torch.float64) * 2 for _ in range(n_tables)]
    stacked = (torch.stack(tables) if tables else torch.ones(1, rows, 1024, dtype=torch.float64)).numpy()
    partial = np.zeros((rows, 3, 1 << width), dtype=np.int64)
    kernels._histogram_kernel[(3, rows), 32](probs.numpy(), seeds.numpy(), stacked, n_tables, 10, start, width,
                                             FIXED_POINT, partial)
    assert np.array_equal(partial.sum(1), scatter_histogram(probs, hashes, tables, start, width).numpy()), start
for widths in [(10, 10, 10), (10, 7), (3,), (10, 10, 10, 10, 3)]:
    tables = [torch.rand(rows, 1 << w, generator=gen, dtype=torch.float64) * 2 for w in widths]
    padded = torch.stack([torch.nn.functional.pad(t, (0, 1024 - t.shape[-1]), value=1.0) for t in tables])
    out = np.zeros((rows, vocab))
    kernels._apply_kernel[(3, rows), 32](probs.numpy(), seeds.numpy(), padded.numpy(), len(widths), 10, widths[-1],
                                         out)
    assert np.array_equal(out, apply_tables(probs, hashes, tables).numpy()), widths
print("ok")
"""


def test_cuda_kernels_equal_the_torch_passes_in_the_simulator():
    """The CUDA histogram and last pass (``mmw.kernels.tournament``), run by numba's CUDA simulator on a small
    vocabulary with several blocks a row, with factor tables cached in shared memory and beyond the cache:
    bit-identical to the torch passes the CPU runs."""
    pytest.importorskip("numba")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    result = subprocess.run([sys.executable, "-c", SIMULATED_KERNELS], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


SIMULATED_DRAW = """
import itertools
import numpy as np, torch
from mmw.watermark import prf
from mmw.kernels import tournament as kernels
from mmw.watermark.samplers.base import inverse_cdf
from mmw.watermark.samplers.tournament import FIXED_POINT, chunk_table, scatter_histogram, tournament_probs
kernels.THREADS, kernels.PICK_THREADS, kernels.PICK_RUN = 32, 32, 4
# 16 table threads: two bins a thread in the 32-bin chunks, idle threads in the 8-bin one; 5 segments pad to 8
kernels.TABLE_THREADS = 16
gen = torch.Generator().manual_seed(3)
rows, vocab = 4, 700
probs = torch.softmax(torch.randn(rows, vocab, generator=gen, dtype=torch.float64)
                      * torch.tensor([[1.0], [3.0], [8.0], [3.0]], dtype=torch.float64), -1)
probs[3, 600:] = 0.0  # a tail of zero mass, as a masked vocabulary has
probs[3] /= probs[3].sum()
seeds = torch.randint(-2**62, 2**62, (rows,), generator=gen)
hashes = prf.prf_t(seeds.unsqueeze(-1), torch.arange(vocab).unsqueeze(0))
fixed = torch.floor(probs * FIXED_POINT + 0.5)
assert (fixed == 0).sum() > 100 and (fixed >= 2.0 ** 32).sum() > 100  # tokens of no add, of one and of two
# 32-bit halves, any number of reads in flight (3: the last group of a segment part-filled), the adds of a zero mass
# made or skipped: scatter_add_'s integers
for (n_tables, start, width), unroll, skip_zero in itertools.product([(0, 0, 10), (2, 20, 5)], [1, 3],
                                                                      [False, True]):
    tables = [torch.rand(rows, 1024, generator=gen, dtype=torch.float64) * 2 for _ in range(n_tables)]
    stacked = (torch.stack(tables) if tables else torch.ones(1, rows, 1024, dtype=torch.float64)).numpy()
    partial, totals = np.zeros((rows, 3, 1 << width), dtype=np.int64), np.zeros((rows, 3), dtype=np.int64)
    kernels.histogram32_kernel(unroll, skip_zero=skip_zero)[(3, rows), 32](
        probs.numpy(), seeds.numpy(), stacked, n_tables, 10, start, width, FIXED_POINT, partial, totals)
    assert np.array_equal(partial.sum(1), scatter_histogram(probs, hashes, tables, start, width).numpy()), start
    if start == 0:  # the segments' masses, for the plain rows
        assert np.array_equal(totals, partial.sum(2))
layers, leaves, chunk_bits = 13, 4, 5  # three chunks, the last one narrower; the distortionary mode
tables = np.zeros((3, rows, 1 << chunk_bits))
partial, totals = np.zeros((rows, 5, 1 << chunk_bits), dtype=np.int64), np.zeros((rows, 5), dtype=np.int64)
sums, out = np.zeros((rows, 5)), np.full(rows, -1, dtype=np.int64)
law = tournament_probs(probs, hashes, layers, leaves)
for u, kernels.HISTOGRAM_SKIP_ZERO in [(torch.rand(rows, generator=gen, dtype=torch.float64), False),
                                      (torch.tensor([1e-12, 1 - 1e-12, 0.5, 1 - 1e-13], dtype=torch.float64), True)]:
    plain = torch.tensor([0, 1, 0, 1] if u[0] > 1e-9 else [1, 0, 1, 0], dtype=torch.uint8)
    kernels.launch_choose(probs.numpy(), seeds.numpy(), u.numpy(), plain.numpy(), tables, partial, totals, sums,
                          out, layers, leaves, chunk_bits, FIXED_POINT)
    drawn = torch.where(plain.bool().unsqueeze(-1), probs, law)
    assert np.array_equal(out, inverse_cdf(drawn, u).numpy()), (out, inverse_cdf(drawn, u))
    segments = drawn.reshape(rows, 5, 140).sum(-1).numpy()  # each segment's mass, from the histograms
    np.testing.assert_allclose(sums, segments, rtol=1e-9, atol=1e-13)
reference = []
for c, width in enumerate([5, 5, 3]):
    reference.append(chunk_table(scatter_histogram(probs, hashes, reference, 5 * c, width, 5), width, leaves))
    np.testing.assert_allclose(tables[c, :, : 1 << width], reference[-1].numpy(), rtol=1e-9)
    assert np.all(tables[c, :, 1 << width:] == 1.0)
print("ok")
"""


def test_cuda_fused_draw_equals_the_inverse_cdf_of_the_law_in_the_simulator():
    """The draw that never writes the law (``mmw.kernels.tournament.choose``: histograms over contiguous segments
    with 32-bit halves, the tables and the segments' masses in a kernel, a scan of one segment), in numba's CUDA
    simulator: its histograms are bit-identical to ``scatter_add_``'s (with the adds of a token of zero fixed-point
    mass made or skipped: ``skip_zero``), its tables and segment masses equal the torch
    law's to rounding, and its token is ``inverse_cdf`` of the layer-by-layer law on every row (plain rows: of the
    model's own law), at u near 0 and 1, with a zero tail."""
    pytest.importorskip("numba")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    result = subprocess.run([sys.executable, "-c", SIMULATED_DRAW], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


SIMULATED_BINNED_LAW = """
import numpy as np, torch
from mmw.watermark import prf
from mmw.kernels import softmax, tournament as kernels
from mmw.watermark.samplers.tournament import FIXED_POINT, scatter_histogram
softmax.THREADS, kernels.THREADS, kernels.PICK_THREADS, kernels.PICK_RUN, kernels.TABLE_THREADS = 8, 32, 32, 4, 16
gen = torch.Generator().manual_seed(5)
rows, vocab, segments = 4, 500, 5
logits = torch.randn(rows, vocab, generator=gen) * torch.tensor([[1.0], [3.0], [8.0], [3.0]])
logits[3, 400:] = -float("inf")  # a masked tail: no mass, no add
seeds = torch.randint(-2**62, 2**62, (rows,), generator=gen)
hashes = prf.prf_t(seeds.unsqueeze(-1), torch.arange(vocab).unsqueeze(0))
u = torch.rand(rows, generator=gen, dtype=torch.float64)
plain = np.array([0, 1, 0, 0], dtype=np.uint8)
for temperature, layers, chunk_bits in ((1.0, 4, 5), (0.7, 13, 5)):  # one chunk narrower than chunk_bits; three
    def law(binned):
        probs, entropy, spike = np.zeros((rows, vocab)), np.zeros(rows), np.zeros((rows, segments))
        softmax.launch_law(logits.numpy(), temperature, np.zeros((rows, segments, softmax.FIELDS)),
                           np.zeros((rows, softmax.FIELDS)), probs, entropy, spike, 0, binned)
        return probs, entropy, spike.sum(1)
    width = min(chunk_bits, layers)
    bins, totals = np.zeros((rows, segments, 1 << width), np.int64), np.zeros((rows, segments), np.int64)
    binned, plain_law = law((seeds.numpy(), width, FIXED_POINT, bins, totals)), law(None)
    for a, b in zip(binned, plain_law):  # the law and the entropies: the same bits
        assert np.array_equal(a, b)
    probs = torch.from_numpy(binned[0])
    # the first pass as the draw computes it from the written law, segment by segment
    separate, separate_totals = np.zeros_like(bins), np.zeros_like(totals)
    kernels.histogram32_kernel(2)[(segments, rows), 32](probs.numpy(), seeds.numpy(), np.ones((1, rows, 1024)), 0,
                                                        chunk_bits, 0, width, FIXED_POINT, separate, separate_totals)
    assert np.array_equal(bins, separate) and np.array_equal(totals, separate_totals)
    assert np.array_equal(bins.sum(1), scatter_histogram(probs, hashes, [], 0, width).numpy())
    draws = []
    for first in (None, bins):
        n_chunks = -(-layers // chunk_bits)
        tables = np.zeros((n_chunks, rows, 1 << chunk_bits))
        partial = np.zeros((rows, segments, 1 << chunk_bits), np.int64)
        sums, out = np.zeros((rows, segments)), np.full(rows, -1, dtype=np.int64)
        kernel_totals = totals.copy() if first is not None else np.zeros_like(totals)
        kernels.launch_choose(probs.numpy(), seeds.numpy(), u.numpy(), plain, tables, partial, kernel_totals, sums,
                              out, layers, 2, chunk_bits, FIXED_POINT, 0, first)
        draws.append((out, tables, sums))
    for a, b in zip(*draws):  # with the first pass given: the same tables, segment masses and tokens
        assert np.array_equal(a, b)
print("ok")
"""


def test_the_softmax_pass_gives_the_draws_first_histogram_in_the_simulator():
    """The step's pass that writes the law (``mmw.kernels.softmax``'s ``binned_law_kernel``) also computes the
    tournament draw's first histogram pass, in numba's CUDA simulator at T = 1 and 0.7 with a masked tail: the law
    and entropies are bit-identical to the pass without it, its histogram and segment masses equal the draw's own
    first pass over the written law (and ``scatter_add_``'s) integer for integer, and the draw given them picks the
    same tokens from the same tables and segment masses, with one chunk and with three."""
    pytest.importorskip("numba")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    result = subprocess.run([sys.executable, "-c", SIMULATED_BINNED_LAW], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.parametrize("table_threads, segments, shown", [
    (24, 4, "TABLE_THREADS must be a power of two from 1 to 1024, got 24"),
    (2048, 4, "TABLE_THREADS must be a power of two from 1 to 1024, got 2048"),
    (16, 17, "segments a row must be from 1 to min(32, TABLE_THREADS = 16), got 17"),
    (256, 33, "segments a row must be from 1 to min(32, TABLE_THREADS = 256), got 33"),
])
def test_the_draw_refuses_table_blocks_that_cannot_hold_its_segments(monkeypatch, table_threads, segments, shown):
    """A table kernel's block sums every segment in one tree, so it needs a power-of-two width and a thread a
    segment at least: the launch refuses other settings before any kernel runs, naming the setting."""
    pytest.importorskip("numba")
    from mmw.kernels import tournament as kernels

    monkeypatch.setattr(kernels, "TABLE_THREADS", table_threads)
    rows, bins = 2, 1 << 5
    arrays = (np.zeros((rows, 64)), np.zeros(rows, dtype=np.int64), np.zeros(rows), np.zeros(rows, dtype=np.uint8),
              np.zeros((1, rows, bins)), np.zeros((rows, segments, bins), dtype=np.int64),
              np.zeros((rows, segments), dtype=np.int64), np.zeros((rows, segments)), np.zeros(rows, dtype=np.int64))
    with pytest.raises(ValueError) as error:
        kernels.launch_choose(*arrays, 5, 2, 5, 2.0 ** 62)
    assert str(error.value) == shown


def test_g_values_are_the_prf_bits_and_the_statistic_counts_them():
    tokens, seeds = np.array([3, 7, 999]), np.array([1, 2**63 + 5, 42], dtype=np.uint64)
    g = g_values_np(tokens, seeds, 30)
    h = prf.prf_np(seeds, tokens)
    for i in range(3):
        assert [int(b) for b in g[i]] == [int(h[i]) >> (63 - l) & 1 for l in range(30)]
    sampler = build_sampler(spec_of(), KEY, VOCAB)
    np.testing.assert_array_equal(sampler.statistic(tokens, seeds), -g.sum(axis=1).astype(np.float64))


# ---------------------------------------------------------------------------------------------- distortion
def sample_many_keys(spec: SchemeSpec, n: int, temperature: float) -> np.ndarray:
    v = SMALL_LOGITS.shape[0]
    sampler = build_sampler(spec, KEY, v)
    rng = np.random.default_rng(11)
    seeds = torch.from_numpy(rng.integers(0, 2**63, size=n, dtype=np.int64) * 2 + 1)
    return sampler.choose(SMALL_LOGITS.expand(n, v), seeds, temperature, torch.from_numpy(rng.random(n))).numpy()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_non_distortionary_mode_samples_the_model_distribution_over_keys(temperature):
    n = 60_000
    tokens = sample_many_keys(spec_of(layers=30, leaves=2), n, temperature)
    expected = torch.softmax(SMALL_LOGITS.double() / temperature, -1).numpy() * n
    assert stats.chisquare(np.bincount(tokens, minlength=len(expected)), expected).pvalue > 1e-3


def test_distortionary_mode_is_detectably_distorted():
    """With 4 leaves per match the law over keys is no longer the model's: the test above would catch it."""
    n = 60_000
    tokens = sample_many_keys(spec_of(layers=30, leaves=4), n, 1.0)
    expected = torch.softmax(SMALL_LOGITS.double(), -1).numpy() * n
    assert stats.chisquare(np.bincount(tokens, minlength=len(expected)), expected).pvalue < 1e-6


# ---------------------------------------------------------------------------------------------- repeated contexts
def test_a_repeated_context_is_sampled_plainly():
    """Window 1: a row whose context token repeats gets the same seed twice; the second time the step returns the
    plain sampler's choice (same uniform), the first time the tournament's."""
    rows, v = 4000, SMALL_LOGITS.shape[0]
    spec = spec_of(layers=30)
    step = WatermarkStep(spec, KEY, v, 1.0, compiled=False)
    state = row_state(spec, list(range(rows)))
    history = step.new_history(rows, "cpu")
    context = torch.full((rows, 1), 7, dtype=torch.int64)
    logits = SMALL_LOGITS.expand(rows, v).clone()
    plain = Plain(None, 0, v)
    chosen = []
    for k in range(2):
        steps = torch.full((rows,), k, dtype=torch.int64)
        chosen.append(step(logits, context, steps, **state, history=history)[0])
        plain_u = prf.unit_t(prf.prf_t(state["sample_base"], steps))
        if k == 1:
            assert torch.equal(chosen[1], plain.choose(logits, None, 1.0, plain_u))
    # The first step is watermarked: all rows share the seed, so the tournament's law is far from the model's.
    first = np.bincount(chosen[0].numpy(), minlength=v)
    expected = torch.softmax(SMALL_LOGITS.double(), -1).numpy() * rows
    assert stats.chisquare(first, expected).pvalue < 1e-6
    # A fresh context after the repeat is watermarked again (the history holds only seen seeds).
    steps = torch.full((rows,), 2, dtype=torch.int64)
    fresh = step(logits, context + 1, steps, **state, history=history)[0]
    seeds = step.seeds(context + 1, steps, state["shift"])
    sampler = build_sampler(spec, KEY, v)
    plain_u = prf.unit_t(prf.prf_t(state["sample_base"], steps))
    assert torch.equal(fresh, sampler.choose(logits, seeds, 1.0, plain_u))


# ---------------------------------------------------------------------------------------------- null and power
def test_pvalue_is_the_exact_binomial_tail():
    sampler = build_sampler(spec_of(layers=7), KEY, VOCAB)
    total, n_units = np.array([-0.0, -4.0, -40.0, -63.0]), np.array([0, 1, 9, 9])
    want = [1.0, stats.binom.sf(3, 7, 0.5), stats.binom.sf(39, 63, 0.5), 0.5 ** 63]
    np.testing.assert_allclose(sampler.pvalue_sum(total, n_units), want, rtol=1e-12)


@pytest.mark.parametrize("corpus", ["random", "text", "repetitive"])
def test_false_positive_rate_at_the_nominal_level(corpus):
    n = 2000
    seqs = null_sequences(corpus, n, 200, VOCAB, seed=zlib.crc32(corpus.encode()))
    rate = false_positive_rate(spec_of(window=3), KEY, seqs, VOCAB)
    lo, hi = binomial_band(n, ALPHA)
    assert rate <= hi, (corpus, rate, hi)
    if corpus == "random":  # a discrete exact null is close to its level when N m is large
        assert rate >= binomial_band(n, ALPHA, level=0.999)[0], rate


def test_valid_and_anytime_sizes_keep_their_level_at_any_prefix():
    """On 2,000 null texts of 200 tokens, the share with a checkpoint size (union bound) or an anytime size
    (Ville) is <= alpha."""
    seqs = null_sequences("text", 2000, 200, VOCAB, seed=5)
    res = Detector(spec_of(window=3), KEY, VOCAB).detect(seqs)
    _, hi = binomial_band(len(seqs), ALPHA)
    assert np.mean([r.size_valid is not None for r in res]) <= hi
    assert np.mean([r.size_anytime is not None for r in res]) <= hi


def test_watermarked_text_is_detected_in_both_modes():
    logits = uniform_subset_model(VOCAB, support=4, rows=16, seed=2)
    for leaves in (2, 4):
        spec = spec_of(window=2, leaves=leaves)
        toks = generate_synthetic(spec, KEY, logits, rows=16, length=64, vocab_size=VOCAB)
        res = Detector(spec, KEY, VOCAB).detect(list(toks))
        assert np.mean([r.pvalue <= ALPHA for r in res]) >= 0.9
        # and on the same model's unwatermarked text, not
        plain = generate_synthetic(None, KEY, logits, rows=16, length=64, vocab_size=VOCAB)
        assert np.mean([r.pvalue <= ALPHA for r in Detector(spec, KEY, VOCAB).detect(list(plain))]) <= 0.25


# ---------------------------------------------------------------------------------------------- weighted mean score
def weighted_law_by_enumeration(weights: np.ndarray, units: int) -> dict[int, float]:
    """P(X = s) for X the weighted count of ones among ``units`` units of len(weights) fair bits, every one of the
    2^(m units) bit patterns listed."""
    law: dict[int, float] = {}
    for bits in itertools.product((0, 1), repeat=len(weights) * units):
        s = int(np.dot(np.reshape(bits, (units, len(weights))), weights).sum())
        law[s] = law.get(s, 0.0) + 0.5 ** (len(weights) * units)
    return law


def test_decreasing_weights_are_synthids_linear_weights_rounded():
    w = decreasing_weights(30)
    assert w.dtype == np.int64 and w[0] == 10 and w[-1] == 1 and np.all(np.diff(w) <= 0)
    np.testing.assert_allclose(w, np.linspace(10, 1, 30), atol=0.5)
    assert list(decreasing_weights(1)) == [10] and list(decreasing_weights(2)) == [10, 1]


@pytest.mark.parametrize("weights", [(3, 2, 1, 1), (5, 1), (2,)])
def test_weighted_null_is_the_exact_law_of_weighted_fair_bits(weights):
    w = np.array(weights)
    for units in (1, 2, 3):
        law = weighted_law_by_enumeration(w, units)
        scores = np.arange(-1, int(w.sum()) * units + 2)
        want = [sum(p for s, p in law.items() if s >= score) for score in scores]
        got = nulls.weighted_bits_upper(scores.astype(float), np.full(scores.size, units), w)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert nulls.weighted_bits_upper(np.array([0.0, 1.0]), np.array([0, 0]), w).tolist() == [1.0, 0.0]


def test_weighted_null_keeps_the_far_tail_exact():
    """All ones in N units of 30 bits has probability 2^-30N; one weight-1 bit short adds 2N patterns (two
    weight-1 layers per unit): a convolution of positive terms keeps both exact far below double epsilon."""
    w = decreasing_weights(30)
    top = float(w.sum())
    for units in (1, 5, 20):
        got = nulls.weighted_bits_upper(np.array([units * top, units * top - 1]), np.array([units, units]), w)
        np.testing.assert_allclose(got, [2.0 ** (-30 * units), (1 + 2 * units) * 2.0 ** (-30 * units)], rtol=1e-12)


def test_weighted_statistic_and_pvalue():
    spec = spec_of(layers=30, layer_weights="decreasing")
    sampler = build_sampler(spec, KEY, VOCAB)
    rng = np.random.default_rng(3)
    tokens, seeds = rng.integers(0, VOCAB, 50), rng.integers(0, 2**63, 50).astype(np.uint64)
    want = -(g_values_np(tokens, seeds, 30).astype(np.int64) @ decreasing_weights(30))
    np.testing.assert_array_equal(sampler.statistic(tokens, seeds), want.astype(float))
    total, n_units = np.cumsum(want).astype(float), np.arange(1, 51)
    np.testing.assert_array_equal(sampler.pvalue_sum(total, n_units),
                                  nulls.weighted_bits_upper(-total, n_units, decreasing_weights(30)))
    # uniform weights keep the Binomial(N m, 1/2) null, bit for bit
    uniform = build_sampler(spec_of(layers=30, layer_weights="uniform"), KEY, VOCAB)
    ones = -g_values_np(tokens, seeds, 30).sum(-1).cumsum().astype(float)
    np.testing.assert_array_equal(uniform.pvalue_sum(ones, n_units), stats.binom.sf(-ones - 1, 30 * n_units, 0.5))


def test_weighted_bits_pivot_is_a_test_martingale():
    """Each unit's factor exp(a + b S) has null expectation exactly 1 (enumerated over a unit's 2^m patterns), and
    equal weights give the unweighted bet bit for bit."""
    weights = np.array([4, 3, 1, 1, 1])
    law = weighted_law_by_enumeration(weights, 1)
    from mmw.watermark.size import pivot_bets

    bets = pivot_bets("bits", None, (0.1, 0.3, 0.6, 0.9), len(weights), weights)
    for a, b in zip(bets.a, bets.b):
        assert np.isclose(sum(p * np.exp(a + b * -s) for s, p in law.items()), 1.0, rtol=1e-12)
    equal, plain = pivot_bets("bits", None, layers=5, weights=np.ones(5)), pivot_bets("bits", None, layers=5)
    assert np.array_equal(equal.a, plain.a) and np.array_equal(equal.b, plain.b)
    assert np.array_equal(anytime_bets(spec_of(layers=5, layer_weights="uniform")).a, plain.a)


def test_weighted_score_false_positive_rate_at_the_nominal_level():
    n = 2000
    seqs = null_sequences("random", n, 200, VOCAB, seed=17)
    rate = false_positive_rate(spec_of(window=3, layer_weights="decreasing"), KEY, seqs, VOCAB)
    lo, hi = binomial_band(n, ALPHA)
    assert binomial_band(n, ALPHA, level=0.999)[0] <= rate <= hi, rate


def test_weighted_score_valid_and_anytime_sizes_keep_their_level_at_any_prefix():
    seqs = null_sequences("text", 2000, 200, VOCAB, seed=6)
    res = Detector(spec_of(window=3, layer_weights="decreasing"), KEY, VOCAB).detect(seqs)
    _, hi = binomial_band(len(seqs), ALPHA)
    assert np.mean([r.size_valid is not None for r in res]) <= hi
    assert np.mean([r.size_anytime is not None for r in res]) <= hi


def test_weighted_score_detects_watermarked_text():
    """Power on watermarked text (both modes), none on the same model's plain text; and the weights change
    detection only: the same key generates the same tokens."""
    logits = uniform_subset_model(VOCAB, support=4, rows=16, seed=2)
    for leaves in (2, 4):
        spec = spec_of(window=2, leaves=leaves, layer_weights="decreasing")
        toks = generate_synthetic(spec, KEY, logits, rows=16, length=64, vocab_size=VOCAB)
        same = generate_synthetic(spec_of(window=2, leaves=leaves), KEY, logits, rows=16, length=64, vocab_size=VOCAB)
        assert np.array_equal(np.asarray(toks), np.asarray(same))
        res = Detector(spec, KEY, VOCAB).detect(list(toks))
        assert np.mean([r.pvalue <= ALPHA for r in res]) >= 0.9
        assert np.mean([r.size_anytime is not None for r in res]) >= 0.9
        plain = generate_synthetic(None, KEY, logits, rows=16, length=64, vocab_size=VOCAB)
        assert np.mean([r.pvalue <= ALPHA for r in Detector(spec, KEY, VOCAB).detect(list(plain))]) <= 0.25


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("bad,key,shown", [({"layers": 0}, "scheme.layers", "[1, 64]"),
                                           ({"layers": 65}, "scheme.layers", "[1, 64]"),
                                           ({"leaves": 1}, "scheme.leaves", "[2, 16]"),
                                           ({"layer_weights": "linear"}, "scheme.layer_weights",
                                            "allowed: uniform, decreasing"),
                                           ({"layer_weights": 2}, "scheme.layer_weights",
                                            "allowed: uniform, decreasing"),
                                           ({"skip_prob": 0.1}, "scheme.skip_prob", "not used")])
def test_bad_tournament_settings_name_the_key(bad, key, shown):
    with pytest.raises(SpecError) as err:
        spec_of(**bad)
    assert str(err.value).startswith(key) and shown in str(err.value)


@pytest.mark.parametrize("key,value", [("layers", 3), ("layer_weights", "decreasing")])
def test_tournament_keys_outside_the_tournament_are_refused(key, value):
    with pytest.raises(SpecError, match=f"scheme.{key}: not used by sampler=exponential"):
        SchemeSpec.from_params({"sampler": "exponential", "randomness": "window", "window": 1, "score": "sum",
                                key: value})


@pytest.mark.parametrize("key,value,shown", [("layers", 65, "[1, 64]"),
                                             ("layer_weights", "linear", "uniform, decreasing")])
def test_cli_exits_2_on_bad_tournament_keys_before_any_work(key, value, shown, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    board = yaml.safe_load((ROOT / "params.yaml").read_text())
    board["key"] = "cli-test-key-0123456789"
    board["scheme"].update(sampler="tournament", delta=None, gamma=None, **{key: value})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(board))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    result = CliRunner().invoke(app, ["generate", "watermarked"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: scheme.{key}:") and shown in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvc.yaml", "params.yaml"]


def test_bits_pivot_is_the_bernoulli_likelihood_ratio():
    spec = spec_of(layers=5)
    bets = anytime_bets(spec, grid=(0.4,))
    ones, units = 7.0, 2.0
    q = 0.7
    want = ones * np.log(2 * q) + (5 * units - ones) * np.log(2 * (1 - q))
    assert np.isclose(bets.a[0] * units + bets.b[0] * -ones, want)


def test_scatter_histogram_adds_fixed_point_masses_by_the_chunk_bits():
    """One row, four tokens whose two top g-bits spell 0..3 (bit 63 first): each bin holds its token's mass in units
    of 2^-62, rounded half up (the last token's 1.5 units count 2), then scaled by an earlier chunk's factor looked
    up by the token's bits of that chunk."""
    from mmw.watermark.samplers.tournament import FIXED_POINT, scatter_histogram

    probs = torch.tensor([[0.125, 0.25, 0.5, 3 * 2.0**-63]], dtype=torch.float64)
    hashes = torch.tensor([[0, 1 << 62, -(1 << 63), -(1 << 63) | (1 << 62)]], dtype=torch.int64)
    assert FIXED_POINT == 2.0**62
    assert scatter_histogram(probs, hashes, [], 0, 2).tolist() == [[2**59, 2**60, 2**61, 2]]
    assert scatter_histogram(probs, hashes, [], 0, 1).tolist() == [[2**59 + 2**60, 2**61 + 2]]
    table = torch.tensor([[0.5, 1.5]], dtype=torch.float64)  # a one-layer chunk 0: its factor by bit 63
    halves = scatter_histogram(probs, hashes, [table], 1, 1, chunk_bits=1)  # layer 1 = bit 62
    assert halves.tolist() == [[2**58 + 3 * 2**60, 2**59 + 2]]  # the last token: 2.25 units round to 2


def test_temperature_zero_takes_each_rows_argmax():
    """At temperature 0 the model's law is one-hot and stays so through every round: both draws return each row's
    argmax, plain rows or not."""
    sampler = build_sampler(spec_of(), KEY, 6)
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0, 0.0, 1.0],
                           [0.0, 0.0, 0.0, 0.0, 0.0, 2.0]])
    seeds, u = torch.tensor([11, 12, 13]), torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)
    assert sampler.choose(logits, seeds, 0.0, u).tolist() == [1, 0, 5]
    plain_rows = torch.tensor([True, False, True])
    assert sampler.choose_or_plain(logits, seeds, 0.0, u, plain_rows).tolist() == [1, 0, 5]
