"""C4 distribution shift (Kirchenbauer et al.): add delta to a keyed green list, before temperature."""

from __future__ import annotations

import numpy as np
import torch
from mmw.watermark import nulls, prf
from mmw.watermark.samplers.base import Sampler, inverse_cdf, per_candidate, probabilities
from mmw.watermark.samplers.parts import DistributionShiftPart


class DistributionShift(Sampler, DistributionShiftPart):
    """Green list of token i under seed r: ``unit(prf(r, i)) < gamma`` — a keyed random subset of expected size
    gamma*d. Membership is decided per token, so no per-step permutation of the vocabulary is needed, and under H0
    each (seed, token) pair is green with probability exactly gamma."""

    def prepare(self, device):
        self.token_ids(device)

    def green_t(self, seeds: torch.Tensor) -> torch.Tensor:
        """seeds int64 [B] or [B, V] (per candidate) -> bool [B, V]."""
        vocab = self.token_ids(seeds.device)
        return prf.unit_t(prf.prf_t(per_candidate(seeds), vocab.unsqueeze(0))) < self.spec.gamma

    def choose(self, logits, seeds, temperature, plain_u):
        shifted = logits.to(torch.float64) + self.spec.delta * self.green_t(seeds)
        if temperature == 0:
            return shifted.argmax(dim=-1)
        return inverse_cdf(probabilities(shifted, temperature), plain_u)

    def statistic(self, tokens, seeds):
        green = prf.unit_np(prf.prf_np(seeds, tokens)) < self.spec.gamma
        return -green.astype(np.float64)

    def pvalue_sum(self, total, n_units):
        """-total = number of green units ~ Binomial(N, gamma) under H0: P(X >= greens)."""
        return nulls.binomial_upper(np.rint(-np.asarray(total, dtype=np.float64)), n_units, self.spec.gamma)
