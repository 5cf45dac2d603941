"""The watermark step's softmax on a CUDA device (numba): the model's law in float64 and its two entropies from the
float32 logits in two passes, called from torch through the custom op ``mmw::softmax_law``
(``mmw.watermark.samplers.base.softmax_law``).

Every step records the Shannon and the spike entropy of the model's own law at T = 1 and draws from its law at the
sampling temperature. Compiled by Inductor from torch code, the float64 ``log_softmax`` of the entropies and the
float64 ``softmax`` of the law took 0.93 ms at 296 x 128,256 on one H100 (real models' laws), 4.5 times a copy of
the law (one read of the float32 logits is 152 MB, one write of the float64 law 304 MB); these passes take 0.45 ms
(bench/gpu_softmax.py; the float64 exponentials, not the bytes, bound them). Here:

- ``stats_kernel``: one read. Block ``part`` of a row takes a contiguous segment; each thread keeps a running
  maximum m and, relative to it, Z = sum exp(x - m) and W = sum exp(x - m) (x - m) (and Z_T = sum exp(x/T - m/T)
  when T != 1), rescaled when the maximum moves (an online softmax); the block merges its threads' sums by a tree
  in a fixed order, into partial[row, part].
- ``row_kernel``: a thread a row merges the row's segments in a fixed order: the entropy is log Z - W / Z
  (= -sum p log p, log p = x - m - log Z).
- ``law_kernel``: a second read. Each token's p = exp(x - m) / Z adds p / (1 + p) to the spike entropy (a
  segment's sum, summed over segments by the caller), and stores the law at T, exp(x/T - m/T) / Z_T,
  torch's float64 softmax of logits / T up to rounding (the order of the sum, a product by 1 / Z for the division).

The sums run in float64 in a fixed order: the same values on every run. ``-inf`` logits (masked tokens) carry no
mass and add nothing. For the tournament the law pass can also bin the law it writes by the draw's first g-bits
(``launch_law``'s ``binned``: ``mmw.kernels.tournament.binned_law_kernel``), so the draw reads the law once less.
"""

from __future__ import annotations

import functools
import math

import numpy as np

if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 still refers to np.row_stack, which numpy 2.5 removed
    np.row_stack = np.vstack

from numba import cuda, float64  # noqa: E402

from mmw.kernels.tournament import MAX_BINS, _block_sum, _device_array, _launch_stream, binned_law_kernel  # noqa: E402

#: Threads of a block (a power of two: the merges are trees), and blocks a row. At 296 x 128,256 on one H100 the
#: two passes took 0.447 ms at 128 threads x 8 blocks a row, 0.485 / 0.512 / 0.572 ms at 16 / 32 / 64 blocks,
#: 0.513 ms at 256 x 8 and 0.538 ms at 512 x 8 (bench/gpu_softmax.py, which times each width).
THREADS = 128
PARTS = 8
#: The running sums a segment keeps: m, Z, W, Z_T.
FIELDS = 4


@cuda.jit(device=True)
def _merge(red, a, b, tempered, temperature):
    """Fold slot b's (m, Z, W, Z_T) into slot a's (rows of ``red`` [slots, FIELDS]), each rescaled to the larger
    maximum (W relative to the maximum: sum e (x - m) = r (W + Z (m_old - m)))."""
    ma = red[a, 0]
    mb = red[b, 0]
    if mb == -math.inf:
        return
    if ma == -math.inf:
        for k in range(FIELDS):
            red[a, k] = red[b, k]
        return
    m = max(ma, mb)
    ra = math.exp(ma - m)
    rb = math.exp(mb - m)
    red[a, 0] = m
    red[a, 2] = (red[a, 2] + red[a, 1] * (ma - m)) * ra + (red[b, 2] + red[b, 1] * (mb - m)) * rb
    red[a, 1] = red[a, 1] * ra + red[b, 1] * rb
    if tempered:
        mt = m / temperature
        red[a, 3] = red[a, 3] * math.exp(ma / temperature - mt) + red[b, 3] * math.exp(mb / temperature - mt)


