"""C2 inverse transform (Kuditipudi et al.): inverse-CDF sampling over a keyed permutation of the vocabulary."""

from __future__ import annotations

import numpy as np
import torch

from mmw.watermark import prf
from mmw.watermark.samplers.base import Sampler, inverse_cdf, law_of
from mmw.watermark.samplers.parts import InverseTransformPart

TINY = 2.0**-60  # floor for F: the statistic stays finite if v lands exactly on eta


def keyed_permutation(key: int, vocab_size: int) -> np.ndarray:
    """pi as an order: token ids sorted by their keyed hash (stable). int64 [V]."""
    h = prf.prf_np(np.uint64(prf.prf_int(key, prf.PERM)), np.arange(vocab_size, dtype=np.uint64))
    return np.argsort((h >> np.uint64(1)).astype(np.int64), kind="stable")


class InverseTransform(Sampler, InverseTransformPart):
    """Statistic: the probability integral transform of Kuditipudi's |v - eta|. Given the token (so eta), v is
    uniform under H0 and ``F_eta(c) = P(|v - eta| <= c) = min(eta + c, 1) - max(eta - c, 0)``; log F is -Exp(1)."""

    def __init__(self, spec, key, vocab_size):
        super().__init__(spec, key, vocab_size)
        self.order = keyed_permutation(key, vocab_size)
        self.rank = np.empty(vocab_size, dtype=np.int64)
        self.rank[self.order] = np.arange(vocab_size)
        self._order_t: torch.Tensor | None = None

    def prepare(self, device):
        if self._order_t is None or self._order_t.device != device:
            self._order_t = torch.from_numpy(self.order).to(device)

    takes_law = True

    def choose(self, logits, seeds, temperature, plain_u, probs=None):
        if temperature == 0:
            return logits.argmax(dim=-1)
        self.prepare(logits.device)
        v = prf.unit_t(prf.prf_t(seeds, prf.SCALAR))
        j = inverse_cdf(law_of(logits, temperature, probs)[:, self._order_t], v)
        return self._order_t[j]

    def statistic(self, tokens, seeds):
        v = prf.unit_np(prf.prf_np(seeds, np.uint64(prf.SCALAR)))
        eta = self.rank[tokens] / (self.vocab_size - 1)
        c = np.abs(v - eta)
        f = np.minimum(eta + c, 1.0) - np.maximum(eta - c, 0.0)
        return np.log(np.maximum(f, TINY))

    def units(self, tokens, seeds):
        """One draw (v) per seed: different tokens under one seed share v, so dedup is by seed alone."""
        return np.arange(len(tokens)), np.asarray(seeds, dtype=np.uint64), self.statistic(tokens, seeds)
