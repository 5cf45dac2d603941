"""One specification of the per-token math (docs/PRF.md), shared by the CPU and CUDA twins.

Every function here is ``register_jitable``: called from ``@njit`` code it compiles for the CPU, called from a
``@cuda.jit`` kernel it compiles for the GPU (and in the CUDA simulator it runs as plain Python on numpy scalars).
The traversals (which texts, keys, shifts and cells a thread visits) live in ``cpu.py`` and ``cuda.py``; the values
they compute come only from here, so the twins agree by construction.

Bit-for-bit notes (checked against ``tests/data/kat.json`` in ``tests/test_kernels.py``):
- integers (PRF outputs, seeds, unit ids) and uniforms are exact in every twin;
- ``log`` is the platform's: glibc on the CPU, libdevice on CUDA, numpy's own SIMD code in the reference. They are
  each within 1 ulp of the true value, so a statistic may differ from the reference by 1 ulp;
- the binary sampler's per-token statistic mirrors numpy's pairwise summation order (``np.sum`` over the padded
  node axis), and the sum score adds unit values in the reference's ``bincount``/``cumsum`` order;
- nothing here multiplies and then adds in one expression, so CUDA's default FMA contraction cannot change a
  rounding (the edit score's ``psi * j`` steps are computed on the host and passed in).
"""

from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from mmw.watermark import prf as spec
from mmw.kernels.prf import prf, unit
from mmw.watermark.samplers.inverse_transform import TINY
from mmw.watermark.samplers.parts import KERNEL_CODES

# Sampler codes, from the samplers' declarations (the kernels branch on them; the branch is uniform across a GPU
# warp). ``token_statistic`` and ``token_unit`` below hold each one's statistic; tests/test_declarations.py fails
# when a declared code has none.
SAMPLER_CODES = dict(KERNEL_CODES)
DISTRIBUTION_SHIFT = SAMPLER_CODES["distribution_shift"]
EXPONENTIAL = SAMPLER_CODES["exponential"]
INVERSE_TRANSFORM = SAMPLER_CODES["inverse_transform"]
BINARY = SAMPLER_CODES["binary"]
REWEIGHT = SAMPLER_CODES["reweight"]
TOURNAMENT = SAMPLER_CODES["tournament"]
PERMUTE_FLIP = SAMPLER_CODES["permute_flip"]

# Randomness-source codes.
WINDOW = 1
MINHASH = 2
FIXED = 3
SOURCE_CODES = {"window": WINDOW, "minhash": MINHASH, "fixed": FIXED}

# Beyond the paper: self-seeding (SelfHash).
SELFHASH = 4
SOURCE_CODES["selfhash"] = SELFHASH

# Numpy's pairwise summation (used by the reference's ``np.sum``) switches to recursion above this many terms.
PAIRWISE_BLOCK = 128

TAG_WINDOW = np.uint64(spec.WINDOW)
TAG_MINHASH = np.uint64(spec.MINHASH)
TAG_FIXED = np.uint64(spec.FIXED)
TAG_SCALAR = np.uint64(spec.SCALAR)
TAG_NODE = np.uint64(spec.NODE)
TAG_TRIAL = np.uint64(spec.TRIAL)
TAG_SELFHASH = np.uint64(spec.SELFHASH)
ONE_U64 = np.uint64(1)


# ---------------------------------------------------------------------------------------------------- keys, seeds
@register_jitable
def key_at(key, t):
    """Key of null trial ``t``: the watermark key itself for t = 0, else the trial key ``prf(k, TRIAL + t - 1)``."""
    if t == 0:
        return key
    return prf(key, TAG_TRIAL + np.uint64(t - 1))


@register_jitable
def source_base(source, key):
    """The keyed starting value of a text-dependent source: ``prf(k, WINDOW)``, ``prf(k, MINHASH)`` or
    ``prf(k, SELFHASH)``."""
    if source == MINHASH:
        return prf(key, TAG_MINHASH)
    if source == SELFHASH:
        return prf(key, TAG_SELFHASH)
    return prf(key, TAG_WINDOW)


