"""Scores S (docs/PRF.md) — the numpy reference backend.

A backend turns one text's tokens into per-prefix quantities; the p-values are computed from them by the
sampler (exact nulls) or by ``mmw.watermark.nulls`` (empirical null). The numba backends in ``mmw.kernels`` compute the
same quantities for packed batches and are tested against this file.

- ``sum_prefix``: for each prefix length n = 1..N, the sum of the deduplicated unit statistics and their count.
- ``empirical_prefix``: for each prefix, the observed align/edit score and how many of the T trial scores are
  <= it.

Each score's class declares the scheme keys it uses and the combinations it refuses (``mmw.validation.Part``,
applied by ``mmw.watermark.scheme.SchemeSpec``): the paper's limitations of building blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from mmw.watermark.randomness import FixedKey, RandomnessSource, trial_keys
from mmw.watermark.scheme_values import SchemeValues
from mmw.validation import Key, Part, Refuse, Unused, Values

if TYPE_CHECKING:
    from mmw.watermark.samplers.base import Sampler

#: Permutation-test trials of the align and edit scores when ``trials`` is not set.
DEFAULT_TRIALS = 100


def _enough_trials(values: Values) -> tuple[str, str] | None:
    """With T trials the smallest empirical p-value is 1/(T+1): above alpha nothing could be detected."""
    trials, alpha = values["trials"], values["alpha"]
    if 1.0 / (trials + 1) <= alpha:
        return None
    need = int(-(-1.0 // alpha)) - 1
    return (f"with {trials} trials the smallest p-value is 1/{trials + 1} > alpha={alpha}: nothing could ever be "
            "detected", f"trials >= {need}")


#: Constant randomness (key_length=1) cannot be misaligned, so a search over alignments finds nothing to undo.
_CONSTANT_KEY = Refuse("score", lambda v: v["randomness"] == "fixed" and v["key_length"] == 1,
                       "key_length=1 is constant randomness, which cannot be misaligned; use score=sum with "
                       "randomness=window, window=0", "sum")
_TRIALS = Key("trials", default=DEFAULT_TRIALS, check=_enough_trials)


class Score(Part):
    """A score S (the scheme's ``score``); ``exact_null``: its p-values come from an exact null distribution
    (the sampler's), not from the permutation test over ``trials`` keys."""

    part = "score"
    chosen = "by score={name}"
    exact_null: ClassVar[bool] = False


class Sum(Score):
    """S1: the sum of the deduplicated per-token statistics."""

    name = "sum"
    exact_null = True
    scheme_keys = (Unused("psi"), Unused("trials", "by score=sum (its null distribution is exact)"))
    refuses = (Refuse("score", lambda v: v["randomness"] == "fixed", "the sum score is not robust with fixed "
                      "randomness (one deleted token misaligns every later value); with randomness=fixed use align "
                      "or edit, or use randomness=window with window=0 for constant randomness", ("align", "edit")),)


class Align(Score):
    """S2: the best cyclic alignment of the text with the fixed key sequence."""

    name = "align"
    scheme_keys = (Unused("psi"), _TRIALS)
    refuses = (Refuse("score", lambda v: v["randomness"] != "fixed", "align searches over key shifts, meaningless "
                      "with text-dependent randomness={randomness} (nothing can be misaligned)",
                      ("sum", "edit (window=1)")),
               _CONSTANT_KEY)


class Edit(Score):
    """S3: the edit distance of the text to the randomness, with gap cost ``psi``."""

    name = "edit"
    scheme_keys = (Key("psi", required=True, purpose="the edit-score gap cost"), _TRIALS)
    refuses = (Refuse("score", lambda v: v["randomness"] != "fixed" and v["window"] != 1, "edit with "
                      "text-dependent randomness needs window=1 (got {window}): with a longer window an edit "
                      "changes the random values, not only their alignment", ("sum", "edit with window=1")),
               _CONSTANT_KEY)


#: The scores by name (the values of the scheme's ``score``).
SCORES: dict[str, type[Score]] = {cls.name: cls for cls in (Sum, Align, Edit)}


def _per_prefix(positions: np.ndarray, values: np.ndarray, n_tokens: int) -> np.ndarray:
    """Cumulative sum of values by token position -> float64 [N] (entry n-1 covers positions < n)."""
    return np.cumsum(np.bincount(positions, weights=values, minlength=n_tokens)[:n_tokens])


def edit_diagonal(cost: np.ndarray, psi: float) -> np.ndarray:
    """Edit score D(n, n) for n = 1..N. cost: float64 [N, N] (token i vs randomness j) -> float64 [N].

    D(i, j) = min(D(i-1, j-1) + cost[i-1, j-1], D(i-1, j) + psi, D(i, j-1) + psi), D(i, 0) = i psi, D(0, j) = j psi.
    Row by row, the in-row recurrence D(i, j) = min(c_j, D(i, j-1) + psi) is a running minimum of
    c_j - j psi, which numpy does without a Python loop over j.
    """
    n = cost.shape[0]
    steps = psi * np.arange(n + 1)
    prev = steps.copy()
    diag = np.empty(n)
    for i in range(1, n + 1):
        c = np.empty(n + 1)
        c[0] = i * psi
        c[1:] = np.minimum(prev[:-1] + cost[i - 1], prev[1:] + psi)
        row = np.minimum.accumulate(c - steps) + steps
        diag[i - 1] = row[i]
        prev = row
    return diag


class ReferenceBackend:
    """Per-text numpy implementation of every score (slow for align/edit; the ground truth for kernels)."""

    def __init__(self, spec: SchemeValues, sampler: Sampler, source: RandomnessSource, key: int):
        self.spec, self.sampler, self.source, self.key = spec, sampler, source, key
        self.trial_keys = trial_keys(key, spec.trials) if spec.trials else []

    # ------------------------------------------------------------------ S1 sum
    def sum_prefix(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """tokens int64 [N] -> (total float64 [N], n_units int64 [N]) per prefix, first occurrences only."""
        n = len(tokens)
        ctx = self.source.context
        if n <= ctx:
            return np.zeros(n), np.zeros(n, dtype=np.int64)
        seeds = self.source.seeds_np(tokens, self.key)
        pos, ids, vals = self.sampler.units(tokens[ctx:], seeds)
        _, first = np.unique(ids, return_index=True)  # repeated draws would count one random value twice
        keep = np.zeros(len(ids), dtype=bool)
        keep[first] = True
        pos = pos[keep] + ctx
        total = _per_prefix(pos, vals[keep], n)
        count = _per_prefix(pos, np.ones(len(pos)), n).astype(np.int64)
        return total, count

    # ------------------------------------------------------------------ S2 align / S3 edit
    def _observed(self, tokens: np.ndarray, key: int) -> np.ndarray:
        """Score per prefix (float64 [N]) under one key; prefixes with nothing to score get 0."""
        n = len(tokens)
        out = np.zeros(n)
        if isinstance(self.source, FixedKey):
            seq = self.source.key_sequence(key)
            length = len(seq)
            if n == 0:
                return out
            cost = self.sampler.statistic(tokens[:, None], seq[None, :])  # [N, L]
            rows = np.arange(n)[:, None]
            if self.spec.score == "align":
                shifted = cost[rows, (rows + np.arange(length)[None, :]) % length]  # [N, shifts]
                return np.cumsum(shifted, axis=0).min(axis=1)
            best = np.full(n, np.inf)
            for shift in range(length):
                pair = cost[:, (shift + np.arange(n)) % length]  # token i vs randomness position j
                best = np.minimum(best, edit_diagonal(pair, self.spec.psi))
            return best
        # Edit with text-dependent randomness (H = 1): token i >= 1 against the seeds of positions j >= 1.
        if n < 2:
            return out
        seeds = self.source.seeds_np(tokens, key)  # seeds for positions 1..N-1
        cost = self.sampler.statistic(tokens[1:, None], seeds[None, :])
        out[1:] = edit_diagonal(cost, self.spec.psi)
        return out

    def sum_prefix_batch(self, texts: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.sum_prefix(t) for t in texts]

    def empirical_prefix_batch(self, texts: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.empirical_prefix(t) for t in texts]

    def empirical_prefix(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """tokens int64 [N] -> (observed score float64 [N], #trials with score <= observed int64 [N])."""
        observed = self._observed(tokens, self.key)
        n_le = np.zeros(len(tokens), dtype=np.int64)
        for k in self.trial_keys:
            n_le += self._observed(tokens, k) <= observed
        return observed, n_le
