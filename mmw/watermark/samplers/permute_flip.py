"""Permute-and-flip decoding (Zhao, Li & Wang, ICLR 2025), watermarked with keyed noise.

The PF decoder (permute-and-flip of McKenna & Sheldon, the exponential-noise form of Ding et al.) at temperature T
visits the tokens in a random order and stops at token i with probability ``q_i = p_i / p_max``, where
``p = softmax(logits / T)``. Its watermark replaces the randomness by keyed uniforms ``r_i = unit(prf(seed, i))``:

    y = argmax_i  p_i / r_i  =  argmax_i  log p_i + E_i,   E_i = -log r_i ~ Exp(1) i.i.d. over keys.

Law of y over keys (the PF law, what ``tests`` check the sampler against): for each i,

    P(y = i) = q_i * integral_0^1  prod_{j != i} (1 - q_j t) dt.

Proof: y = i iff r_j > r_i q_j / q_i for every j != i. Given r_i = s, these independent events have probability
``prod_j (1 - min(1, s q_j / q_i))``; substitute s = q_i t. For i the argmax of p (q_i = 1) t runs over (0, 1);
otherwise the factor of the argmax j* (q_j* = 1) is 0 for t >= 1, so t again runs over (0, 1) and the factor
``1 - q_j t`` is never clipped. This is PF's output law (random order = i.i.d. uniform arrival times t_j: j comes
before i iff t_j < t_i, and then fails its flip with probability 1 - q_j). So the watermark is distortion-free *with
respect to the PF decoder* (over keys, each step samples PF's law), not with respect to softmax sampling: PF puts more
mass on the likelier tokens than softmax at the same T (lower perplexity, the paper's point).

Detection: the per-token statistic is ``log r_T`` of the observed token T under its seed (lower = more evidence,
the package convention). Under H0 (text independent of the key) every deduplicated unit's r is U(0, 1), so
``-log r ~ Exp(1)``: the same -Exp(1) pivot as C1, hence the default exact null of the sum (``nulls.erlang_upper``).
"""

from __future__ import annotations

import numpy as np
import torch

from mmw.watermark import prf
from mmw.watermark.samplers.base import Sampler, law_of, per_candidate
from mmw.watermark.samplers.parts import PermuteFlipPart


def pf_law(probs: np.ndarray) -> np.ndarray:
    """The exact PF output law of one distribution: float64 [V] probabilities -> float64 [V], by the closed form
    ``P(i) = q_i int_0^1 prod_{j != i} (1 - q_j t) dt`` (q = probs / max probs) with exact polynomial integration.
    O(V^2) work: for tests and small supports."""
    q = np.asarray(probs, dtype=np.float64) / np.max(probs)
    out = np.zeros_like(q)
    for i in np.flatnonzero(q > 0):
        poly = np.polynomial.Polynomial([1.0])
        for j in np.flatnonzero(q > 0):
            if j != i:
                poly = poly * np.polynomial.Polynomial([1.0, -q[j]])
        antiderivative = poly.integ()
        out[i] = q[i] * (antiderivative(1.0) - antiderivative(0.0))
    return out


class PermuteFlip(Sampler, PermuteFlipPart):
    """PF decoding with keyed noise: y = argmax_i log p_i - log r_i, r_i = unit(prf(seed, i))."""

    def prepare(self, device):
        self.token_ids(device)

    def uniforms_t(self, seeds: torch.Tensor) -> torch.Tensor:
        """r_i = unit(prf(seed, i)) for every token id. seeds int64 [B] or [B, V] (per candidate) -> float64 [B, V]."""
        vocab = self.token_ids(seeds.device)
        return prf.unit_t(prf.prf_t(per_candidate(seeds), vocab.unsqueeze(0)))

    @staticmethod
    def pick(probs: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """argmax_i log p_i - log r_i (p_i = 0 gives -inf: never chosen while some p_j > 0)."""
        return (torch.log(probs) - torch.log(r)).argmax(dim=-1)

    takes_law = True

    def choose(self, logits, seeds, temperature, plain_u, probs=None):
        if temperature == 0:
            return logits.argmax(dim=-1)
        return self.pick(law_of(logits, temperature, probs), self.uniforms_t(seeds))

    def choose_or_plain(self, logits, seeds, temperature, plain_u, plain_rows, probs=None):
        """``choose``, except that the rows where ``plain_rows`` (bool [B]) is set (repeated contexts,
        ``mask_repeated``) are drawn by the *unwatermarked* PF decoder: the same argmax with noise from the row's
        private plain uniform instead of the key, so the scheme's sampling law stays PF's on every row. The plain
        uniform's 52 bits (``unit`` is (k + 1/2) 2^-52, so k is recovered exactly) seed a fresh PRF stream."""
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = law_of(logits, temperature, probs)
        k = (plain_u / prf.UNIT_SCALE - 0.5).to(torch.int64)
        fresh = self.uniforms_t(prf.prf_t(k, prf.SAMPLE))
        r = torch.where(plain_rows.unsqueeze(-1), fresh, self.uniforms_t(seeds))
        return self.pick(probs, r)

    def statistic(self, tokens, seeds):
        return np.log(prf.unit_np(prf.prf_np(seeds, tokens)))