@register_jitable
def text_seed(source, tokens, pos, window, base):
    """Seed r_n of the token at absolute index ``pos`` of ``tokens`` (int64); needs ``window`` tokens before it.

    Window: ``a = base; a = prf(a, T[n-1]); a = prf(a, T[n-2]) ...``; min-hash: unsigned min of ``prf(base, T[n-j])``;
    window 0: the constant ``base``. SelfHash (``window`` = its context, H - 1): unsigned min of ``prf(base, T[n-j])``
    for j = 0..window, the token itself included."""
    if source == SELFHASH:
        best = prf(base, tokens[pos])
        for j in range(1, window + 1):
            h = prf(base, tokens[pos - j])
            if h < best:
                best = h
        return best
    if window == 0:
        return base
    if source == MINHASH:
        best = prf(base, tokens[pos - 1])
        for j in range(2, window + 1):
            h = prf(base, tokens[pos - j])
            if h < best:
                best = h
        return best
    acc = base
    for j in range(1, window + 1):
        acc = prf(acc, tokens[pos - j])
    return acc


@register_jitable
def fixed_seed(fixed_base, r):
    """Entry r of the fixed key sequence, ``prf(prf(k, FIXED), r)``; ``fixed_base = prf(k, FIXED)``."""
    return prf(fixed_base, np.uint64(r))


# ---------------------------------------------------------------------------------------------------- statistics
@register_jitable
def exponential_value(u):
    """C1: ``log(1 - u)`` of the token's keyed uniform."""
    return np.log(1.0 - u)


@register_jitable
def green_value(u, gamma):
    """C4: -1 for a green token, else -0 (the reference negates a 0/1 float, hence the signed zero)."""
    if u < gamma:
        return -1.0
    return -0.0


@register_jitable
def reweight_value(u, gamma):
    """Reweighting: -1 for a token in the last gamma of the keyed order (``u >= 1 - gamma``), else -0."""
    if u >= 1.0 - gamma:
        return -1.0
    return -0.0


@register_jitable
def permute_flip_value(u):
    """Permute-and-flip: ``log r`` of the token's keyed uniform r (its noise -log r is Exp(1))."""
    return np.log(u)


@register_jitable
def node_value(w, bit):
    """C3, one tree node: ``-log(1 - w)`` for branch 0, ``-log(w)`` for branch 1."""
    if bit == 0:
        return -np.log(1.0 - w)
    return -np.log(w)


@register_jitable
def inverse_transform_value(seed, token, rank, denominator):
    """C2: ``log F_eta(|v - eta|)`` with v = unit(prf(r, SCALAR)), eta = rank(T) / (d - 1)."""
    v = unit(prf(seed, TAG_SCALAR))
    eta = np.float64(rank[token]) / denominator
    c = abs(v - eta)
    f = min(eta + c, 1.0) - max(eta - c, 0.0)
    return np.log(max(f, TINY))


@register_jitable
def _node_term(seed, token, d, path_nodes, path_bits):
    """Node d of the token's path (0.0 past its depth, as the reference's padded array)."""
    node = path_nodes[token, d]
    if node < 0:
        return 0.0
    return node_value(unit(prf(seed, np.uint64(node) + TAG_NODE)), path_bits[token, d])


