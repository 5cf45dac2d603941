"""SynthID-Text's tournament sampling (Dathathri et al., Nature 2024), its output distribution computed exactly.

Layer l's g-value of token i under seed r is bit ``63 - l`` of ``prf(r, i)`` (docs/PRF.md): one PRF per
candidate token serves every layer (m <= 64), and under H0 the m bits of a (seed, token) pair are independent fair
bits. A tournament draws ``leaves ** m`` candidates from p and lets the ones with the larger g_l win each match
of round l; its winner's law is computed layer by layer, as SynthID's own efficient form does:

- ``leaves`` = 2 (non-distortionary): p_{l+1}(x) = p_l(x) (1 + g_l(x) - G_l), G_l = sum_y p_l(y) g_l(y);
  E over keys of the factor is 1, so each step's distribution equals the model's in expectation over keys;
- ``leaves`` = K > 2 (distortionary): p_{l+1}(x) = p_l(x) (1 - (1 - G_l)^K) / G_l when g_l(x) = 1, else
  p_l(x) (1 - G_l)^(K - 1).

Generation computes the same law in a few passes over the vocabulary instead of one per layer
(``tournament_probs_chunked``): the law after layer l is p(x) times a product of per-layer factors that depend on
x only through its g-bits, so one pass that sums the current law's mass by the next ``CHUNK_BITS`` g-bits (a
2^CHUNK_BITS-bin histogram a row) yields those layers' masses G_l exactly, on the histogram alone; the chunk's
factors become one table indexed by those bits. m = 30 takes three passes where the layer-by-layer form takes 60.
``tournament_probs`` stays the reference the tests compare it with.

One inverse-CDF draw with the step's plain uniform then picks the token. Repeated contexts (a seed already used in
this generation) are sampled plainly by the step (``mmw.watermark.processor``), as SynthID's context history does.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from mmw.watermark import nulls, prf
from mmw.watermark.samplers.base import Sampler, inverse_cdf, law_of, numba_cuda
from mmw.watermark.samplers.parts import TournamentPart

#: Shifts that bring layer l's bit (bit 63 - l of the PRF output) to bit 0, for l = 0..63.
_SHIFTS = np.arange(63, -1, -1, dtype=np.uint64)
#: Layers one pass over the vocabulary resolves: their g-bits index a 2 ** CHUNK_BITS-bin histogram a row (1,024 bins:
#: the per-layer work on it is tiny next to a pass over a 128k vocabulary, and m = 30 takes 3 passes).
CHUNK_BITS = 10
#: Fixed-point unit of the histograms: masses are summed as integers (each token's mass rounded to 2^-62, at most
#: V 2^-63 off in a layer's G, ~1e-14 at V = 128k), because integer sums do not depend on the order a GPU's atomic
#: adds land in, so the law and the sampled tokens are the same from run to run (float atomics are not).
FIXED_POINT = 2.0 ** 62
#: Vocabularies from this size take the chunked form: below it a histogram pass costs about as much as the passes
#: over the vocabulary it saves (and tiny test vocabularies over many rows would pay 2 ** CHUNK_BITS bins a row).
CHUNKED_FROM_VOCAB = 8 << CHUNK_BITS


def tournament_probs(probs: torch.Tensor, hashes: torch.Tensor, layers: int, leaves: int) -> torch.Tensor:
    """The tournament winner's distribution. probs: float64 [B, V] (the model's, after temperature); hashes:
    int64 [B, V] = prf(seed, token) (its bit 63 - l is g_l) -> float64 [B, V], each row summing to one."""
    for layer in range(layers):
        g = ((hashes >> (63 - layer)) & 1).to(probs.dtype)
        mass = (g * probs).sum(-1, keepdim=True)  # G_l: the chance that one candidate has g_l = 1
        probs = probs * _layer_factor(g, mass, leaves)
    return probs


def _layer_factor(g: torch.Tensor, mass: torch.Tensor, leaves: int) -> torch.Tensor:
    """The factor p_{l+1}(x) / p_l(x) of a token with g_l(x) = g, given G_l = mass (broadcast)."""
    if leaves == 2:
        return 1.0 + g - mass
    miss = 1.0 - mass  # a match is lost by the g = 1 side only when no candidate has g = 1
    won = (1.0 - miss ** leaves) / mass.clamp(min=torch.finfo(mass.dtype).tiny)
    return torch.where(g > 0, won, miss ** (leaves - 1))


def chunk_bins(hashes: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """Each token's g-bits of layers start .. start + width - 1 as one integer: bits 63 - start .. 64 - start - width
    of the PRF, so bin bit width - 1 - j is layer start + j (the mask drops the sign bits an arithmetic shift of the
    int64 brings in)."""
    return (hashes >> (64 - start - width)) & ((1 << width) - 1)


def chunk_table(counts: torch.Tensor, width: int, leaves: int) -> torch.Tensor:
    """A chunk's factor table from its histogram: counts int64 [B, 2^width], the current law's mass by the chunk's
    g-bits in units of 1 / FIXED_POINT -> float64 [B, 2^width], each bin's product of its layers' factors. Layer by
    layer, G_l is the mass of the bins whose bit for l is 1, and every bin's mass takes its factor."""
    mass = counts.to(torch.float64) / FIXED_POINT
    codes = torch.arange(1 << width, device=counts.device)
    table = torch.ones_like(mass)
    for j in range(width):
        g = ((codes >> (width - 1 - j)) & 1).to(mass.dtype)
        factor = _layer_factor(g, (mass * g).sum(-1, keepdim=True), leaves)
        mass = mass * factor
        table = table * factor
    return table


