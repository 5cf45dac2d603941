"""CPU twin: ``@njit(parallel=True)`` traversals over packed ragged batches.

A batch is ``tokens`` (int64, all texts back to back) and ``offsets`` (int64 [B + 1]); text b is
``tokens[offsets[b]:offsets[b+1]]``. Empirical scores (align, edit) are computed for every (text, key) pair into
``scores`` (float64 [K, total_tokens], row 0 = the watermark key, row t = trial t - 1) and then compared; the pairs
are the parallel loop, so one long text with 100 trials still uses every core. ``order`` lists the pairs longest
text first, which with a chunk size of 1 balances the threads (longest-processing-time first).
"""

from __future__ import annotations

import numpy as np
from numba import njit, parallel_chunksize, prange

from mmw.kernels.disk_cache import drop_stale
from mmw.kernels.prf import prf
from mmw.kernels.stats import (FIXED, TAG_FIXED, anytime_text, edit_cell, fixed_seed, key_at, source_base,
                               sum_prefix_text, text_seed, token_statistic)


drop_stale(__file__)  # the shared spec changed since a cached kernel was compiled: compile it again


@njit(parallel=True, cache=True)
def sum_prefix(tokens, offsets, source, window, key, kind, gamma, rank, denominator, path_nodes, path_bits,
               table_offsets, keys, used, total, count):
    """S1 for every text (one text per parallel iteration; each owns its hash-set slice of keys/used)."""
    base = source_base(source, key)
    for b in prange(len(offsets) - 1):
        start = offsets[b]
        sum_prefix_text(tokens, start, offsets[b + 1] - start, source, window, base, kind, gamma, rank,
                        denominator, path_nodes, path_bits, keys, used, table_offsets[b],
                        table_offsets[b + 1] - table_offsets[b], total, count)


@njit(parallel=True, cache=True)
def align_scores(tokens, offsets, order, n_keys, key, key_length, kind, gamma, rank, denominator, path_nodes,
                 path_bits, scores):
    """S2: scores[t, start + i] = min over shifts j of sum_{i' <= i} s(T_i', r_t[(i' + j) mod L])."""
    for item in prange(len(order)):
        b = order[item] // n_keys
        t = order[item] % n_keys
        start = offsets[b]
        n = offsets[b + 1] - start
        fixed_base = prf(key_at(key, t), TAG_FIXED)
        sequence = np.empty(key_length, dtype=np.uint64)
        for r in range(key_length):
            sequence[r] = fixed_seed(fixed_base, r)
        sums = np.zeros(key_length)
        for i in range(n):
            token = tokens[start + i]
            best = np.inf
            r = i % key_length
            for j in range(key_length):
                sums[j] += token_statistic(kind, token, sequence[r], gamma, rank, denominator, path_nodes,
                                           path_bits)
                if sums[j] < best:
                    best = sums[j]
                r += 1
                if r == key_length:
                    r = 0
            scores[t, start + i] = best


@njit(cache=True)
def _edit_rows(table, n_rows, columns, n_shifts, psi, steps, best):
    """The edit DP (row by row, as the reference) for each shift s: cost(i, j) = table[i, (s + j) mod columns];
    best[n - 1] = min over shifts of D(n, n)."""
    row = np.empty(n_rows + 1)
    for s in range(n_shifts):
        for j in range(n_rows + 1):
            row[j] = steps[j]
        for i in range(1, n_rows + 1):
            m = steps[i]
            diag = row[0]
            row[0] = steps[i]
            r = s % columns
            for j in range(1, n_rows + 1):
                up = row[j]
                m, d = edit_cell(m, diag, up, table[i - 1, r], psi, steps[j])
                row[j] = d
                diag = up
                r += 1
                if r == columns:
                    r = 0
            if row[i] < best[i - 1]:
                best[i - 1] = row[i]


@njit(parallel=True, cache=True)
def edit_fixed_scores(tokens, offsets, order, n_keys, key, key_length, psi, steps, kind, gamma, rank,
                      denominator, path_nodes, path_bits, scores):
    """S3 with a fixed key: min over the L shifts of the diagonal D(n, n) of text vs shifted key sequence."""
    for item in prange(len(order)):
        b = order[item] // n_keys
        t = order[item] % n_keys
        start = offsets[b]
        n = offsets[b + 1] - start
        fixed_base = prf(key_at(key, t), TAG_FIXED)
        table = np.empty((n, key_length))
        for r in range(key_length):
            seed = fixed_seed(fixed_base, r)
            for i in range(n):
                table[i, r] = token_statistic(kind, tokens[start + i], seed, gamma, rank, denominator,
                                              path_nodes, path_bits)
        best = np.full(n, np.inf)
        _edit_rows(table, n, key_length, key_length, psi, steps, best)
        for i in range(n):
            scores[t, start + i] = best[i]


