"""CUDA twin: ``@cuda.jit`` kernels over packed ragged batches (same inputs and outputs as ``cpu.py``).

Work decomposition (the values come from ``stats.py``; only the traversal differs from the CPU twin):
- S1 sum: one thread per text (the per-text pass is sequential by definition: first occurrence, running sums;
  it is a small share of the work).
- S2 align: one block per (text, key) pair, one thread per key shift; per token, the per-shift running sums are
  reduced to their minimum in shared memory, a tile of ``ALIGN_TILE`` tokens at a time.
- S3 edit (fixed key): persistent blocks take (text, key) pairs from an atomic queue (longest first); a block fills
  the pair's cost table (token x key position, each row padded with its first ``BAND`` entries so that a band never
  wraps) in its global scratch, then each thread runs the whole DP of one shift. The DP sweeps bands of ``BAND``
  columns kept in registers down all rows, so the only memory traffic per cell is one cost read, which the 32
  shifts of a warp share as coalesced 256-byte accesses (mostly L1 hits); each band leaves one column of running
  minima in global scratch for the next (16 / BAND bytes per cell each way). The next row's costs and boundary
  value are loaded a row ahead to hide their latency. Measured on an H200 (bench/RESULTS.md): latency-bound at
  8 warps per SM (registers), 47 % of the same instruction mix run from registers only.
- S3 edit (window 1): the same band DP, one thread per trial key of one text; the cost is computed on the fly.
- The permutation-test count runs on the device too: only the observed scores and counts come back.
"""

from __future__ import annotations

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still refers to np.row_stack, which numpy 2.5 removed
    np.row_stack = np.vstack

from numba import config, cuda, float64, int64, uint64  # noqa: E402
from numba.extending import register_jitable  # noqa: E402

from mmw.kernels.disk_cache import drop_stale  # noqa: E402
from mmw.kernels.prf import prf  # noqa: E402
from mmw.kernels.stats import (FIXED, TAG_FIXED, anytime_text, edit_cell, fixed_seed, key_at,  # noqa: E402
                               source_base, sum_prefix_text, text_seed, token_statistic)

BAND = 16  # DP columns held in registers per thread
COLUMN_PAD = BAND  # the last band reads steps[j] up to N + BAND
ALIGN_TILE = 16  # tokens per shared-memory reduction in the align kernel
MAX_THREADS = 256
EDIT_THREADS = 128  # shifts per fixed-key edit block (4 warps share each row of the cost table)
MAX_THREADS_PER_SM = 2048  # grids of persistent blocks are sized to fill this (the queue balances the rest)
SCRATCH_BYTES = 6 << 30  # cap on the edit kernels' global scratch


def available() -> bool:
    """True when numba sees a CUDA device (or runs the simulator)."""
    return cuda.is_available()


# Each kernel is compiled once per signature and machine and kept on disk (else numba compiles it again in every
# process that detects on the GPU); dropped when the spec it inlines changes.
drop_stale(__file__)


# ---------------------------------------------------------------------------------------------------- kernels
@cuda.jit(cache=True)
def _key_sequences(key, sequences):
    """sequences[t, r] = r-th entry of trial t's fixed key sequence (uint64 [K, L])."""
    n_keys, length = sequences.shape
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for q in range(start, n_keys * length, stride):
        t = q // length
        r = q - t * length
        sequences[t, r] = fixed_seed(prf(key_at(key, t), TAG_FIXED), r)


@cuda.jit(cache=True)
def _sum_kernel(tokens, offsets, source, window, key, kind, gamma, rank, denominator, path_nodes, path_bits,
                table_offsets, keys, used, total, count):
    """One thread per text (see ``stats.sum_prefix_text``)."""
    b = cuda.grid(1)
    if b < offsets.shape[0] - 1:
        start = offsets[b]
        sum_prefix_text(tokens, start, offsets[b + 1] - start, source, window, source_base(source, key), kind,
                        gamma, rank, denominator, path_nodes, path_bits, keys, used, table_offsets[b],
                        table_offsets[b + 1] - table_offsets[b], total, count)