@register_jitable
def binary_value(seed, token, path_nodes, path_bits):
    """C3 per-token statistic: the sum over the token's nodes, in numpy's pairwise order over the padded depth
    axis (8 running partial sums, then the remainder), so it carries the reference's rounding."""
    depth = path_nodes.shape[1]
    if depth < 8:
        total = 0.0
        for d in range(depth):
            total += _node_term(seed, token, d, path_nodes, path_bits)
        return total
    r0 = _node_term(seed, token, 0, path_nodes, path_bits)
    r1 = _node_term(seed, token, 1, path_nodes, path_bits)
    r2 = _node_term(seed, token, 2, path_nodes, path_bits)
    r3 = _node_term(seed, token, 3, path_nodes, path_bits)
    r4 = _node_term(seed, token, 4, path_nodes, path_bits)
    r5 = _node_term(seed, token, 5, path_nodes, path_bits)
    r6 = _node_term(seed, token, 6, path_nodes, path_bits)
    r7 = _node_term(seed, token, 7, path_nodes, path_bits)
    d = 8
    stop = depth - depth % 8
    while d < stop:
        r0 += _node_term(seed, token, d, path_nodes, path_bits)
        r1 += _node_term(seed, token, d + 1, path_nodes, path_bits)
        r2 += _node_term(seed, token, d + 2, path_nodes, path_bits)
        r3 += _node_term(seed, token, d + 3, path_nodes, path_bits)
        r4 += _node_term(seed, token, d + 4, path_nodes, path_bits)
        r5 += _node_term(seed, token, d + 5, path_nodes, path_bits)
        r6 += _node_term(seed, token, d + 6, path_nodes, path_bits)
        r7 += _node_term(seed, token, d + 7, path_nodes, path_bits)
        d += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while d < depth:
        total += _node_term(seed, token, d, path_nodes, path_bits)
        d += 1
    return total


@register_jitable
def tournament_value(h, weights):
    """Tournament: minus the weighted count of the token's g-values equal to 1, ``-sum_l weights[l] g_l`` with
    g_l = bit 63 - l of h = prf(r, T) and m = len(weights) layers (integer weights: the sum is exact)."""
    ones = 0
    for layer in range(weights.shape[0]):
        ones += weights[layer] * np.int64((h >> np.uint64(63 - layer)) & ONE_U64)
    return -np.float64(ones)


@register_jitable
def token_statistic(kind, token, seed, gamma, rank, denominator, path_nodes, path_bits):
    """The sampler's statistic s(T, r) of one token (int64) under one seed (uint64) -> float64. ``rank`` holds
    C2's ranks, or the tournament's per-layer weights."""
    if kind == TOURNAMENT:
        return tournament_value(prf(seed, token), rank)
    if kind == BINARY:
        return binary_value(seed, token, path_nodes, path_bits)
    if kind == INVERSE_TRANSFORM:
        return inverse_transform_value(seed, token, rank, denominator)
    u = unit(prf(seed, token))
    if kind == EXPONENTIAL:
        return exponential_value(u)
    if kind == REWEIGHT:
        return reweight_value(u, gamma)
    if kind == PERMUTE_FLIP:
        return permute_flip_value(u)
    return green_value(u, gamma)


@register_jitable
def unit_count(kind, token, path_nodes):
    """How many independent random draws stand behind one token: its depth for C3, else 1."""
    if kind != BINARY:
        return 1
    depth = 0
    while depth < path_nodes.shape[1] and path_nodes[token, depth] >= 0:
        depth += 1
    return depth


@register_jitable
def token_unit(kind, token, seed, k, gamma, rank, denominator, path_nodes, path_bits):
    """Draw k of a token -> (unit id uint64, statistic float64), as the samplers' ``units``: id prf(r, T) for
    C1/C4/reweighting/permute-and-flip, the seed r for C2, prf(r, NODE + m) for node m of C3."""
    if kind == BINARY:
        node = path_nodes[token, k]
        h = prf(seed, np.uint64(node) + TAG_NODE)
        return h, node_value(unit(h), path_bits[token, k])
    if kind == INVERSE_TRANSFORM:
        return seed, inverse_transform_value(seed, token, rank, denominator)
    h = prf(seed, token)
    if kind == TOURNAMENT:
        return h, tournament_value(h, rank)
    if kind == EXPONENTIAL:
        return h, exponential_value(unit(h))
    if kind == REWEIGHT:
        return h, reweight_value(unit(h), gamma)
    if kind == PERMUTE_FLIP:
        return h, permute_flip_value(unit(h))
    return h, green_value(unit(h), gamma)