@cuda.jit(device=True)
def _segment(vocab):
    """The block's segment of its row: (first, end), contiguous, ceil(vocab / gridDim.x) tokens."""
    seg_len = (vocab + cuda.gridDim.x - 1) // cuda.gridDim.x
    return cuda.blockIdx.x * seg_len, min((cuda.blockIdx.x + 1) * seg_len, vocab)


@functools.cache
def kernels(threads: int):
    """The two passes for blocks of ``threads`` threads (numba sizes shared arrays at compile time: compiled once
    a width)."""

    @cuda.jit
    def stats_kernel(logits, temperature, partial):
        """partial[row, part] = (m, Z, W, Z_T) of the row's segment ``part`` (contiguous, ceil(V / gridDim.x)
        logits), m = -inf where the segment has no finite logit."""
        red = cuda.shared.array((threads, FIELDS), float64)
        row = cuda.blockIdx.y
        t = cuda.threadIdx.x
        tempered = temperature != 1.0
        first, end = _segment(logits.shape[1])
        m = -math.inf
        z = 0.0
        w = 0.0
        zt = 0.0
        for x in range(first + t, end, cuda.blockDim.x):
            v = float64(logits[row, x])
            if v == -math.inf:
                continue
            if v > m:  # the new maximum's own term is exp(0) = 1
                r = math.exp(m - v)
                if z > 0.0:  # W relative to the new maximum: sum e (x - v) = r (W + Z (m - v))
                    w = (w + z * (m - v)) * r
                z = z * r + 1.0
                if tempered:
                    zt = zt * math.exp(m / temperature - v / temperature) + 1.0
                m = v
            else:
                e = math.exp(v - m)
                z += e
                w += e * (v - m)
                if tempered:
                    zt += math.exp(v / temperature - m / temperature)
        red[t, 0] = m
        red[t, 1] = z
        red[t, 2] = w
        red[t, 3] = zt
        cuda.syncthreads()
        s = cuda.blockDim.x >> 1
        while s > 0:
            if t < s:
                _merge(red, t, t + s, tempered, temperature)
            cuda.syncthreads()
            s >>= 1
        if t < FIELDS:
            partial[row, cuda.blockIdx.x, t] = red[0, t]

    @cuda.jit
    def law_kernel(logits, temperature, rows_stats, probs, spike):
        """From the row's (m, 1 / Z, m / T, 1 / Z_T) (``row_kernel``): spike[row, part] = the segment's sum of
        p / (1 + p) with p = exp(x - m) / Z, and probs[row, x] = exp(x / T - m / T) / Z_T (p itself at T = 1)."""
        red = cuda.shared.array(threads, float64)
        row = cuda.blockIdx.y
        t = cuda.threadIdx.x
        tempered = temperature != 1.0
        m = rows_stats[row, 0]
        inv_z = rows_stats[row, 1]
        mt = rows_stats[row, 2]
        inv_zt = rows_stats[row, 3]
        first, end = _segment(logits.shape[1])
        own = 0.0
        for x in range(first + t, end, cuda.blockDim.x):
            v = float64(logits[row, x])
            p = math.exp(v - m) * inv_z
            own += p / (1.0 + p)
            probs[row, x] = math.exp(v / temperature - mt) * inv_zt if tempered else p
        total = _block_sum(red, own)
        if t == 0:
            spike[row, cuda.blockIdx.x] = total

    return stats_kernel, law_kernel


@cuda.jit
def row_kernel(partial, temperature, rows_stats, entropy):
    """Thread ``row``: the row's segments merged in a fixed order; rows_stats[row] = (m, 1 / Z, m / T, 1 / Z_T) and
    entropy[row] = log Z - W / Z."""
    row = cuda.grid(1)
    if row >= partial.shape[0]:
        return
    tempered = temperature != 1.0
    acc = cuda.local.array((2, FIELDS), float64)
    for k in range(FIELDS):
        acc[0, k] = partial[row, 0, k]
    for p in range(1, partial.shape[1]):
        for k in range(FIELDS):
            acc[1, k] = partial[row, p, k]
        _merge(acc, 0, 1, tempered, temperature)
    z = acc[0, 1]
    rows_stats[row, 0] = acc[0, 0]
    rows_stats[row, 1] = 1.0 / z
    rows_stats[row, 2] = acc[0, 0] / temperature
    rows_stats[row, 3] = 1.0 / (acc[0, 3] if tempered else z)
    entropy[row] = math.log(z) - acc[0, 2] / z


