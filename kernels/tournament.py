"""The tournament sampler's vocabulary passes on a CUDA device (numba), called from torch through the custom ops
``mmw::tournament_choose`` (the draw) and ``mmw::tournament_histogram`` / ``mmw::tournament_apply`` (the law
itself) (``mmw.watermark.samplers.tournament``).

A histogram pass sums each row's current law by the next ``width`` g-bits (``mmw.watermark.samplers.tournament``):
per token, the PRF of (row seed, token id) gives its bits, its mass is p(x) times the earlier chunks' factor tables
looked up by its bits, and the mass, in fixed point, is added to its bin. The bins live in shared memory: a row's
1,024 bins sit in 64 cache lines, and the global atomic adds of ``scatter_add_`` serialise on them (0.53 ms a pass
at 296 x 128,256 on one H200, against one read of the probabilities in ~0.07 ms); shared-memory atomics do not.
Integer adds make the sum independent of their order, so the result is the same on every run and equals the CPU's
``scatter_add_``. ``histogram32_kernel`` adds each 64-bit value as two 32-bit halves (a 64-bit shared atomic add
is a compare-and-swap loop on sm_90).

``choose`` draws the token without writing the law: the histogram passes, each chunk's table in a kernel, then, per
row, the segment of the vocabulary that holds the inverse-CDF target (the segments' masses come from the last
histogram) and a scan of that segment alone. Writing the law (``apply_tables``) and drawing with ``inverse_cdf``
costs a pass that writes it and a scan that reads and writes it (bench/results/gpu.md has the times).
"""

from __future__ import annotations

import functools
import math

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still refers to np.row_stack, which numpy 2.5 removed
    np.row_stack = np.vstack

from numba import cuda, float64, int64, uint32, uint64  # noqa: E402

from mmw.kernels.prf import prf  # noqa: E402

THREADS = 256
#: Blocks per row: 8 x 256 threads take ~63 tokens each at V = 128,256, and 296 rows give 2,368 blocks.
PARTS = 8
MAX_BINS = 1024
#: Factor tables a block copies into shared memory first (24 KB; m <= 40 never has more): a lookup there is a shared
#: load, where a lookup in global memory cost ~55 us a table a pass (296 x 128,256 on one H200, CUDA graph replays).
CACHED_TABLES = 3
_CACHE_SIZE = CACHED_TABLES * MAX_BINS  # a global constant: numba sizes shared arrays at compile time