def apply_tables(probs: torch.Tensor, hashes: torch.Tensor, tables: list[torch.Tensor],
                 chunk_bits: int = CHUNK_BITS) -> torch.Tensor:
    """probs times each chunk's factor, looked up by the token's bits of that chunk."""
    for c, table in enumerate(tables):
        width = table.shape[-1].bit_length() - 1
        probs = probs * table.gather(1, chunk_bins(hashes, c * chunk_bits, width))
    return probs


def scatter_histogram(probs: torch.Tensor, hashes: torch.Tensor, tables: list[torch.Tensor], start: int, width: int,
                      chunk_bits: int = CHUNK_BITS) -> torch.Tensor:
    """The current law's mass (probs times the earlier chunks' tables) by the bits of layers start ..
    start + width - 1: int64 [B, 2^width], in units of 1 / FIXED_POINT (each token's mass rounded half up)."""
    fixed = torch.floor(apply_tables(probs, hashes, tables, chunk_bits) * FIXED_POINT + 0.5).to(torch.int64)
    counts = torch.zeros(probs.shape[0], 1 << width, dtype=torch.int64, device=probs.device)
    return counts.scatter_add_(1, chunk_bins(hashes, start, width), fixed)


@torch.library.custom_op("mmw::tournament_histogram", mutates_args=())
def cuda_histogram(probs: torch.Tensor, seeds: torch.Tensor, tables: torch.Tensor, n_tables: int, table_bits: int,
                   start: int, width: int) -> torch.Tensor:
    """``scatter_histogram`` on a CUDA device with the PRF computed in the kernel, from the row seeds int64 [B] and
    the earlier chunks' tables stacked float64 [max(n_tables, 1), B, 2^table_bits] (``mmw.kernels.tournament``;
    opaque to ``torch.compile``, which would otherwise lower the scatter to serialised global atomics)."""
    from mmw.kernels.tournament import histogram

    return histogram(probs.contiguous(), seeds.contiguous(), tables.contiguous(), n_tables, table_bits, start, width,
                     FIXED_POINT)


@cuda_histogram.register_fake
def _(probs, seeds, tables, n_tables, table_bits, start, width):
    return probs.new_empty((probs.shape[0], 1 << width), dtype=torch.int64)


@torch.library.custom_op("mmw::tournament_apply", mutates_args=())
def cuda_apply(probs: torch.Tensor, seeds: torch.Tensor, tables: torch.Tensor, table_bits: int,
               last_bits: int) -> torch.Tensor:
    """``apply_tables`` on a CUDA device, the PRF in the kernel: tables stacked float64 [C, B, 2^table_bits], the
    last chunk's 2^last_bits entries first (``mmw.kernels.tournament``)."""
    from mmw.kernels.tournament import apply_tables as apply_kernel

    return apply_kernel(probs.contiguous(), seeds.contiguous(), tables.contiguous(), table_bits, last_bits)


@cuda_apply.register_fake
def _(probs, seeds, tables, table_bits, last_bits):
    return torch.empty_like(probs)