# ---------------------------------------------------------------------------------------------------- S1 sum
@register_jitable
def insert_if_new(keys, used, start, capacity, h):
    """Open-addressing hash set (linear probing) in ``keys[start:start+capacity]``; capacity a power of two.
    Returns True when ``h`` was absent (and inserts it). Unit ids are PRF outputs, so their low bits are uniform
    and index the table directly."""
    mask = capacity - 1
    slot = np.int64(h & np.uint64(mask))
    while True:
        idx = start + slot
        if used[idx] == 0:
            used[idx] = 1
            keys[idx] = h
            return True
        if keys[idx] == h:
            return False
        slot = (slot + 1) & mask


@register_jitable
def sum_prefix_text(tokens, start, n, source, window, base, kind, gamma, rank, denominator, path_nodes,
                    path_bits, keys, used, table_start, capacity, total, count):
    """S1 for one text ``tokens[start:start+n]``: per prefix, the sum of first-occurrence unit statistics and the
    number of units, written to ``total``/``count`` at the same indices. Positions before ``window`` are unscored.

    Units are visited in text order (nodes in path order), so "absent from the hash set" is exactly "first
    occurrence", and the float additions happen in the reference's order (per position from 0.0, then the
    running prefix sum)."""
    for q in range(capacity):
        used[table_start + q] = 0
    running = 0.0
    units = 0
    for pos in range(n):
        if pos >= window:
            seed = text_seed(source, tokens, start + pos, window, base)
            token = tokens[start + pos]
            here = 0.0
            for k in range(unit_count(kind, token, path_nodes)):
                h, value = token_unit(kind, token, seed, k, gamma, rank, denominator, path_nodes, path_bits)
                if insert_if_new(keys, used, table_start, capacity, h):
                    here += value
                    units += 1
            running += here
        total[start + pos] = running
        count[start + pos] = units


# ---------------------------------------------------------------------------------------------------- S3 edit
@register_jitable
def edit_cell(m_left, d_diag, d_up, cost, psi, step):
    """One cell of the edit DP in the reference's running-minimum form (``mmw.watermark.scores.edit_diagonal``).

    c = min(D(i-1, j-1) + cost, D(i-1, j) + psi); m(i, j) = min(m(i, j-1), c - j psi); D(i, j) = m(i, j) + j psi,
    with ``step`` = j psi. Returns (m(i, j), D(i, j)). Evaluating the same formula cell by cell (in any order
    that respects the dependencies) reproduces the reference's bits."""
    diagonal = d_diag + cost
    gap = d_up + psi
    c = diagonal if diagonal < gap else gap
    candidate = c - step
    m = m_left if m_left < candidate else candidate
    return m, m + step


# ---------------------------------------------------------------------------------------------------- e-process
@register_jitable
def log_mixture(a, b, log_weights, units, total):
    """log of the mixture e-value sum_j exp(log_weights[j] + a[j] units + b[j] total) (``mmw.watermark.size.Bets``), by
    log-sum-exp around the largest term. The products are rounded before the sums (no fused multiply-add on the
    CPU; CUDA may contract them, a 1-ulp difference that the tests allow)."""
    k = a.shape[0]
    top = -np.inf
    for j in range(k):
        term = (log_weights[j] + a[j] * units) + b[j] * total
        if term > top:
            top = term
    acc = 0.0
    for j in range(k):
        acc += math.exp(((log_weights[j] + a[j] * units) + b[j] * total) - top)  # np.exp fails on CUDA
    return top + np.log(acc)


@register_jitable
def anytime_text(total, count, start, n, a, b, log_weights, log_threshold, log_e):
    """One text's e-process from its running sums ``total[start:start+n]`` and unit counts: writes log M per prefix
    into ``log_e`` (same indices) and returns the first prefix length whose log M reaches ``log_threshold``, or 0
    when none does."""
    first = 0
    for pos in range(n):
        value = log_mixture(a, b, log_weights, np.float64(count[start + pos]), total[start + pos])
        log_e[start + pos] = value
        if first == 0 and value >= log_threshold:
            first = pos + 1
    return first