@cuda.jit(device=True)
def _cache_tables(cache, tables, n_tables, row, cached):
    """Copy row's first min(n_tables, cached) factor tables into the block's shared ``cache``."""
    size = tables.shape[2]
    for i in range(cuda.threadIdx.x, min(n_tables, cached) * size, cuda.blockDim.x):
        cache[i] = tables[i // size, row, i - (i // size) * size]


@cuda.jit(device=True)
def _factor(cache, tables, c, row, code, cached):
    """Table c's factor for ``code``: from shared memory when cached (c < cached)."""
    if c < cached:
        return cache[c * tables.shape[2] + code]
    return tables[c, row, code]


def available() -> bool:
    """True when numba sees a CUDA device."""
    return cuda.is_available()


@cuda.jit
def _histogram_kernel(probs, seeds, tables, n_tables, table_bits, start, width, fixed_point, partial):
    """partial[row, part, b] = sum over this block's tokens x of row with bits(x) = b of
    round(probs[row, x] * prod_c tables[c, row, chunk_c(x)] * fixed_point)."""
    bins = cuda.shared.array(MAX_BINS, int64)
    cache = cuda.shared.array(_CACHE_SIZE, float64)
    row = cuda.blockIdx.y
    part = cuda.blockIdx.x
    n_bins = 1 << width
    for b in range(cuda.threadIdx.x, n_bins, cuda.blockDim.x):
        bins[b] = 0
    _cache_tables(cache, tables, n_tables, row, CACHED_TABLES)
    cuda.syncthreads()
    seed = uint64(seeds[row])
    mask = uint64(n_bins - 1)
    table_mask = uint64((1 << table_bits) - 1)
    shift = uint64(64 - start - width)
    vocab = probs.shape[1]
    stride = cuda.gridDim.x * cuda.blockDim.x
    for x in range(part * cuda.blockDim.x + cuda.threadIdx.x, vocab, stride):
        h = prf(seed, x)
        mass = probs[row, x]
        for c in range(n_tables):  # chunk c holds layers c * table_bits .. (c + 1) * table_bits - 1
            mass *= _factor(cache, tables, c, row, int64((h >> uint64(64 - (c + 1) * table_bits)) & table_mask),
                           CACHED_TABLES)
        cuda.atomic.add(bins, int64((h >> shift) & mask), int64(mass * fixed_point + float64(0.5)))
    cuda.syncthreads()
    for b in range(cuda.threadIdx.x, n_bins, cuda.blockDim.x):
        partial[row, part, b] = bins[b]


@cuda.jit
def _apply_kernel(probs, seeds, tables, n_tables, table_bits, last_bits, out):
    """out[row, x] = probs[row, x] * prod_c tables[c, row, chunk_c(x)]: chunk c holds table_bits layers from layer
    c * table_bits, the last chunk last_bits."""
    cache = cuda.shared.array(_CACHE_SIZE, float64)
    row = cuda.blockIdx.y
    _cache_tables(cache, tables, n_tables, row, CACHED_TABLES)
    cuda.syncthreads()
    seed = uint64(seeds[row])
    vocab = probs.shape[1]
    stride = cuda.gridDim.x * cuda.blockDim.x
    for x in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, vocab, stride):
        h = prf(seed, x)
        mass = probs[row, x]
        for c in range(n_tables):
            bits = table_bits if c < n_tables - 1 else last_bits
            code = (h >> uint64(64 - c * table_bits - bits)) & uint64((1 << bits) - 1)
            mass *= _factor(cache, tables, c, row, int64(code), CACHED_TABLES)
        out[row, x] = mass


def _device_array(tensor):
    """A numba view of a CUDA tensor, without the stream synchronisation numba does by default on import (the
    kernel is launched on the tensor's stream, and a sync would break CUDA-graph capture)."""
    return cuda.from_cuda_array_interface(tensor.__cuda_array_interface__, owner=tensor, sync=False)


def histogram(probs, seeds, tables, n_tables: int, table_bits: int, start: int, width: int, fixed_point: float):
    """probs float64 [B, V], seeds int64 [B], tables float64 [>= max(n_tables, 1), B, 2^table_bits] (CUDA
    tensors, contiguous) -> int64 [B, 2^width] on the same device, launched on torch's current stream."""
    import torch

    if width > 10 or (1 << table_bits) > MAX_BINS:
        raise ValueError(f"width and table_bits must be at most 10, got {width} and {table_bits}")
    rows = probs.shape[0]
    partial = torch.empty(rows, PARTS, 1 << width, dtype=torch.int64, device=probs.device)
    if rows:
        stream = cuda.external_stream(torch.cuda.current_stream(probs.device).cuda_stream)
        _histogram_kernel[(PARTS, rows), THREADS, stream](
            _device_array(probs), _device_array(seeds), _device_array(tables), n_tables, table_bits, start, width,
            fixed_point, _device_array(partial))
    return partial.sum(1)


def apply_tables(probs, seeds, tables, table_bits: int, last_bits: int):
    """probs float64 [B, V] times each chunk's factor: tables float64 [C, B, 2^table_bits] (the last chunk's
    2^last_bits entries first in its row), seeds int64 [B] (CUDA tensors, contiguous) -> float64 [B, V]."""
    import torch

    out = torch.empty_like(probs)
    if probs.shape[0]:
        stream = cuda.external_stream(torch.cuda.current_stream(probs.device).cuda_stream)
        _apply_kernel[(PARTS, probs.shape[0]), THREADS, stream](
            _device_array(probs), _device_array(seeds), _device_array(tables), tables.shape[0], table_bits,
            last_bits, _device_array(out))
    return out


