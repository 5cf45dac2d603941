"""SynthID-Text's tournament sampling (Dathathri et al., Nature 2024), its output distribution computed exactly.

Layer l's g-value of token i under seed r is bit ``63 - l`` of ``prf(r, i)`` (docs/PRF.md): one PRF per
candidate token serves every layer (m <= 64), and under H0 the m bits of a (seed, token) pair are independent fair
bits. A tournament draws ``leaves ** m`` candidates from p and lets the ones with the larger g_l win each match
of round l; its winner's law is computed layer by layer, as SynthID's own efficient form does:

- ``leaves`` = 2 (non-distortionary): p_{l+1}(x) = p_l(x) (1 + g_l(x) - G_l), G_l = sum_y p_l(y) g_l(y);
  E over keys of the factor is 1, so each step's distribution equals the model's in expectation over keys;
- ``leaves`` = K > 2 (distortionary): p_{l+1}(x) = p_l(x) (1 - (1 - G_l)^K) / G_l when g_l(x) = 1, else
  p_l(x) (1 - G_l)^(K - 1).

One inverse-CDF draw with the step's plain uniform then picks the token. Repeated contexts (a seed already used in
this generation) are sampled plainly by the step (``mmw.processor``), as SynthID's context history does.
"""

from __future__ import annotations

import numpy as np
import torch
from mmw import nulls, prf
from mmw.samplers.base import Sampler, inverse_cdf, probabilities
from mmw.samplers.parts import TournamentPart

#: Shifts that bring layer l's bit (bit 63 - l of the PRF output) to bit 0, for l = 0..63.
_SHIFTS = np.arange(63, -1, -1, dtype=np.uint64)


def tournament_probs(probs: torch.Tensor, hashes: torch.Tensor, layers: int, leaves: int) -> torch.Tensor:
    """The tournament winner's distribution. probs: float64 [B, V] (the model's, after temperature); hashes:
    int64 [B, V] = prf(seed, token) (its bit 63 - l is g_l) -> float64 [B, V], each row summing to one."""
    for layer in range(layers):
        g = ((hashes >> (63 - layer)) & 1).to(probs.dtype)
        mass = (g * probs).sum(-1, keepdim=True)  # G_l: the chance that one candidate has g_l = 1
        if leaves == 2:
            probs = probs * (1.0 + g - mass)
        else:
            miss = 1.0 - mass  # a match is lost by the g = 1 side only when no candidate has g = 1
            won = (1.0 - miss ** leaves) / mass.clamp(min=torch.finfo(probs.dtype).tiny)
            probs = probs * torch.where(g > 0, won, miss ** (leaves - 1))
    return probs


def g_values_np(tokens: np.ndarray, seeds: np.ndarray, layers: int) -> np.ndarray:
    """g-values of aligned tokens (int64) and seeds (uint64), broadcast to shape S -> uint8 [S, layers]."""
    hashes = prf.prf_np(np.asarray(seeds, dtype=np.uint64), np.asarray(tokens))
    return ((hashes[..., None] >> _SHIFTS[:layers]) & np.uint64(1)).astype(np.uint8)


class Tournament(Sampler, TournamentPart):
    """Statistic of a token: minus the weighted number of its g-values equal to 1 (``-sum_l w_l g_l``, the
    scheme's ``layer_weights``; all ones by default, SynthID's mean score); each distinct (seed, token) pair is one
    unit, whose m bits are i.i.d. fair under H0, so the sum score's null is exactly Binomial(N m, 1/2) over N units
    with equal weights, and the weighted count's exact discrete law (``mmw.nulls.WeightedBits``) otherwise."""

    def __init__(self, spec, key, vocab_size):
        super().__init__(spec, key, vocab_size)
        self.weights = self.weights_of(spec)

    def prepare(self, device):
        self.token_ids(device)

    def choose(self, logits, seeds, temperature, plain_u):
        if temperature == 0:  # a one-hot distribution stays one-hot through every round
            return logits.argmax(dim=-1)
        vocab = self.token_ids(logits.device)
        hashes = prf.prf_t(seeds.unsqueeze(-1), vocab.unsqueeze(0))
        probs = tournament_probs(probabilities(logits, temperature), hashes, self.spec.layers, self.spec.leaves)
        return inverse_cdf(probs, plain_u)

    def statistic(self, tokens, seeds):
        return -(g_values_np(tokens, seeds, self.spec.layers).astype(np.int64) @ self.weights).astype(np.float64)

    def pvalue_sum(self, total, n_units):
        """-total = the weighted count of g = 1 among N units of m fair bits under H0: P(that count >= observed);
        with equal (unit) weights the count is Binomial(N m, 1/2)."""
        ones = np.rint(-np.asarray(total, dtype=np.float64))
        if np.all(self.weights == 1):
            return nulls.binomial_upper(ones, np.asarray(n_units) * self.spec.layers, 0.5)
        return nulls.weighted_bits_upper(ones, n_units, self.weights)