@torch.library.custom_op("mmw::tournament_choose", mutates_args=())
def cuda_choose(probs: torch.Tensor, seeds: torch.Tensor, u: torch.Tensor, plain_rows: torch.Tensor, layers: int,
                leaves: int, first_bins: Optional[torch.Tensor] = None,
                first_totals: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``inverse_cdf`` of the tournament's law (the model's own in ``plain_rows``) on a CUDA device, the law never
    written: the histogram passes, the tables and a two-level inverse CDF in ``mmw.kernels.tournament.choose``.
    ``first_bins``/``first_totals``: the first histogram pass, computed by the pass that wrote ``probs``
    (``cuda_binned_law``)."""
    from mmw.kernels.tournament import choose

    first = None if first_bins is None else (first_bins, first_totals.contiguous())
    return choose(probs.contiguous(), seeds.contiguous(), u.to(torch.float64).contiguous(),
                  plain_rows.to(torch.uint8).contiguous(), layers, leaves, CHUNK_BITS, FIXED_POINT, first)


@cuda_choose.register_fake
def _(probs, seeds, u, plain_rows, layers, leaves, first_bins=None, first_totals=None):
    return probs.new_empty(probs.shape[0], dtype=torch.int64)


@torch.library.custom_op("mmw::tournament_binned_law", mutates_args=())
def cuda_binned_law(logits: torch.Tensor, temperature: float, seeds: torch.Tensor, width: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``softmax_law`` (the law float64 [B, V] and the entropies [2, B]) whose pass that writes the law also gives the
    draw's first histogram pass (``mmw.kernels.softmax``'s ``binned_law_kernel``): the law's mass by the first
    ``width`` g-bits under the row seeds int64 [B], int64 [B, S, 2^width] over S = ``mmw.kernels.tournament.PARTS``
    segments a row, and each segment's mass int64 [B, S], in units of 1 / FIXED_POINT (as ``cuda_choose``'s first
    pass would compute them from the law)."""
    from mmw.kernels.softmax import law
    from mmw.kernels.tournament import PARTS

    return law(logits, temperature, (seeds, width, FIXED_POINT, PARTS))


@cuda_binned_law.register_fake
def _(logits, temperature, seeds, width):
    from mmw.kernels.tournament import PARTS

    rows, vocab = logits.shape
    return (logits.new_empty((rows, vocab), dtype=torch.float64), logits.new_empty((2, rows), dtype=torch.float64),
            logits.new_empty((rows, PARTS, 1 << width), dtype=torch.int64),
            logits.new_empty((rows, PARTS), dtype=torch.int64))


def chunk_tables(probs: torch.Tensor, layers: int, leaves: int, histogram, chunk_bits: int = CHUNK_BITS
                 ) -> list[torch.Tensor]:
    """Every chunk's factor table, one histogram pass each: ``histogram(tables, start, width)`` gives the current
    law's mass by the chunk's bits, the law being probs times the earlier chunks' ``tables``."""
    tables: list[torch.Tensor] = []
    for start in range(0, layers, chunk_bits):
        width = min(chunk_bits, layers - start)
        tables.append(chunk_table(histogram(tables, start, width), width, leaves))
    return tables


def tournament_probs_chunked(probs: torch.Tensor, hashes: torch.Tensor, layers: int, leaves: int,
                             chunk_bits: int = CHUNK_BITS) -> torch.Tensor:
    """``tournament_probs``'s law in ceil(layers / chunk_bits) histogram passes over the vocabulary (same
    arguments and result, up to float64 rounding and the histograms' fixed point)."""
    def histogram(tables, start, width):
        return scatter_histogram(probs, hashes, tables, start, width, chunk_bits)

    tables = chunk_tables(probs, layers, leaves, histogram, chunk_bits)
    return apply_tables(probs, hashes, tables, chunk_bits)


def g_values_np(tokens: np.ndarray, seeds: np.ndarray, layers: int) -> np.ndarray:
    """g-values of aligned tokens (int64) and seeds (uint64), broadcast to shape S -> uint8 [S, layers]."""
    hashes = prf.prf_np(np.asarray(seeds, dtype=np.uint64), np.asarray(tokens))
    return ((hashes[..., None] >> _SHIFTS[:layers]) & np.uint64(1)).astype(np.uint8)