# ------------------------------------------------------------------------------------------------ the fused draw
#: Threads of the draw's scan (one block a row, so these are all the threads that read the chosen segment).
PICK_THREADS = 256
#: Tokens a thread of the draw's scan adds in sequence (a tile is PICK_THREADS x PICK_RUN tokens). A contiguous run
#: a thread and one block scan a row (no scan a tile) took 0.102 ms against 0.097 here (296 x 128,256, one H200):
#: its threads' reads fall on as many cache lines.
PICK_RUN = 8


@cuda.jit(device=True)
def _mass(p, cache, tables, n_tables, table_bits, row, h, cached):
    """p = probs[row, x] times the first n_tables chunks' factors (each chunk table_bits layers), looked up by x's
    bits of each chunk (h = prf(seed, x)), multiplied in that order; the first ``cached`` tables from ``cache``."""
    mass = p
    table_mask = uint64((1 << table_bits) - 1)
    for c in range(n_tables):
        mass *= _factor(cache, tables, c, row, int64((h >> uint64(64 - (c + 1) * table_bits)) & table_mask), cached)
    return mass


@cuda.jit(device=True)
def _law(probs, cache, tables, n_tables, table_bits, last_bits, row, x, h):
    """The law at x: ``_apply_kernel``'s product (the last chunk last_bits wide)."""
    mass = probs[row, x]
    for c in range(n_tables):
        bits = table_bits if c < n_tables - 1 else last_bits
        code = (h >> uint64(64 - c * table_bits - bits)) & uint64((1 << bits) - 1)
        mass *= _factor(cache, tables, c, row, int64(code), CACHED_TABLES)
    return mass


