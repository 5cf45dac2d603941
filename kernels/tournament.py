"""The tournament sampler's vocabulary passes on a CUDA device (numba), called from torch through the custom ops
``mmw::tournament_histogram`` and ``mmw::tournament_apply`` (``mmw.watermark.samplers.tournament``).

One pass sums each row's current law by the next ``width`` g-bits (``mmw.watermark.samplers.tournament``): per token, the PRF
of (row seed, token id) gives its bits, its mass is p(x) times the earlier chunks' factor tables looked up by its
bits, and the mass, in fixed point, is added to its bin. The bins live in shared memory: a row's 1,024 bins sit in
64 cache lines, and the global atomic adds of ``scatter_add_`` serialise on them (0.53 ms a pass at 296 x 128,256
on one H200, against one read of the probabilities in ~0.07 ms); shared-memory atomics do not. Integer adds make the
sum independent of their order, so the result is the same on every run and equals the CPU's ``scatter_add_``.

A block takes a strided share of one row (grid: ``PARTS`` x rows) and writes its bins to its own slice of
``partial``; the caller sums the slices (a fixed order). The last pass (``apply_tables``) multiplies each token's
probability by its chunks' factors, the PRF again in the kernel: Inductor, given the same product as torch code,
fused it with the softmax into two reductions that cost ~0.9 ms more than the plain step's one (H200, 296 rows).
"""

from __future__ import annotations

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still refers to np.row_stack, which numpy 2.5 removed
    np.row_stack = np.vstack

from numba import cuda, float64, int64, uint64  # noqa: E402

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
def _cache_tables(cache, tables, n_tables, row):
    """Copy row's first min(n_tables, CACHED_TABLES) factor tables into the block's shared ``cache``."""
    size = tables.shape[2]
    for i in range(cuda.threadIdx.x, min(n_tables, CACHED_TABLES) * size, cuda.blockDim.x):
        cache[i] = tables[i // size, row, i - (i // size) * size]


@cuda.jit(device=True)
def _factor(cache, tables, c, row, code):
    """Table c's factor for ``code``: from shared memory when cached."""
    if c < CACHED_TABLES:
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
    _cache_tables(cache, tables, n_tables, row)
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
            mass *= _factor(cache, tables, c, row, int64((h >> uint64(64 - (c + 1) * table_bits)) & table_mask))
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
    _cache_tables(cache, tables, n_tables, row)
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
            mass *= _factor(cache, tables, c, row, int64(code))
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