class Tournament(Sampler, TournamentPart):
    """Statistic of a token: minus the weighted number of its g-values equal to 1 (``-sum_l w_l g_l``, the
    scheme's ``layer_weights``; all ones by default, SynthID's mean score); each distinct (seed, token) pair is one
    unit, whose m bits are i.i.d. fair under H0, so the sum score's null is exactly Binomial(N m, 1/2) over N units
    with equal weights, and the weighted count's exact discrete law (``mmw.watermark.nulls.WeightedBits``) otherwise."""

    def __init__(self, spec, key, vocab_size):
        super().__init__(spec, key, vocab_size)
        self.weights = self.weights_of(spec)
        self._numba_passes = False

    def prepare(self, device):
        self.token_ids(device)
        # The numba passes where numba sees the GPU; elsewhere torch's scatter_add_ (the same law, slower there).
        self._numba_passes = torch.device(device).type == "cuda" and numba_cuda()

    #: Draw through ``mmw::tournament_choose`` where the numba passes run (False: the law, then ``inverse_cdf``).
    fused_draw = True
    #: Where the draw is fused, let the step's pass that writes the law also compute the draw's first histogram
    #: (``binned_law``; False: the draw makes that pass over the law itself).
    binned_first_pass = True

    takes_law = True

    def binned_law(self, logits, temperature, seeds):
        if not (self.binned_first_pass and self._fused(logits)) or seeds.dim() != 1:
            return None
        probs, stats, bins, totals = cuda_binned_law(logits, temperature, seeds, min(CHUNK_BITS, self.spec.layers))
        return probs, stats, {"first": (bins, totals)}

    def choose(self, logits, seeds, temperature, plain_u, probs=None, first=None):
        return self.choose_or_plain(logits, seeds, temperature, plain_u, None, probs, first)

    def _fused(self, logits) -> bool:
        return (self.fused_draw and self._numba_passes and logits.is_cuda and self.spec.layers >= 1
                and logits.shape[-1] >= CHUNKED_FROM_VOCAB)

    def choose_or_plain(self, logits, seeds, temperature, plain_u, plain_rows, probs=None, first=None):
        """``choose``, except that the rows where ``plain_rows`` (bool [B]) is set are drawn from the model's own law
        (the repeated-context mask, ``mmw.watermark.processor``): the same tokens as the plain sampler's choice with
        this uniform, from one scan of one law instead of a second softmax and scan for the plain rows. None: no
        such row. ``first``: the draw's first histogram pass, from ``binned_law``."""
        if temperature == 0:  # a one-hot distribution stays one-hot through every round
            return logits.argmax(dim=-1)
        probs = law_of(logits, temperature, probs)
        if self._fused(logits):
            plain = torch.zeros_like(plain_u, dtype=torch.bool) if plain_rows is None else plain_rows
            return cuda_choose(probs, seeds, plain_u, plain, self.spec.layers, self.spec.leaves,
                               *(first if first is not None else ()))
        return inverse_cdf(self.law(logits, seeds, temperature, plain_rows, probs), plain_u)

    def law(self, logits, seeds, temperature, plain_rows=None, probs=None):
        """The tournament winner's law float64 [B, V] (the model's own in ``plain_rows``). On a CUDA device with a
        large vocabulary the passes run in ``mmw.kernels.tournament`` (the PRF in the kernel) once ``prepare`` has
        found numba's CUDA support. ``probs``: the model's law at ``temperature``, when already computed."""
        probs = law_of(logits, temperature, probs)
        hashes = prf.prf_t(seeds.unsqueeze(-1), self.token_ids(logits.device).unsqueeze(0))
        layers, leaves = self.spec.layers, self.spec.leaves
        if probs.shape[-1] < CHUNKED_FROM_VOCAB:
            law = tournament_probs(probs, hashes, layers, leaves)
            return law if plain_rows is None else torch.where(plain_rows.unsqueeze(-1), probs, law)
        numba_passes = probs.is_cuda and self._numba_passes
        if numba_passes:
            def histogram(tables, start, width):
                stacked = torch.stack(tables) if tables else probs.new_ones(1, probs.shape[0], 1 << CHUNK_BITS)
                return cuda_histogram(probs, seeds, stacked, len(tables), CHUNK_BITS, start, width)
        else:
            def histogram(tables, start, width):
                return scatter_histogram(probs, hashes, tables, start, width)
        tables = chunk_tables(probs, layers, leaves, histogram)
        if plain_rows is not None:  # unit factors: probs * 1.0 * ... is the model's law exactly
            tables = [torch.where(plain_rows.unsqueeze(-1), 1.0, table) for table in tables]
        if numba_passes:
            last = tables[-1].shape[-1]
            padded = tables[:-1] + [torch.nn.functional.pad(tables[-1], (0, (1 << CHUNK_BITS) - last), value=1.0)]
            return cuda_apply(probs, seeds, torch.stack(padded), CHUNK_BITS, last.bit_length() - 1)
        return apply_tables(probs, hashes, tables)

    def statistic(self, tokens, seeds):
        return -(g_values_np(tokens, seeds, self.spec.layers).astype(np.int64) @ self.weights).astype(np.float64)

    def pvalue_sum(self, total, n_units):
        """-total = the weighted count of g = 1 among N units of m fair bits under H0: P(that count >= observed);
        with equal (unit) weights the count is Binomial(N m, 1/2)."""
        ones = np.rint(-np.asarray(total, dtype=np.float64))
        if np.all(self.weights == 1):
            return nulls.binomial_upper(ones, np.asarray(n_units) * self.spec.layers, 0.5)
        return nulls.weighted_bits_upper(ones, n_units, self.weights)
