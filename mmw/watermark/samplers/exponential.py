"""C1 exponential (Aaronson): Gumbel-max with keyed per-token uniforms; distortion-free."""

from __future__ import annotations

import numpy as np
import torch

from mmw.watermark import prf
from mmw.watermark.samplers.base import Sampler, law_of, per_candidate
from mmw.watermark.samplers.parts import ExponentialPart


class Exponential(Sampler, ExponentialPart):

    def prepare(self, device):
        self.token_ids(device)

    def uniforms_t(self, seeds: torch.Tensor) -> torch.Tensor:
        """u_i = unit(prf(r, i)) for every token id. seeds int64 [B] or [B, V] (per candidate) -> float64 [B, V]."""
        vocab = self.token_ids(seeds.device)
        return prf.unit_t(prf.prf_t(per_candidate(seeds), vocab.unsqueeze(0)))

    takes_law = True

    def choose(self, logits, seeds, temperature, plain_u, probs=None):
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = law_of(logits, temperature, probs)
        # argmax log(u_i) / p_i  ==  argmax u_i^(1/p_i); p_i = 0 gives -inf (log u < 0).
        return (torch.log(self.uniforms_t(seeds)) / probs).argmax(dim=-1)

    def statistic(self, tokens, seeds):
        u = prf.unit_np(prf.prf_np(seeds, tokens))
        return np.log(1.0 - u)
