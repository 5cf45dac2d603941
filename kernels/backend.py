"""NumbaBackend: the detector's batch interface (same meaning as ``mmw.watermark.scores.ReferenceBackend``) over the CPU
and CUDA twins.

Texts are packed once per call (int64 tokens back to back + int64 offsets) and each kernel handles the whole
batch in one launch; outputs are unpacked per text at the end. Empirical scores run for (text, key) pairs, longest
text first. Large batches are split into chunks that bound the per-key score matrix (K x tokens float64).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from mmw.errors import SpecError
from mmw.kernels.stats import BINARY, FIXED, PAIRWISE_BLOCK, SAMPLER_CODES, SOURCE_CODES, TOURNAMENT
from mmw.watermark.randomness import RandomnessSource
from mmw.watermark.samplers.base import Sampler
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import check_statistics

DEVICES = ("auto", "cpu", "cuda")
# Score-matrix entries (K keys x tokens) per chunk: 512 MiB of float64 on the CPU, 2 GiB on a GPU.
CHUNK_ENTRIES = {"cpu": 1 << 26, "cuda": 1 << 28}


@cache
def cuda_available() -> bool:
    """True when numba sees a CUDA GPU (or the CUDA simulator is on); asked once per process."""
    from mmw.kernels import cuda as cuda_twin

    return cuda_twin.available()


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; raises on unknown names or a missing GPU."""
    if device not in DEVICES:
        raise SpecError("detect.device", f"unknown device {device!r} for the numba backend", DEVICES)
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise SpecError("detect.device", "cuda requested but numba sees no CUDA GPU", ("auto", "cpu"))
    return device


@dataclass(frozen=True)
class SamplerArrays:
    """What the kernels need of a sampler: its code, C4's gamma, C2's ranks, C3's code-tree paths.

    Unused arrays are one-element placeholders so that every sampler shares one compiled signature."""

    kind: int
    gamma: float
    denominator: float
    rank: np.ndarray  # int64 [V] (C2), the tournament's layer weights [m], or [1]
    path_nodes: np.ndarray  # int64 [V, D] (C3) or [1, 1]
    path_bits: np.ndarray  # int8 [V, D] (C3) or [1, 1]
    depth: np.ndarray  # int64 [V] (C3) or [1]: units per token, for the hash-set sizes

    @classmethod
    def of(cls, sampler: Sampler) -> "SamplerArrays":
        if sampler.name not in SAMPLER_CODES:
            raise SpecError("scheme.sampler", f"{sampler.name!r} has no watermark statistic", tuple(SAMPLER_CODES))
        kind = SAMPLER_CODES[sampler.name]
        rank = np.ascontiguousarray(getattr(sampler, "rank", np.zeros(1)), dtype=np.int64)
        nodes = np.full((1, 1), -1, dtype=np.int64)
        bits = np.full((1, 1), -1, dtype=np.int8)
        depth = np.ones(1, dtype=np.int64)
        if kind == BINARY:
            code = sampler.code
            if code.max_depth > PAIRWISE_BLOCK:
                raise SpecError("scheme.binary_code", f"code depth {code.max_depth} exceeds the kernels' "
                                f"limit of {PAIRWISE_BLOCK}", "a code of depth <= 128, or detect.device=reference")
            nodes, bits, depth = code.path_nodes, code.path_bits, code.depth
        if kind == TOURNAMENT:  # the per-layer weights of the g-value count (``layer_weights``)
            rank = np.ascontiguousarray(sampler.weights, dtype=np.int64)
        gamma = sampler.spec.gamma or 0.0  # the green-list fraction of the samplers that use one (else unset)
        return cls(kind, float(gamma), float(sampler.vocab_size - 1), rank, np.ascontiguousarray(nodes),
                   np.ascontiguousarray(bits), np.ascontiguousarray(depth, dtype=np.int64))

    def units(self, tokens: np.ndarray) -> np.ndarray:
        """Independent draws behind each token (int64, same shape as ``tokens``)."""
        return self.depth[tokens] if self.kind == BINARY else np.ones(len(tokens), dtype=np.int64)