@cuda.jit(device=True)
def _block_sum(red, value):
    """The sum of ``value`` over the block (blockDim a power of two), by a tree in shared ``red`` (a fixed order);
    every thread gets it."""
    t = cuda.threadIdx.x
    red[t] = value
    cuda.syncthreads()
    s = cuda.blockDim.x >> 1
    while s > 0:
        if t < s:
            red[t] += red[t + s]
        cuda.syncthreads()
        s >>= 1
    total = red[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _add_fixed(lo, hi, b, v):
    """Add the fixed-point mass v (uint64) to bin b of a histogram kept as 32-bit halves in shared ``lo`` and
    ``hi`` (``histogram32_kernel``): its low 32 bits to lo[b], its high bits plus the carry out of lo[b] that this
    add caused (seen from the value the atomic returns) to hi[b], so a bin's sum is hi * 2^32 + lo exactly, in any
    order of the adds."""
    low = uint32(v & uint64(0xFFFFFFFF))
    old = cuda.atomic.add(lo, b, low)
    high = (v >> uint64(32)) + ((uint64(old) + uint64(low)) >> uint64(32))
    if high != uint64(0):
        cuda.atomic.add(hi, b, uint32(high))


@cuda.jit(device=True)
def _clear_bins(lo, hi, total, n_bins):
    """Zero the block's shared halves and its total (before a barrier)."""
    for b in range(cuda.threadIdx.x, n_bins, cuda.blockDim.x):
        lo[b] = 0
        hi[b] = 0
    if cuda.threadIdx.x == 0:
        total[0] = 0


@cuda.jit(device=True)
def _store_bins(lo, hi, total, n_bins, partial, totals, row, part, with_total):
    """After the block's adds (this syncs first): partial[row, part, b] = bin b's sum, and with ``with_total``
    totals[row, part] = the sum of the bins (an integer sum: exact)."""
    cuda.syncthreads()
    mine = int64(0)
    for b in range(cuda.threadIdx.x, n_bins, cuda.blockDim.x):
        value = int64((uint64(hi[b]) << uint64(32)) | uint64(lo[b]))
        partial[row, part, b] = value
        mine += value
    if with_total:
        cuda.atomic.add(total, 0, mine)
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            totals[row, part] = total[0]


#: Tokens a thread of a histogram pass reads before it hashes and adds them. At 296 x 128,256 on one H200 a pass
#: with no table took 0.255 / 0.226 / 0.213 / 0.234 ms at 1 / 2 / 4 / 8 (0.329 / 0.315 / 0.313 / 0.336 with two
#: tables), against ~0.07 ms for its bytes: more reads in flight hide their latency until the registers (80 at 8)
#: cost occupancy. The sums are integers: every value gives the same histogram.
HISTOGRAM_UNROLL = 4
#: Factor tables a histogram block copies into shared memory (pass c multiplies by c tables: at m <= 30 two at
#: most; a table beyond the cache is read from global memory). Two leave a block 24 KB of shared memory (32 KB
#: with three), room for eight blocks a multiprocessor; the passes timed the same with either at m = 30.
HISTOGRAM_CACHED_TABLES = 2
#: Blocks of THREADS a histogram pass asks the compiler to fit on a multiprocessor (``launch_bounds``: registers are
#: budgeted for them), or None for its own choice. Unbounded, the pass takes 52-61 registers a thread at 1-4 reads
#: in flight: four 256-thread blocks, half the multiprocessor's threads, hide the reads' latency. Budgets for 6 and 8
#: blocks (40 and 32 registers) made every pass 0.015-0.031 ms slower and the draw 0.07-0.09 ms (one H100).
HISTOGRAM_MIN_BLOCKS = None
#: Whether a histogram pass skips its atomic adds for a token whose fixed-point mass is 0 (adding 0 changes no bin,
#: so the sums are the same). A trained model's law leaves most ids' masses at 0 by the later passes (at m = 30, on
#: the embedded models at T = 0.7: 4 / 31-43 / 59-72 % of ids in passes 1 / 2 / 3, bench/tournament_laws.py); a
#: random-init model's law, the GPU benches' workload, leaves none. Off: on one H100 the skip made a pass
#: 0.004-0.017 ms slower and the draw +0.02 ms on those real laws too (the adds do not bound the pass).
HISTOGRAM_SKIP_ZERO = False


@functools.cache
def histogram32_kernel(unroll: int, cached: int = CACHED_TABLES, min_blocks: int | None = None,
                       skip_zero: bool = False):
    """The histogram pass with ``unroll`` reads in flight a thread, ``cached`` factor tables in shared memory,
    where given registers budgeted for ``min_blocks`` blocks of THREADS a multiprocessor, and, with ``skip_zero``,
    no adds for a token of fixed-point mass 0 (compiled once each)."""
    cache_size = max(cached, 1) * MAX_BINS  # numba sizes shared arrays at compile time: a closure constant
    bounds = {} if min_blocks is None else dict(launch_bounds=(THREADS, min_blocks))

    @cuda.jit(**bounds)
    def kernel(probs, seeds, tables, n_tables, table_bits, start, width, fixed_point, partial, totals):
        """``_histogram_kernel``'s sums with 32-bit shared atomics (``_add_fixed``: a 64-bit shared atomic add is a
        compare-and-swap loop on sm_90, ATOMS.CAST.SPIN.64, a 32-bit one a single ATOMS.ADD), block ``part`` of a
        row taking the contiguous segment of tokens part * L .. (part + 1) * L - 1 (L = ceil(V / gridDim.x)):
        partial[row, part] is that segment's histogram. The first pass (start 0) also writes totals[row, part], the
        segment's mass."""
        lo = cuda.shared.array(MAX_BINS, uint32)
        hi = cuda.shared.array(MAX_BINS, uint32)
        cache = cuda.shared.array(cache_size, float64)
        total = cuda.shared.array(1, int64)
        loaded = cuda.local.array(unroll, float64)
        row = cuda.blockIdx.y
        part = cuda.blockIdx.x
        t = cuda.threadIdx.x
        n_bins = 1 << width
        _clear_bins(lo, hi, total, n_bins)
        _cache_tables(cache, tables, n_tables, row, cached)
        cuda.syncthreads()
        seed = uint64(seeds[row])
        mask = uint64(n_bins - 1)
        shift = uint64(64 - start - width)
        vocab = probs.shape[1]
        seg_len = (vocab + cuda.gridDim.x - 1) // cuda.gridDim.x
        first = part * seg_len
        end = min(first + seg_len, vocab)
        step = cuda.blockDim.x
        for base in range(first + t, end, step * unroll):
            for i in range(unroll):  # the reads first, all in flight at once
                x = base + i * step
                loaded[i] = probs[row, x] if x < end else 0.0
            for i in range(unroll):
                x = base + i * step
                if x < end:
                    h = prf(seed, x)
                    mass = _mass(loaded[i], cache, tables, n_tables, table_bits, row, h, cached)
                    v = uint64(int64(mass * fixed_point + float64(0.5)))
                    if skip_zero and v == uint64(0):
                        continue
                    _add_fixed(lo, hi, int64((h >> shift) & mask), v)
        _store_bins(lo, hi, total, n_bins, partial, totals, row, part, start == 0)

    return kernel


@functools.cache
def binned_law_kernel(threads: int):
    """The step's law pass (``mmw.kernels.softmax``'s ``law_kernel``: the same expressions, so the same bits) that
    also makes the draw's first histogram pass over the law it writes (``choose``'s ``first``), for blocks of
    ``threads`` threads (compiled once a width). Here, not in ``mmw.kernels.softmax``: numba's CUDA simulator runs
    a device function of another module than its kernel's with the wrong ``cuda`` when its threads interleave."""

    @cuda.jit
    def kernel(logits, temperature, rows_stats, probs, spike, seeds, width, fixed_point, partial, totals):
        """From the row's (m, 1 / Z, m / T, 1 / Z_T): spike[row, part] = the segment's sum of p / (1 + p) with
        p = exp(x - m) / Z, probs[row, x] = exp(x / T - m / T) / Z_T (p itself at T = 1), and the law's histogram
        by each token's first ``width`` g-bits under the row's seed: partial[row, part] and totals[row, part], the
        integers ``histogram32_kernel`` (no table, start 0) gives from the written law. Block ``part`` of a row
        takes the contiguous segment of ceil(V / gridDim.x) tokens, as every pass of the draw does."""
        red = cuda.shared.array(threads, float64)
        lo = cuda.shared.array(MAX_BINS, uint32)
        hi = cuda.shared.array(MAX_BINS, uint32)
        bin_total = cuda.shared.array(1, int64)
        row = cuda.blockIdx.y
        part = cuda.blockIdx.x
        t = cuda.threadIdx.x
        n_bins = 1 << width
        _clear_bins(lo, hi, bin_total, n_bins)
        cuda.syncthreads()
        tempered = temperature != 1.0
        m = rows_stats[row, 0]
        inv_z = rows_stats[row, 1]
        mt = rows_stats[row, 2]
        inv_zt = rows_stats[row, 3]
        seed = uint64(seeds[row])
        mask = uint64(n_bins - 1)
        shift = uint64(64 - width)
        vocab = logits.shape[1]
        seg_len = (vocab + cuda.gridDim.x - 1) // cuda.gridDim.x
        end = min((part + 1) * seg_len, vocab)
        own = 0.0
        for x in range(part * seg_len + t, end, cuda.blockDim.x):
            v = float64(logits[row, x])
            p = math.exp(v - m) * inv_z
            own += p / (1.0 + p)
            q = math.exp(v / temperature - mt) * inv_zt if tempered else p
            probs[row, x] = q
            _add_fixed(lo, hi, int64((prf(seed, x) >> shift) & mask), uint64(int64(q * fixed_point + float64(0.5))))
        total = _block_sum(red, own)
        if t == 0:
            spike[row, part] = total
        _store_bins(lo, hi, bin_total, n_bins, partial, totals, row, part, True)

    return kernel


#: Threads of a table kernel's block (one block a row; a power of two). Each of a chunk's layers is a tree sum over
#: the block, so the block's width sets the depth of ten trees and the width of their barriers: at one bin a thread
#: (1,024 threads) the kernel took 0.051 ms (0.089 ms with the segments' masses) at 296 rows on one H200, two waves
#: of blocks whose barriers were the time. The value is the one ``bench/gpu_tournament.py --parts kernels`` times
#: fastest; any value gives the same tables up to the order of the float64 sums (fixed for a given value).
TABLE_THREADS = 256
#: Segments a row at most (the draw's ``sums``): a table kernel's block must hold one tree per segment.
MAX_SEGMENTS = 32


@cuda.jit
def _table_kernel(partial, width, leaves, fixed_point, tables, c, last, totals, plain, sums):
    """tables[c, row] = ``mmw.watermark.samplers.tournament.chunk_table`` of the row's histogram (the sum over
    partial's segments); one block a row, thread t owning the bins b = t mod blockDim (their masses and table entries
    in shared memory, touched by their owner alone); each layer's G is the tree sum, in shared memory, of the
    threads' sums of their bins with the layer's bit set (a fixed order: the same table every run). Bins from
    2^width up to the table's size are set to 1. For the ``last`` chunk, sums[row, s] = the law's mass in segment s:
    sum over b of partial[row, s, b] times the table (the model's own mass, totals[row, s], where plain[row]); with
    S segments padded to P (a power of two, P <= blockDim), thread t adds segment t mod P's bins
    b = t div P mod blockDim / P, and one tree over the threads sums all segments at once."""
    red = cuda.shared.array(MAX_BINS, float64)
    mass = cuda.shared.array(MAX_BINS, float64)
    table = cuda.shared.array(MAX_BINS, float64)
    row = cuda.blockIdx.x
    t = cuda.threadIdx.x
    threads = cuda.blockDim.x
    n_bins = 1 << width
    for b in range(t, n_bins, threads):
        count = int64(0)
        for p in range(partial.shape[1]):
            count += partial[row, p, b]
        mass[b] = float64(count) / fixed_point
        table[b] = 1.0
    for j in range(width):
        shift = width - 1 - j
        own = float64(0.0)
        for b in range(t, n_bins, threads):
            if (b >> shift) & 1:
                own += mass[b]
        total = _block_sum(red, own)
        if leaves == 2:  # 1 + g - G
            won = 2.0 - total
            lost = 1.0 - total
        else:
            miss = 1.0 - total
            won = (1.0 - math.pow(miss, float64(leaves))) / max(total, 2.2250738585072014e-308)
            lost = math.pow(miss, float64(leaves - 1))
        for b in range(t, n_bins, threads):
            factor = won if (b >> shift) & 1 else lost
            mass[b] *= factor
            table[b] *= factor
    for b in range(t, n_bins, threads):
        tables[c, row, b] = table[b]
    for k in range(n_bins + t, tables.shape[2], threads):
        tables[c, row, k] = 1.0
    if last:
        n_seg = partial.shape[1]
        if plain[row]:
            for s in range(t, n_seg, threads):
                sums[row, s] = float64(totals[row, s]) / fixed_point
        else:
            padded = 1
            while padded < n_seg:
                padded <<= 1
            s = t & (padded - 1)
            own = float64(0.0)
            cuda.syncthreads()  # every table entry written by its owner
            if s < n_seg:
                for b in range(t // padded, n_bins, threads // padded):
                    own += float64(partial[row, s, b]) / fixed_point * table[b]
            red[t] = own
            cuda.syncthreads()
            half = threads >> 1
            while half >= padded:  # t and t + half hold the same segment
                if t < half:
                    red[t] += red[t + half]
                cuda.syncthreads()
                half >>= 1
            if t < n_seg:
                sums[row, t] = red[t]


@functools.cache
def pick_kernel(threads: int, run: int):
    """The draw's scan with ``threads`` threads a block, each adding ``run`` tokens in sequence (compiled once per
    pair)."""

    @cuda.jit
    def kernel(probs, seeds, tables, n_tables, table_bits, last_bits, plain, sums, u, out):
        """out[row] = the count of the law's CDF entries below u[row] times its total (``inverse_cdf``), clamped to
        the last token of positive law in the segment it falls in. The CDF at the segments' ends is the running sum
        of ``sums`` (the histograms' segments); inside the segment that holds the target, each thread adds ``run``
        tokens' law in sequence, a block scan adds the threads' sums, tile by tile."""
        cache = cuda.shared.array(_CACHE_SIZE, float64)
        scan = cuda.shared.array(threads, float64)
        info = cuda.shared.array(2, float64)  # the CDF before the chosen segment, the target
        counts = cuda.shared.array(2, int64)  # the chosen segment, the count of its entries below the target
        local = cuda.local.array(run, float64)
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        n = 0 if plain[row] else n_tables
        _cache_tables(cache, tables, n, row, CACHED_TABLES)
        if t == 0:
            n_seg = sums.shape[1]
            total = float64(0.0)
            for s in range(n_seg):
                total += sums[row, s]
            target = u[row] * total
            cum = float64(0.0)
            seg = n_seg - 1
            base = float64(0.0)
            for s in range(n_seg):
                nxt = cum + sums[row, s]
                base = cum
                if nxt >= target:
                    seg = s
                    break
                cum = nxt
            info[0] = base
            info[1] = target
            counts[0] = seg
            counts[1] = 0
        cuda.syncthreads()
        base = info[0]
        target = info[1]
        seed = uint64(seeds[row])
        vocab = probs.shape[1]
        seg_len = (vocab + sums.shape[1] - 1) // sums.shape[1]
        first = counts[0] * seg_len
        end = min(first + seg_len, vocab)
        running = float64(0.0)
        below = int64(0)
        last_positive = int64(first)
        for tile in range(first, end, cuda.blockDim.x * run):
            own = float64(0.0)
            for i in range(run):
                x = tile + t * run + i
                law = float64(0.0)
                if x < end:
                    law = _law(probs, cache, tables, n, table_bits, last_bits, row, x, prf(seed, x))
                    if law > 0.0:
                        last_positive = x
                local[i] = law
                own += law
            scan[t] = own
            cuda.syncthreads()
            offset = 1
            while offset < cuda.blockDim.x:  # Hillis-Steele inclusive scan of the threads' sums
                add = scan[t - offset] if t >= offset else 0.0
                cuda.syncthreads()
                scan[t] += add
                cuda.syncthreads()
                offset <<= 1
            before = scan[t - 1] if t > 0 else 0.0
            acc = before
            for i in range(run):
                acc += local[i]
                if tile + t * run + i < end and base + (running + acc) < target:
                    below += 1
            running += scan[cuda.blockDim.x - 1]
            cuda.syncthreads()
        cuda.atomic.add(counts, 1, below)
        scan[t] = float64(last_positive)
        cuda.syncthreads()
        s = cuda.blockDim.x >> 1
        while s > 0:
            if t < s:
                scan[t] = max(scan[t], scan[t + s])
            cuda.syncthreads()
            s >>= 1
        if t == 0:
            out[row] = min(first + counts[1], int64(scan[0]))

    return kernel


def _launch_stream(tensor):
    import torch

    return cuda.external_stream(torch.cuda.current_stream(tensor.device).cuda_stream)


def choose(probs, seeds, u, plain, layers: int, leaves: int, chunk_bits: int, fixed_point: float, first=None):
    """The tournament's inverse-CDF token of every row, its law never written: probs float64 [B, V], seeds int64 [B],
    u float64 [B], plain uint8 [B] (rows drawn from probs itself) (CUDA tensors, contiguous), layers >= 1 -> int64
    [B].

    ceil(layers / chunk_bits) histogram passes (``histogram32_kernel``) over PARTS contiguous segments of each row,
    each pass followed by its chunk's factor table (``_table_kernel``), which after the last one also gives the
    law's mass in each segment; then one block a row finds the segment that holds u times the total and scans it
    (``pick_kernel``). Against the law written by a last pass and drawn by ``inverse_cdf``, this saves that pass's
    write, a scan's read and write of the law and the count's read of it. The segments' masses come from the
    fixed-point histograms (each token's mass rounded to 2^-62), the scan inside a segment from the float law: the
    token is ``inverse_cdf``'s except where u times the total falls within ~V 2^-62 of a segment's end.
    ``first``: the first pass's result where the pass that wrote probs also computed it (``mmw.kernels.softmax``'s
    ``binned_law_kernel``): (bins int64 [B, S, 2^min(chunk_bits, layers)], totals int64 [B, S]), S segments a row;
    that pass is then not run again."""
    import torch

    if (1 << chunk_bits) > MAX_BINS or layers < 1:
        raise ValueError(f"chunk_bits must be at most 10 and layers at least 1, got {chunk_bits} and {layers}")
    rows = probs.shape[0]
    out = torch.empty(rows, dtype=torch.int64, device=probs.device)
    if not rows:
        return out
    segments = PARTS if first is None else first[0].shape[1]
    n_chunks = -(-layers // chunk_bits)
    tables = torch.empty(n_chunks, rows, 1 << chunk_bits, dtype=torch.float64, device=probs.device)
    partial = torch.empty(rows, segments, 1 << chunk_bits, dtype=torch.int64, device=probs.device)
    if first is None:
        totals = torch.empty(rows, segments, dtype=torch.int64, device=probs.device)
    else:
        width = min(chunk_bits, layers)
        if tuple(first[0].shape) != (rows, segments, 1 << width) or tuple(first[1].shape) != (rows, segments):
            raise ValueError(f"the first pass's bins and totals must be [{rows}, S, {1 << width}] and [{rows}, S], "
                             f"got {tuple(first[0].shape)} and {tuple(first[1].shape)}")
        totals = first[1]
    sums = torch.empty(rows, segments, dtype=torch.float64, device=probs.device)
    first_bins = None if first is None else _device_array(first[0].contiguous())
    launch_choose(*(_device_array(x) for x in (probs, seeds, u, plain, tables, partial, totals, sums, out)), layers,
                  leaves, chunk_bits, fixed_point, _launch_stream(probs), first_bins)
    return out


def launch_choose(probs, seeds, u, plain, tables, partial, totals, sums, out, layers, leaves, chunk_bits,
                  fixed_point, stream=0, first_bins=None):
    """``choose``'s launches on device (or, in numba's simulator, host) arrays. Scratch: tables float64
    [C, B, 2^chunk_bits], partial int64 [B, S, 2^chunk_bits], totals int64 [B, S], sums float64 [B, S], S the
    number of segments a row. ``first_bins``: int64 [B, S, 2^min(chunk_bits, layers)], the first pass's histogram
    already computed, with ``totals`` already written; None: the first pass runs here."""
    rows = probs.shape[0]
    n_chunks = -(-layers // chunk_bits)
    segments = partial.shape[1]
    if TABLE_THREADS & (TABLE_THREADS - 1) or not 1 <= TABLE_THREADS <= MAX_BINS:
        raise ValueError(f"TABLE_THREADS must be a power of two from 1 to {MAX_BINS}, got {TABLE_THREADS}")
    if not 1 <= segments <= min(MAX_SEGMENTS, TABLE_THREADS):
        raise ValueError(f"segments a row must be from 1 to min({MAX_SEGMENTS}, TABLE_THREADS = {TABLE_THREADS}), "
                         f"got {segments}")
    for c in range(n_chunks):
        width = min(chunk_bits, layers - c * chunk_bits)
        bins = partial
        if c == 0 and first_bins is not None:
            bins = first_bins
        else:
            histogram32_kernel(HISTOGRAM_UNROLL, HISTOGRAM_CACHED_TABLES, HISTOGRAM_MIN_BLOCKS, HISTOGRAM_SKIP_ZERO)[
                (segments, rows), THREADS, stream](
                probs, seeds, tables, c, chunk_bits, c * chunk_bits, width, fixed_point, partial, totals)
        _table_kernel[rows, TABLE_THREADS, stream](bins, width, leaves, fixed_point, tables, c, c == n_chunks - 1,
                                                   totals, plain, sums)
    pick_kernel(PICK_THREADS, PICK_RUN)[rows, PICK_THREADS, stream](
        probs, seeds, tables, n_chunks, chunk_bits, layers - (n_chunks - 1) * chunk_bits, plain, sums, u, out)
