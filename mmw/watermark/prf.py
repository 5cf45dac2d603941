"""The one PRF of mmw (specification: docs/PRF.md), in numpy (reference) and torch (generation).

numpy works on ``uint64`` arrays; torch has no full unsigned 64-bit arithmetic, so the torch twin works on
``int64`` tensors with wrap-around multiplication and *logical* right shifts — the same bit patterns.
The numba twins live in ``mmw.kernels.prf``. ``tests/test_prf.py`` pins all of them to ``tests/data/kat.json``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where the torch twin runs, so key handling and detection stay torch-free
    import torch

MASK64 = (1 << 64) - 1
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB
GOLDEN = 0x9E3779B97F4A7C15
UNIT_SCALE = 2.0**-52


def _tag(ascii4: str) -> int:
    return int.from_bytes(ascii4.encode(), "big") << 32


WINDOW = _tag("WIND")
MINHASH = _tag("MINH")
FIXED = _tag("FIXD")
SCALAR = _tag("SCAL")
NODE = _tag("NODE")
PERM = _tag("PERM")
TRIAL = _tag("TRIL")
SHIFT = _tag("SHFT")
SKIP = _tag("SKIP")
SAMPLE = _tag("SMPL")
SELFHASH = _tag("SELF")


def key_from_string(key: str) -> int:
    """64-bit key from the secret string (hashed once per run, never per token)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


# ---------------------------------------------------------------- python ints (scalars, one-off derivations)
def mix64_int(x: int) -> int:
    x &= MASK64
    x ^= x >> 30
    x = (x * MUL1) & MASK64
    x ^= x >> 27
    x = (x * MUL2) & MASK64
    return x ^ (x >> 31)


def prf_int(seed: int, x: int) -> int:
    return mix64_int((seed & MASK64) ^ mix64_int(x + GOLDEN))


def unit_int(h: int) -> float:
    return ((h >> 12) + 0.5) * UNIT_SCALE


# ---------------------------------------------------------------- numpy (reference)
def mix64_np(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on a uint64 array (any shape)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(MUL1)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(MUL2)
        return x ^ (x >> np.uint64(31))


def prf_np(seed: np.ndarray | int, x: np.ndarray | int) -> np.ndarray:
    """``prf(seed, x)`` broadcast over uint64 arrays."""
    seed = np.asarray(seed, dtype=np.uint64)
    x = np.asarray(x).astype(np.uint64)
    with np.errstate(over="ignore"):
        return mix64_np(seed ^ mix64_np(x + np.uint64(GOLDEN)))


def unit_np(h: np.ndarray) -> np.ndarray:
    """Uniform float64 strictly inside (0, 1) from the top 52 bits."""
    return ((np.asarray(h, dtype=np.uint64) >> np.uint64(12)).astype(np.float64) + 0.5) * UNIT_SCALE


# ---------------------------------------------------------------- torch (generation, CPU or GPU)
def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_MUL1_S, _MUL2_S, _GOLDEN_S = _signed(MUL1), _signed(MUL2), _signed(GOLDEN)


def to_signed(x: int) -> int:
    """A uint64 value as the int64 with the same bits (for torch)."""
    return _signed(x & MASK64)


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64_t(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer on an int64 tensor (bit pattern of uint64)."""
    x = x ^ _srl(x, 30)
    x = x * _MUL1_S
    x = x ^ _srl(x, 27)
    x = x * _MUL2_S
    return x ^ _srl(x, 31)


def prf_t(seed: torch.Tensor | int, x: torch.Tensor | int) -> torch.Tensor:
    """``prf(seed, x)`` broadcast over int64 tensors; python ints are read as uint64 values."""
    if isinstance(seed, int):
        seed = to_signed(seed)
    if isinstance(x, int):
        import torch

        x = torch.tensor(to_signed(x), dtype=torch.int64)
    return mix64_t(seed ^ mix64_t(x + _GOLDEN_S))


def unit_t(h: torch.Tensor) -> torch.Tensor:
    """float64 uniforms strictly inside (0, 1), bit-identical to ``unit_np``."""
    import torch

    return (_srl(h, 12).to(torch.float64) + 0.5) * UNIT_SCALE


def unsigned_min_t(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Minimum of uint64 bit patterns stored as int64 (flip the sign bit so signed order = unsigned order)."""
    flip = -(1 << 63)
    return (x ^ flip).min(dim=dim).values ^ flip
