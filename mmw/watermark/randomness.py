"""Randomness sources R (docs/PRF.md): the seed r_n behind each token.

- R1 ``window``: keyed hash of the H previous tokens.
- R2 ``minhash``: minimum over the H previous tokens of their keyed hashes.
- R3 ``fixed``: a key sequence of length L, read at ``(n + shift) mod L`` with a per-generation shift.
- ``selfhash`` (Kirchenbauer et al., "On the Reliability of Watermarks"): minimum of the keyed hashes over the H
  tokens that end with the candidate itself — one seed per (position, candidate), so the source gives the context's
  part and the samplers that accept per-candidate seeds (``SamplerPart.candidate_seeds``)
  combine it with every candidate (``candidate_seeds_t``); the detector needs only the observed token's seed.

Each source has a numpy twin (detector reference) and a torch twin (generation); both give the same uint64 bits.
torch is imported where the torch twin runs (as in ``mmw.watermark.prf``), so validation and detection stay torch-free.
Its class declares the scheme keys it uses (``mmw.validation.Part``, applied by ``mmw.watermark.scheme.SchemeSpec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from mmw.watermark import prf
from mmw.watermark.samplers.parts import DECLARED, WATERMARKING
from mmw.watermark.scheme_values import SchemeValues
from mmw.validation import Key, Part, Refuse, Unused

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RandomnessSource(Part):
    """Base: ``kind`` in {window, minhash, fixed}; ``window`` = H or ``key_length`` = L."""

    part = "randomness"
    chosen = "with randomness={name}"
    #: Whether the seeds depend on the text (R1, R2) or only on the position (R3).
    text_dependent: ClassVar[bool] = True
    #: Whether the seed depends on the candidate token itself (one seed per candidate at generation).
    per_candidate: ClassVar[bool] = False

    kind: str
    window: int = 0
    key_length: int = 1

    @classmethod
    def from_spec(cls, spec: SchemeValues) -> "RandomnessSource":
        if spec.randomness == "fixed":
            return FixedKey(kind="fixed", key_length=spec.key_length)
        if spec.randomness == "selfhash":
            return SelfHash(kind="selfhash", window=spec.window)
        if spec.randomness == "minhash" and spec.window > 1:
            return MinHash(kind="minhash", window=spec.window)
        return SlidingWindow(kind="window", window=spec.window)  # min-hash over one token == window of one

    @property
    def context(self) -> int:
        """Tokens of context a seed needs (the detector cannot score the first ``context`` tokens)."""
        return 0

    def seeds_np(self, tokens: np.ndarray, key: int) -> np.ndarray:
        """Seeds for positions ``context .. N-1`` of ``tokens`` (int64 [N]) -> uint64 [N - context]."""
        raise NotImplementedError

    def seeds_t(self, context_ids: torch.Tensor, key: int, step: int, shifts: torch.Tensor) -> torch.Tensor:
        """Seeds for the next token of each row. context_ids: int64 [B, S] (prompt + generated so far);
        step: index of the token being generated; shifts: int64 [B] (fixed key only) -> int64 [B]."""
        raise NotImplementedError


@dataclass(frozen=True)
class SlidingWindow(RandomnessSource):
    name = "window"
    scheme_keys = (Unused("key_length"), Key("window", required=True))

    @property
    def context(self) -> int:
        return self.window

    def seeds_np(self, tokens: np.ndarray, key: int) -> np.ndarray:
        n = len(tokens) - self.window
        acc = np.full(max(n, 0), prf.prf_int(key, prf.WINDOW), dtype=np.uint64)
        for j in range(1, self.window + 1):  # T[n-1] first, then T[n-2], ...
            acc = prf.prf_np(acc, tokens[self.window - j: self.window - j + n])
        return acc

    def seeds_t(self, context_ids, key, step, shifts):
        import torch

        b = context_ids.shape[0]
        acc = torch.full((b,), prf.to_signed(prf.prf_int(key, prf.WINDOW)), dtype=torch.int64,
                         device=context_ids.device)
        for j in range(1, self.window + 1):
            acc = prf.prf_t(acc, context_ids[:, -j])
        return acc


@dataclass(frozen=True)
class MinHash(RandomnessSource):
    name = "minhash"
    scheme_keys = SlidingWindow.scheme_keys
    refuses = (Refuse("window", lambda v: v["window"] == 0, "min-hash over an empty window is meaningless; for "
                      "constant randomness use randomness=window with window=0", "an integer >= 1"),)

    @property
    def context(self) -> int:
        return self.window

    def seeds_np(self, tokens: np.ndarray, key: int) -> np.ndarray:
        n = len(tokens) - self.window
        if n <= 0:
            return np.zeros(0, dtype=np.uint64)
        hashes = prf.prf_np(np.uint64(prf.prf_int(key, prf.MINHASH)), tokens)
        windows = np.lib.stride_tricks.sliding_window_view(hashes, self.window)[:n]
        return windows.min(axis=1)

    def seeds_t(self, context_ids, key, step, shifts):
        base = prf.prf_int(key, prf.MINHASH)
        return prf.unsigned_min_t(prf.prf_t(base, context_ids[:, -self.window:]), dim=1)


@dataclass(frozen=True)
class FixedKey(RandomnessSource):
    name = "fixed"
    text_dependent = False
    scheme_keys = (Unused("window"), Key("key_length", required=True))

    def key_sequence(self, key: int) -> np.ndarray:
        """uint64 [L]: the expanded key sequence r_0 .. r_{L-1}."""
        return prf.prf_np(np.uint64(prf.prf_int(key, prf.FIXED)), np.arange(self.key_length, dtype=np.uint64))

    def seeds_np(self, tokens: np.ndarray, key: int, shift: int = 0) -> np.ndarray:
        seq = self.key_sequence(key)
        return seq[(np.arange(len(tokens)) + shift) % self.key_length]

    def seeds_t(self, context_ids, key, step, shifts):
        import torch

        seq = torch.from_numpy(self.key_sequence(key).view(np.int64)).to(context_ids.device)
        return seq[(shifts + step) % self.key_length]

    def shifts_for_rows(self, row_seeds: list[int]) -> np.ndarray:
        """Per-generation random offset into the key sequence (diversity across generations)."""
        return np.array([prf.prf_int(s, prf.SHIFT) % self.key_length for s in row_seeds], dtype=np.int64)


@dataclass(frozen=True)
class SelfHash(RandomnessSource):
    """Self-seeding: ``r_n(c) = min(prf(b, T[n-H+1]), ..., prf(b, T[n-1]), prf(b, c))`` (unsigned), ``b = prf(k,
    SELFHASH)``, for candidate c at position n: the min-hash over the window of H tokens that ends with the candidate
    (H - 1 tokens of context). The detector's seed is the observed token's, ``r_n(T[n])``."""

    name = "selfhash"
    per_candidate = True
    scheme_keys = SlidingWindow.scheme_keys
    refuses = (Refuse("window", lambda v: v["window"] == 0, "randomness=selfhash hashes a window that includes the "
                      "candidate, so it needs window >= 1", "an integer >= 1"),
               Refuse("sampler", lambda v: not DECLARED[v["sampler"]].candidate_seeds,
                      "randomness=selfhash gives every candidate its own seed; sampler={sampler} needs one seed per "
                      "position (one permutation, uniform or tree walk shared by all candidates)",
                      ", ".join(cls.name for cls in WATERMARKING if cls.candidate_seeds)),
               Refuse("score", lambda v: v["score"] != "sum", "randomness=selfhash is detected by the sum score only "
                      "(the align and edit scores pair a token with other positions' seeds, which here depend on "
                      "those positions' own tokens)", ("sum",)))

    @property
    def context(self) -> int:
        return self.window - 1

    def seeds_np(self, tokens: np.ndarray, key: int) -> np.ndarray:
        n = len(tokens) - self.context
        if n <= 0:
            return np.zeros(0, dtype=np.uint64)
        hashes = prf.prf_np(np.uint64(prf.prf_int(key, prf.SELFHASH)), tokens)
        return np.lib.stride_tricks.sliding_window_view(hashes, self.window)[:n].min(axis=1)

    def candidate_seeds_t(self, context_ids: torch.Tensor, key: int, vocab: torch.Tensor) -> torch.Tensor:
        """Every candidate's seed: context_ids int64 [B, S] (S >= H - 1), vocab int64 [V] (the token ids) -> int64
        [B, V]."""
        import torch

        base = torch.full((1, 1), prf.to_signed(prf.prf_int(key, prf.SELFHASH)), dtype=torch.int64,
                          device=context_ids.device)
        return self.combine_t(base, context_ids, vocab)

    def combine_t(self, base: torch.Tensor, context_ids: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
        """The seeds from the keyed base ``prf(k, SELFHASH)`` (int64 [B, 1], or [1, 1] for one key): the unsigned
        min of the context's part (the H - 1 previous tokens' hashes) and each candidate's own hash.
        context_ids int64 [B, S], vocab int64 [V] -> int64 [B, V]."""
        import torch

        seeds = prf.prf_t(base, vocab.unsqueeze(0))
        if self.context == 0:
            return seeds.expand(context_ids.shape[0], -1)
        context = prf.unsigned_min_t(prf.prf_t(base, context_ids[:, -self.context:]), dim=1).unsqueeze(-1)
        flip = -(1 << 63)  # signed order of the flipped bits = unsigned order
        return torch.where((seeds ^ flip) < (context ^ flip), seeds, context)

    def seeds_t(self, context_ids, key, step, shifts):
        raise TypeError("randomness=selfhash has one seed per candidate: use candidate_seeds_t")


#: The randomness sources by name (the values of the scheme's ``randomness``).
SOURCES: dict[str, type[RandomnessSource]] = {cls.name: cls for cls in (SlidingWindow, MinHash, FixedKey, SelfHash)}


def trial_keys(key: int, trials: int) -> list[int]:
    """Independent keys for the permutation-test trials (docs/PRF.md, empirical null)."""
    return [prf.prf_int(key, prf.TRIAL + t) for t in range(trials)]