@njit(parallel=True, cache=True)
def edit_window_scores(tokens, offsets, order, n_keys, key, source, psi, steps, kind, gamma, rank, denominator,
                       path_nodes, path_bits, scores):
    """S3 with text-dependent randomness of window 1: tokens 1..N-1 against the seeds of positions 1..N-1;
    prefix 1 has nothing to score (0)."""
    for item in prange(len(order)):
        b = order[item] // n_keys
        t = order[item] % n_keys
        start = offsets[b]
        n = offsets[b + 1] - start
        if n == 0:
            continue
        scores[t, start] = 0.0
        if n < 2:
            continue
        base = source_base(source, key_at(key, t))
        n_rows = n - 1
        table = np.empty((n_rows, n_rows))
        for j in range(n_rows):
            seed = text_seed(source, tokens, start + 1 + j, 1, base)
            for i in range(n_rows):
                table[i, j] = token_statistic(kind, tokens[start + 1 + i], seed, gamma, rank, denominator,
                                              path_nodes, path_bits)
        best = np.full(n_rows, np.inf)
        _edit_rows(table, n_rows, n_rows, 1, psi, steps, best)
        for i in range(n_rows):
            scores[t, start + 1 + i] = best[i]


@njit(parallel=True, cache=True)
def count_at_most(scores, n_le):
    """n_le[p] = #{t >= 1 : scores[t, p] <= scores[0, p]} (the permutation test's count)."""
    for p in prange(scores.shape[1]):
        observed = scores[0, p]
        hits = 0
        for t in range(1, scores.shape[0]):
            if scores[t, p] <= observed:
                hits += 1
        n_le[p] = hits


# ---------------------------------------------------------------------------------------------------- drivers
COLUMN_PAD = 0  # the CPU reads steps[j] only for j <= N


def run_sum(tokens, offsets, table_offsets, source, window, key, arrays):
    """S1 for a packed batch -> (total float64 [total_tokens], n_units int64 [total_tokens])."""
    keys = np.empty(table_offsets[-1], dtype=np.uint64)
    used = np.empty(table_offsets[-1], dtype=np.uint8)
    total = np.empty(len(tokens))
    count = np.empty(len(tokens), dtype=np.int64)
    with parallel_chunksize(1):
        sum_prefix(tokens, offsets, source, window, key, arrays.kind, arrays.gamma, arrays.rank, arrays.denominator,
                   arrays.path_nodes, arrays.path_bits, table_offsets, keys, used, total, count)
    return total, count


def run_empirical(score, source, tokens, offsets, order, n_keys, key, key_length, psi, steps, arrays):
    """S2/S3 for every (text, key) pair of a packed batch, then the permutation-test count
    -> (observed float64 [total_tokens], n_le int64 [total_tokens])."""
    scores = np.zeros((n_keys, len(tokens)))
    sampler = (arrays.kind, arrays.gamma, arrays.rank, arrays.denominator, arrays.path_nodes, arrays.path_bits)
    with parallel_chunksize(1):  # pairs come longest first: hand them out one at a time
        if score == "align":
            align_scores(tokens, offsets, order, n_keys, key, key_length, *sampler, scores)
        elif source == FIXED:
            edit_fixed_scores(tokens, offsets, order, n_keys, key, key_length, psi, steps, *sampler, scores)
        else:
            edit_window_scores(tokens, offsets, order, n_keys, key, source, psi, steps, *sampler, scores)
    n_le = np.empty(len(tokens), dtype=np.int64)
    count_at_most(scores, n_le)
    return scores[0].copy(), n_le


@njit(parallel=True, cache=True)
def anytime_sizes(total, count, offsets, a, b, log_weights, log_threshold, log_e, sizes):
    """The mixture e-process of every text (one text per parallel iteration): log M per prefix into ``log_e``,
    first crossing of ``log_threshold`` (tokens; 0 = never) into ``sizes``."""
    for t in prange(len(offsets) - 1):
        start = offsets[t]
        sizes[t] = anytime_text(total, count, start, offsets[t + 1] - start, a, b, log_weights, log_threshold, log_e)


def run_anytime(total, count, offsets, bets, log_threshold):
    """E-process of a packed batch -> (log e-value float64 [total_tokens], size int64 [B], 0 = never)."""
    log_e = np.empty(len(total))
    sizes = np.zeros(len(offsets) - 1, dtype=np.int64)
    anytime_sizes(total, count, offsets, bets.a, bets.b, bets.log_weights, log_threshold, log_e, sizes)
    return log_e, sizes