#: Threads of a ``row_kernel`` block (a thread a row).
ROW_THREADS = 128


def available() -> bool:
    """True when numba sees a CUDA device."""
    return cuda.is_available()


def launch_law(logits, temperature: float, partial, rows_stats, probs, entropy, spike, stream=0,
               binned=None) -> None:
    """The passes on device (or, in numba's simulator, host) arrays: logits float32/float64 [B, V] (any strides),
    scratch partial float64 [B, S, FIELDS] and rows_stats float64 [B, FIELDS], probs float64 [B, V], entropy
    float64 [B], spike float64 [B, S'] (the law pass's segments' sums), S the number of segments a row of the first
    pass. ``binned``: (seeds int64 [B], width, fixed_point, bins int64 [B, S', 2^width], totals int64 [B, S']): the
    law pass also writes the histogram of the law by its first ``width`` g-bits (``binned_law_kernel``) over S'
    segments a row; None: S' = S."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for the softmax, got {temperature}")
    rows = logits.shape[0]
    if not rows:
        return
    grid = (partial.shape[1], rows)
    stats_kernel, law_kernel = kernels(THREADS)
    stats_kernel[grid, THREADS, stream](logits, float(temperature), partial)
    row_kernel[(rows + ROW_THREADS - 1) // ROW_THREADS, ROW_THREADS, stream](partial, float(temperature), rows_stats,
                                                                             entropy)
    if binned is None:
        law_kernel[grid, THREADS, stream](logits, float(temperature), rows_stats, probs, spike)
    else:
        seeds, width, fixed_point, bins, totals = binned
        if not 1 <= width <= MAX_BINS.bit_length() - 1:
            raise ValueError(f"width must be from 1 to {MAX_BINS.bit_length() - 1}, got {width}")
        binned_law_kernel(THREADS)[(bins.shape[1], rows), THREADS, stream](
            logits, float(temperature), rows_stats, probs, spike, seeds, width, float(fixed_point), bins, totals)


def law(logits, temperature: float, binned: tuple | None = None):
    """logits float32 [B, V] (a CUDA tensor, any strides) -> (probs float64 [B, V]; stats float64 [2, B]: the Shannon
    and the spike entropy at T = 1), launched on torch's current stream. ``binned``: (seeds int64 [B], width,
    fixed_point, segments): the result also holds the law's histogram by the first ``width`` g-bits of each token
    under its row's seed over ``segments`` contiguous segments a row, int64 [B, segments, 2^width], and each
    segment's mass, int64 [B, segments] (in units of 1 / fixed_point)."""
    import torch

    rows = logits.shape[0]
    device = logits.device
    probs = torch.empty(rows, logits.shape[1], dtype=torch.float64, device=device)
    stats = torch.empty(2, rows, dtype=torch.float64, device=device)
    partial = torch.empty(rows, PARTS, FIELDS, dtype=torch.float64, device=device)
    rows_stats = torch.empty(rows, FIELDS, dtype=torch.float64, device=device)
    extra = ()
    if binned is None:
        spike = torch.empty(rows, PARTS, dtype=torch.float64, device=device)
        arrays = None
    else:
        seeds, width, fixed_point, segments = binned
        spike = torch.empty(rows, segments, dtype=torch.float64, device=device)
        extra = (torch.empty(rows, segments, 1 << width, dtype=torch.int64, device=device),
                 torch.empty(rows, segments, dtype=torch.int64, device=device))
        arrays = (_device_array(seeds.contiguous()), width, fixed_point, *(_device_array(x) for x in extra))
    if rows:
        launch_law(_device_array(logits), temperature, _device_array(partial), _device_array(rows_stats),
                   _device_array(probs), _device_array(stats[0]), _device_array(spike), _launch_stream(logits),
                   arrays)
        stats[1] = spike.sum(1)
    return (probs, stats, *extra)