def pack(texts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged texts -> (tokens int64 [total], offsets int64 [B + 1])."""
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t in texts]) if texts else np.zeros(0, np.int64)
    return np.ascontiguousarray(tokens, dtype=np.int64), offsets


def hash_table_offsets(tokens: np.ndarray, offsets: np.ndarray, context: int, arrays: SamplerArrays) -> np.ndarray:
    """Per-text hash-set slices for the sum score's deduplication: a power of two >= 2x the text's units (load
    factor <= 1/2 keeps linear probing short). -> int64 [B + 1] offsets into one table."""
    lengths = np.diff(offsets)
    position = np.arange(len(tokens)) - np.repeat(offsets[:-1], lengths)
    scored_units = np.where(position >= context, arrays.units(tokens), 0)  # the first tokens have no seed
    running = np.concatenate([[0], np.cumsum(scored_units)])
    per_text = running[offsets[1:]] - running[offsets[:-1]]
    capacity = np.where(per_text > 0, 1 << np.ceil(np.log2(np.maximum(2 * per_text, 2))).astype(np.int64), 0)
    table = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(capacity, out=table[1:])
    return table


def pair_order(offsets: np.ndarray, n_keys: int) -> np.ndarray:
    """(text, key) pairs as ``b * n_keys + t``, longest text first, empty texts left out -> int64."""
    lengths = np.diff(offsets)
    texts = np.argsort(-lengths, kind="stable")
    texts = texts[lengths[texts] > 0]
    return (texts[:, None] * n_keys + np.arange(n_keys)[None, :]).ravel().astype(np.int64)


def chunks(offsets: np.ndarray, n_keys: int, budget: int) -> list[tuple[int, int]]:
    """Consecutive text ranges [b0, b1) whose score matrix (n_keys x tokens) fits ``budget`` entries."""
    out, b0 = [], 0
    n = len(offsets) - 1
    while b0 < n:
        b1 = b0 + 1
        while b1 < n and (offsets[b1 + 1] - offsets[b0]) * n_keys <= budget:
            b1 += 1
        out.append((b0, b1))
        b0 = b1
    return out


class NumbaBackend:
    """Batch detection quantities on the CPU (numba ``@njit``) or a CUDA GPU (numba ``@cuda.jit``).

    ``sum_prefix_batch`` / ``empirical_prefix_batch`` return per text exactly what the reference's per-text
    methods return (see ``mmw.watermark.scores``)."""

    def __init__(self, spec: SchemeSpec, sampler: Sampler, source: RandomnessSource, key: int,
                 device: str = "auto"):
        self.spec, self.sampler, self.source = spec, sampler, source
        self.device = resolve_device(device)
        self.key = np.uint64(key)
        self.arrays = SamplerArrays.of(sampler)
        self.source_code = SOURCE_CODES[source.kind]
        self.n_keys = (spec.trials or 0) + 1
        if spec.score == "sum" and self.source_code == FIXED:
            raise SpecError("scheme.score", "the sum score needs text-dependent randomness", ("align", "edit"))
        if spec.score == "align" and self.source_code != FIXED:
            raise SpecError("scheme.score", "align needs randomness=fixed", ("sum", "edit"))
        if spec.score == "edit" and self.source_code != FIXED and source.window != 1:
            raise SpecError("scheme.window", "edit with text-dependent randomness needs window=1", ("1",))
        if self.device == "cuda":
            from mmw.kernels import cuda as twin
        else:
            from mmw.kernels import cpu as twin
        self.twin = twin

    # ------------------------------------------------------------------ S1 sum
    def sum_prefix_batch(self, texts: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """texts: int64 token arrays -> per text (total float64 [N], n_units int64 [N])."""
        tokens, offsets = self._pack(texts)
        table = hash_table_offsets(tokens, offsets, self.source.context, self.arrays)
        total, count = self.twin.run_sum(tokens, offsets, table, self.source_code, self.source.context, self.key,
                                         self.arrays)
        return [(total[a:b], count[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]

    # ------------------------------------------------------------------ S2 align / S3 edit
    def empirical_prefix_batch(self, texts: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """texts: int64 token arrays -> per text (observed score float64 [N], #trials <= observed int64 [N])."""
        tokens, offsets = self._pack(texts)
        observed = np.zeros(len(tokens))
        n_le = np.zeros(len(tokens), dtype=np.int64)
        lengths = np.diff(offsets)
        psi = float(self.spec.psi or 0.0)
        steps = psi * np.arange(int(lengths.max(initial=0)) + 1 + self.twin.COLUMN_PAD)  # the reference's j psi
        for b0, b1 in chunks(offsets, self.n_keys, CHUNK_ENTRIES[self.device]):
            a, z = offsets[b0], offsets[b1]
            sub = offsets[b0: b1 + 1] - a
            obs, le = self.twin.run_empirical(
                self.spec.score, self.source_code, tokens[a:z], sub, pair_order(sub, self.n_keys), self.n_keys,
                self.key, self.source.key_length, psi, steps, self.arrays)
            observed[a:z], n_le[a:z] = obs, le
        return [(observed[a:b], n_le[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]

    # ------------------------------------------------------------------ e-process (anytime size)
    def anytime_batch(self, outs: Sequence[tuple[np.ndarray, np.ndarray]], bets,
                      log_threshold: float) -> list[tuple[np.ndarray, int | None]]:
        """Per text (running sum, unit count) of ``sum_prefix_batch`` -> (log e-value float64 [N], first prefix
        whose log e-value reaches ``log_threshold`` or None), as ``mmw.watermark.size.anytime_log_evalues``/``anytime_size``."""
        offsets = np.zeros(len(outs) + 1, dtype=np.int64)
        np.cumsum([len(total) for total, _ in outs], out=offsets[1:])
        total = np.ascontiguousarray(np.concatenate([t for t, _ in outs]) if outs else np.zeros(0), dtype=np.float64)
        count = np.ascontiguousarray(np.concatenate([c for _, c in outs]) if outs else np.zeros(0, np.int64),
                                     dtype=np.int64)
        for text_total, _ in outs:
            check_statistics(text_total)
        log_e, sizes = self.twin.run_anytime(total, count, offsets, bets, float(log_threshold))
        return [(log_e[a:z], int(s) if s > 0 else None) for a, z, s in zip(offsets[:-1], offsets[1:], sizes)]

    def _pack(self, texts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        tokens, offsets = pack(texts)
        vocab = self.sampler.vocab_size
        if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
            raise ValueError(f"token ids must lie in [0, {vocab}); got {tokens.min()}..{tokens.max()}")
        return tokens, offsets