@cuda.jit(cache=True)
def _align_kernel(tokens, offsets, order, n_keys, sequences, kind, gamma, rank, denominator, path_nodes,
                  path_bits, scores):
    """Block = one (text, key) pair; blockDim is a power of two; thread = shift (several if L > blockDim)."""
    partial = cuda.shared.array((ALIGN_TILE, MAX_THREADS), float64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    item = order[cuda.blockIdx.x]
    b = item // n_keys
    t = item - b * n_keys
    start = offsets[b]
    n = offsets[b + 1] - start
    length = sequences.shape[1]
    for first_shift in range(0, length, threads):
        shift = first_shift + tid
        running = 0.0
        r = shift % length
        for tile in range(0, n, ALIGN_TILE):
            for row in range(ALIGN_TILE):
                value = np.inf
                if tile + row < n and shift < length:
                    running += token_statistic(kind, tokens[start + tile + row], sequences[t, r], gamma, rank,
                                               denominator, path_nodes, path_bits)
                    value = running
                    r += 1
                    if r == length:
                        r = 0
                partial[row, tid] = value
            cuda.syncthreads()
            width = threads // 2
            while width > 0:  # tree minimum over the threads, for all rows of the tile at once
                for q in range(tid, ALIGN_TILE * width, threads):
                    row = q // width
                    col = q - row * width
                    if partial[row, col + width] < partial[row, col]:
                        partial[row, col] = partial[row, col + width]
                cuda.syncthreads()
                width //= 2
            if tid < ALIGN_TILE and tile + tid < n:
                p = start + tile + tid
                if first_shift == 0 or partial[tid, 0] < scores[t, p]:
                    scores[t, p] = partial[tid, 0]
            cuda.syncthreads()


@register_jitable
def _band_row(m, diag, up, stp, costs, use_table, token, seed_col, psi, on_diagonal, kind, gamma, rank, denominator,
              path_nodes, path_bits):
    """One row i of a band: updates ``up`` (D(i-1, j) -> D(i, j) for the band's columns) and returns
    (m(i, last band column), D(i, j0 + 1 + on_diagonal) or +inf when on_diagonal is not a band column).
    Costs come from ``costs`` (loaded a row ahead) with a table, else they are computed here."""
    value = np.inf
    for k in range(BAND):
        if use_table:
            cost = costs[k]
        else:
            cost = token_statistic(kind, token, seed_col[k], gamma, rank, denominator, path_nodes, path_bits)
        m, d = edit_cell(m, diag, up[k], cost, psi, stp[k])
        diag = up[k]
        up[k] = d
        if k == on_diagonal:
            value = d
    return m, value


@register_jitable
def _load_costs(costs, table, row_start):
    """The band's costs of one row: constant offsets from one address (the unsigned index skips numba's
    negative-index wraparound code)."""
    for k in range(BAND):
        costs[k] = table[np.uint64(row_start + k)]


@register_jitable
def _band_step(i, n_rows, j0, left, step0, next_m, row, stride, use_table, table, costs, next_costs, up, stp, tokens,
               row_start, seed_col, psi, boundary, diag_out, kind, gamma, rank, denominator, path_nodes, path_bits):
    """Row i of a band, whose boundary value and costs were loaded a row ahead (``next_m``, ``costs``); first
    issues the loads for row i + 1 (into ``next_costs``) so that their latency hides behind this row's arithmetic.
    Returns (m(i, j0) for the next row's diagonal, boundary value of row i + 1)."""
    m = next_m
    diag = left + step0  # D(i-1, j0), recomputed exactly as the previous band did
    left = m
    if i < n_rows:
        next_m = boundary[i + 1]  # still the previous band's value: row i + 1 is rewritten later
        if use_table:
            _load_costs(next_costs, table, row + stride)
    token = tokens[row_start + i - 1]
    if j0 < i <= j0 + BAND:  # the diagonal D(i, i) lies in this band
        m, value = _band_row(m, diag, up, stp, costs, use_table, token, seed_col, psi, i - j0 - 1, kind, gamma, rank,
                             denominator, path_nodes, path_bits)
        if value < diag_out[i - 1]:
            diag_out[i - 1] = value
    else:
        m, value = _band_row(m, diag, up, stp, costs, use_table, token, seed_col, psi, -1, kind, gamma, rank,
                             denominator, path_nodes, path_bits)
    boundary[i] = m
    return left, next_m


@register_jitable
def band_edit_dp(n_rows, shift, columns, use_table, table, tokens, row_start, seed_base, source, psi, steps,
                 boundary, diag_out, up, stp, costs_a, costs_b, seed_col, kind, gamma, rank, denominator, path_nodes,
                 path_bits):
    """The edit DP of one instance, swept in bands of ``BAND`` columns (``up``, ``stp``, ``costs_a``, ``costs_b``
    and ``seed_col`` are BAND-long local arrays indexed only by unrolled constants, so that they live in
    registers).

    Cost of text row i (1-based) vs column j: with ``use_table`` (fixed key), ``table[(i-1) * (columns + BAND) +
    (shift + j - 1) mod columns]``, the table's rows repeating their first BAND entries at the end so that a band
    never wraps; else ``s(tokens[row_start + i - 1], seed of column j)`` with the window-1 seed of
    ``tokens[row_start + j - 2]`` (text-dependent). ``boundary`` (float64 [n_rows + 1]) carries m(i, j0) between
    bands; ``diag_out[n - 1] = min(diag_out[n - 1], D(n, n))``. Columns past n_rows in the last band are computed
    on clamped inputs and never read. Rows go in pairs so that the two cost buffers swap roles without copies."""
    stride = columns + BAND
    boundary[0] = 0.0  # so that D(0, j0) = 0 + j0 psi, as the reference's first row
    for i in range(1, n_rows + 1):
        boundary[i] = steps[i]  # m(i, 0) = i psi
    for j0 in range(0, n_rows, BAND):
        for k in range(BAND):
            stp[k] = steps[j0 + 1 + k]
            up[k] = stp[k]
            if not use_table:
                seed_col[k] = text_seed(source, tokens, row_start + min(j0 + k, n_rows - 1), 1, seed_base)
        left = boundary[0]
        step0 = steps[j0]
        row = (shift + j0) % columns
        next_m = boundary[1]
        if use_table:
            _load_costs(costs_a, table, row)
        for i in range(1, n_rows + 1, 2):
            left, next_m = _band_step(i, n_rows, j0, left, step0, next_m, row, stride, use_table, table, costs_a,
                                      costs_b, up, stp, tokens, row_start, seed_col, psi, boundary, diag_out, kind,
                                      gamma, rank, denominator, path_nodes, path_bits)
            row += stride
            if i < n_rows:
                left, next_m = _band_step(i + 1, n_rows, j0, left, step0, next_m, row, stride, use_table, table,
                                          costs_b, costs_a, up, stp, tokens, row_start, seed_col, psi, boundary,
                                          diag_out, kind, gamma, rank, denominator, path_nodes, path_bits)
                row += stride


@cuda.jit(cache=True)
def _edit_fixed_kernel(tokens, offsets, order, n_keys, sequences, psi, steps, kind, gamma, rank, denominator,
                       path_nodes, path_bits, queue, tables, boundary, best, scores):
    """Persistent block: takes (text, key) pairs from ``queue``; thread = shift (several if L > blockDim).
    Scratch per block: tables [G, max_n * (L + BAND)], boundary [G, max_n + 1, threads], best [G, max_n, threads]."""
    current = cuda.shared.array(1, int64)
    up = cuda.local.array(BAND, float64)
    stp = cuda.local.array(BAND, float64)
    costs_a = cuda.local.array(BAND, float64)
    costs_b = cuda.local.array(BAND, float64)
    unused_seeds = cuda.local.array(BAND, uint64)
    blk = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    length = sequences.shape[1]
    table = tables[blk]
    column = boundary[blk, :, tid]
    mine = best[blk, :, tid]
    while True:
        if tid == 0:
            current[0] = cuda.atomic.add(queue, 0, 1)
        cuda.syncthreads()
        index = current[0]
        cuda.syncthreads()
        if index >= order.shape[0]:
            return
        b = order[index] // n_keys
        t = order[index] - b * n_keys
        start = offsets[b]
        n = offsets[b + 1] - start
        stride = length + BAND  # each row repeats its first BAND entries: a band of columns never wraps
        for q in range(tid, n * stride, threads):
            i = q // stride
            table[q] = token_statistic(kind, tokens[start + i], sequences[t, (q - i * stride) % length], gamma,
                                       rank, denominator, path_nodes, path_bits)
        for i in range(n):
            mine[i] = np.inf
        cuda.syncthreads()
        for shift in range(tid, length, threads):
            band_edit_dp(n, shift, length, True, table, tokens, start, np.uint64(0), FIXED, psi, steps, column,
                         mine, up, stp, costs_a, costs_b, unused_seeds, kind, gamma, rank, denominator, path_nodes,
                         path_bits)
        cuda.syncthreads()
        for i in range(tid, n, threads):  # minimum over the block's shifts
            value = np.inf
            for q in range(threads):
                if best[blk, i, q] < value:
                    value = best[blk, i, q]
            scores[t, start + i] = value
        cuda.syncthreads()


@cuda.jit(cache=True)
def _edit_window_kernel(tokens, offsets, text_order, n_keys, key, source, psi, steps, kind, gamma, rank,
                        denominator, path_nodes, path_bits, queue, boundary, scores):
    """Persistent block: takes (text, group of blockDim keys) items from ``queue``; thread = one key's DP."""
    current = cuda.shared.array(1, int64)
    up = cuda.local.array(BAND, float64)
    stp = cuda.local.array(BAND, float64)
    seed_col = cuda.local.array(BAND, uint64)
    no_costs = cuda.local.array(BAND, float64)
    no_table = cuda.local.array(1, float64)
    blk = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    groups = (n_keys + threads - 1) // threads
    column = boundary[blk, :, tid]
    while True:
        if tid == 0:
            current[0] = cuda.atomic.add(queue, 0, 1)
        cuda.syncthreads()
        index = current[0]
        cuda.syncthreads()
        if index >= text_order.shape[0] * groups:
            return
        b = text_order[index // groups]
        t = (index % groups) * threads + tid
        start = offsets[b]
        n = offsets[b + 1] - start
        if t < n_keys and n > 0:
            scores[t, start] = 0.0
            for i in range(1, n):
                scores[t, start + i] = np.inf
            if n > 1:
                base = source_base(source, key_at(key, t))
                band_edit_dp(n - 1, 0, n - 1, False, no_table, tokens, start + 1, base, source, psi, steps, column,
                             scores[t, start + 1: start + n], up, stp, no_costs, no_costs, seed_col, kind, gamma,
                             rank, denominator, path_nodes, path_bits)


@cuda.jit(cache=True)
def _anytime_kernel(total, count, offsets, a, b, log_weights, log_threshold, log_e, sizes):
    """One thread per text (see ``stats.anytime_text``)."""
    t = cuda.grid(1)
    if t < offsets.shape[0] - 1:
        start = offsets[t]
        sizes[t] = anytime_text(total, count, start, offsets[t + 1] - start, a, b, log_weights, log_threshold, log_e)


@cuda.jit(cache=True)
def _count_kernel(scores, n_le):
    p = cuda.grid(1)
    if p < scores.shape[1]:
        observed = scores[0, p]
        hits = 0
        for t in range(1, scores.shape[0]):
            if scores[t, p] <= observed:
                hits += 1
        n_le[p] = hits


# ---------------------------------------------------------------------------------------------------- drivers
def _blocks(n: int, threads: int) -> int:
    return max(1, (n + threads - 1) // threads)


def _power_of_two_threads(length: int) -> int:
    return int(min(MAX_THREADS, max(32, 1 << (max(length, 1) - 1).bit_length())))


def _resident_blocks(threads: int) -> int:
    """Blocks of ``threads`` that fit the device at once (ignoring registers)."""
    if config.ENABLE_CUDASIM:  # the simulator runs blocks one after another and has no device to ask
        return 1
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT) * max(1, MAX_THREADS_PER_SM // threads)


_DEVICE_COPIES: dict[int, tuple[np.ndarray, object]] = {}


def _on_device(array: np.ndarray):
    """Device copy of a host array, reused while the same array object lives (the C3 code's paths, ~10 MB, are
    shared by every detector of a vocabulary)."""
    hit = _DEVICE_COPIES.get(id(array))
    if hit is None or hit[0] is not array:
        if len(_DEVICE_COPIES) >= 8:
            _DEVICE_COPIES.clear()
        hit = (array, cuda.to_device(array))
        _DEVICE_COPIES[id(array)] = hit
    return hit[1]


def _sampler_args(arrays) -> tuple:
    return (arrays.kind, arrays.gamma, _on_device(arrays.rank), arrays.denominator, _on_device(arrays.path_nodes),
            _on_device(arrays.path_bits))


def run_sum(tokens, offsets, table_offsets, source, window, key, arrays):
    """S1 for a packed batch -> (total float64 [total_tokens], n_units int64 [total_tokens])."""
    sampler = _sampler_args(arrays)
    d_tokens, d_offsets, d_tables = cuda.to_device(tokens), cuda.to_device(offsets), cuda.to_device(table_offsets)
    capacity = max(int(table_offsets[-1]), 1)
    keys = cuda.device_array(capacity, dtype=np.uint64)
    used = cuda.device_array(capacity, dtype=np.uint8)
    total = cuda.device_array(max(len(tokens), 1), dtype=np.float64)
    count = cuda.device_array(max(len(tokens), 1), dtype=np.int64)
    texts = len(offsets) - 1
    _sum_kernel[_blocks(texts, 64), 64](d_tokens, d_offsets, source, window, key, *sampler, d_tables, keys, used,
                                        total, count)
    return total.copy_to_host()[: len(tokens)], count.copy_to_host()[: len(tokens)]


def run_empirical(score, source, tokens, offsets, order, n_keys, key, key_length, psi, steps, arrays):
    """S2/S3 for every (text, key) pair of a packed batch and the permutation-test count on the device
    -> (observed float64 [total_tokens], n_le int64 [total_tokens])."""
    total_tokens = len(tokens)
    if total_tokens == 0 or len(order) == 0:
        return np.zeros(total_tokens), np.zeros(total_tokens, dtype=np.int64)
    sampler = _sampler_args(arrays)
    d_tokens, d_offsets, d_order = cuda.to_device(tokens), cuda.to_device(offsets), cuda.to_device(order)
    scores = cuda.device_array((n_keys, total_tokens), dtype=np.float64)
    max_n = int(np.diff(offsets).max())
    queue = cuda.to_device(np.zeros(1, dtype=np.int64))
    if source == FIXED:
        sequences = cuda.device_array((n_keys, key_length), dtype=np.uint64)
        _key_sequences[_blocks(n_keys * key_length, 256), 256](key, sequences)
        if score == "align":
            threads = _power_of_two_threads(key_length)
            _align_kernel[len(order), threads](d_tokens, d_offsets, d_order, n_keys, sequences, *sampler, scores)
        else:
            threads = int(min(EDIT_THREADS, 32 * _blocks(key_length, 32)))
            per_block = 8 * (max_n * (key_length + BAND) + (2 * max_n + 1) * threads)
            grid = max(1, min(len(order), _resident_blocks(threads), SCRATCH_BYTES // per_block))
            tables = cuda.device_array((grid, max_n * (key_length + BAND)), dtype=np.float64)
            boundary = cuda.device_array((grid, max_n + 1, threads), dtype=np.float64)
            best = cuda.device_array((grid, max_n, threads), dtype=np.float64)
            _edit_fixed_kernel[grid, threads](d_tokens, d_offsets, d_order, n_keys, sequences, psi,
                                              cuda.to_device(steps), *sampler, queue, tables, boundary, best, scores)
    else:
        texts = np.ascontiguousarray(order[::n_keys] // n_keys)  # pair_order lists each text's keys together
        threads = int(min(MAX_THREADS, 32 * _blocks(n_keys, 32)))
        items = len(texts) * _blocks(n_keys, threads)
        grid = max(1, min(items, _resident_blocks(threads), SCRATCH_BYTES // (8 * (max_n + 1) * threads)))
        boundary = cuda.device_array((grid, max_n + 1, threads), dtype=np.float64)
        _edit_window_kernel[grid, threads](d_tokens, d_offsets, cuda.to_device(texts), n_keys, key, source, psi,
                                           cuda.to_device(steps), *sampler, queue, boundary, scores)
    n_le = cuda.device_array(total_tokens, dtype=np.int64)
    _count_kernel[_blocks(total_tokens, 256), 256](scores, n_le)
    return scores[0].copy_to_host(), n_le.copy_to_host()


def run_anytime(total, count, offsets, bets, log_threshold):
    """E-process of a packed batch -> (log e-value float64 [total_tokens], size int64 [B], 0 = never)."""
    texts = len(offsets) - 1
    log_e = cuda.device_array(max(len(total), 1), dtype=np.float64)
    sizes = cuda.device_array(max(texts, 1), dtype=np.int64)
    if texts:
        _anytime_kernel[_blocks(texts, 64), 64](cuda.to_device(total), cuda.to_device(count), cuda.to_device(offsets),
                                                cuda.to_device(bets.a), cuda.to_device(bets.b),
                                                cuda.to_device(bets.log_weights), log_threshold, log_e, sizes)
    return log_e.copy_to_host()[: len(total)], sizes.copy_to_host()[:texts]
