"""DiPmark reweighting (Wu et al. 2023; gamma-reweight, Hu et al. 2023, is reweight_alpha = 0.5)."""

from __future__ import annotations

import numpy as np
import torch

from mmw.watermark import nulls, prf
from mmw.watermark.samplers.base import Sampler, cumsum_last, inverse_cdf, law_of
from mmw.watermark.samplers.parts import ReweightPart


def reweight_mass(mass: torch.Tensor, alpha: float) -> torch.Tensor:
    """DiPmark's map of the cumulative mass in the permuted order, ``F -> max(F - a, 0) + max(F - (1 - a), 0)``:
    the first ``a`` of the mass gets weight 0, the last ``a`` weight 2. float64 [..., V] -> float64 [..., V]."""
    return (mass - alpha).clamp(min=0.0) + (mass - (1.0 - alpha)).clamp(min=0.0)


class Reweight(Sampler, ReweightPart):
    """Permutation of seed r: the token ids ordered by ``u_i = unit(prf(r, i))`` (i.i.d. uniform over keys, so a
    uniform random permutation); green list: ``u_i >= 1 - gamma``, the tokens in the last gamma of that order
    (DiPmark's detector counts the tokens whose quantile in the permutation is at least its gamma_DiPmark =
    1 - gamma). Under H0 each (seed, token) pair is green with probability exactly gamma, as C4's; the sample is
    drawn with the row's plain uniform from the reweighted distribution."""

    def prepare(self, device):
        self.token_ids(device)

    def uniforms_t(self, seeds: torch.Tensor) -> torch.Tensor:
        """u_i for every token id. seeds int64 [B] -> float64 [B, V]."""
        vocab = self.token_ids(seeds.device)
        return prf.unit_t(prf.prf_t(seeds.unsqueeze(-1), vocab.unsqueeze(0)))

    def reweighted(self, probs: torch.Tensor, seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reweighted distribution in the permuted order: probs float64 [B, V], seeds int64 [B] ->
        (order int64 [B, V] (token ids, first to last), q float64 [B, V] (q[:, j] = mass of token order[:, j]))."""
        order = torch.argsort(self.uniforms_t(seeds), dim=-1)
        mass = reweight_mass(cumsum_last(probs.gather(-1, order)), float(self.spec.reweight_alpha))
        q = torch.diff(mass, dim=-1, prepend=torch.zeros_like(mass[:, :1]))
        return order, q.clamp_(min=0.0)

    takes_law = True

    def choose(self, logits, seeds, temperature, plain_u, probs=None):
        if temperature == 0:
            return logits.argmax(dim=-1)
        order, q = self.reweighted(law_of(logits, temperature, probs), seeds)
        j = inverse_cdf(q, plain_u)
        return order.gather(-1, j.unsqueeze(-1)).squeeze(-1)

    def statistic(self, tokens, seeds):
        green = prf.unit_np(prf.prf_np(seeds, tokens)) >= 1.0 - self.spec.gamma
        return -green.astype(np.float64)

    def pvalue_sum(self, total, n_units):
        """-total = number of green units ~ Binomial(N, gamma) under H0: P(X >= greens)."""
        return nulls.binomial_upper(np.rint(-np.asarray(total, dtype=np.float64)), n_units, self.spec.gamma)
