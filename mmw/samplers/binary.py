"""C3 binary (Christ et al.): tokens as bit strings; each bit drawn by a keyed uniform against P(bit = 0)."""

from __future__ import annotations

import numpy as np
import torch
from mmw import nulls, prf
from mmw.samplers.base import Sampler, probabilities
from mmw.samplers.binary_code import build_code


class Binary(Sampler):
    """At internal node m with seed r: w = unit(prf(r, NODE + m)); bit 0 iff w < P(left subtree | node).

    Statistic per node (the paper's): -log(1 - w) for bit 0, -log(w) for bit 1 — Exp(1) under H0 and smaller
    when watermarked; a token's statistic is the sum over its nodes. Each (seed, node) pair is one draw."""

    name = "binary"

    def __init__(self, spec, key, vocab_size):
        super().__init__(spec, key, vocab_size)
        self.code = build_code(spec.binary_code or "huffman", vocab_size)
        self._t: dict[str, torch.Tensor] | None = None

    def _tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        if self._t is None or self._t["children"].device != device:
            self._t = {
                "children": torch.from_numpy(self.code.children).to(device),
                "nodes": torch.from_numpy(self.code.path_nodes.T.copy()).to(device),  # [D, V]
                "bits": torch.from_numpy(self.code.path_bits.T.astype(np.int64)).to(device),  # [D, V]
            }
        return self._t

    def choose(self, logits, seeds, temperature, plain_u):
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = probabilities(logits, temperature)
        t = self._tensors(logits.device)
        b = logits.shape[0]
        node = torch.zeros(b, dtype=torch.int64, device=logits.device)
        token = torch.zeros(b, dtype=torch.int64, device=logits.device)
        done = torch.zeros(b, dtype=torch.bool, device=logits.device)
        for d in range(self.code.max_depth):
            under = t["nodes"][d].unsqueeze(0) == node.unsqueeze(-1)  # [B, V] tokens below the current node
            p_node = (probs * under).sum(-1)
            p_left = (probs * (under & (t["bits"][d] == 0).unsqueeze(0))).sum(-1)
            ratio = torch.where(p_node > 0, p_left / p_node, torch.full_like(p_node, 0.5))
            w = prf.unit_t(prf.prf_t(seeds, node + prf.NODE))
            nxt = t["children"][node, (w >= ratio).long()]
            leaf = (nxt < 0) & ~done
            token = torch.where(leaf, -nxt - 1, token)
            done |= leaf
            node = torch.where(done, torch.zeros_like(node), nxt)
            if bool(done.all()):
                break
        return token

    def _node_stats(self, tokens: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Broadcast tokens/seeds to shape S; returns nodes [S, D], ids [S, D] (uint64), stats [S, D] (0 past depth)."""
        tokens, seeds = np.broadcast_arrays(np.asarray(tokens), np.asarray(seeds, dtype=np.uint64))
        nodes = self.code.path_nodes[tokens]
        bits = self.code.path_bits[tokens]
        valid = nodes >= 0
        ids = prf.prf_np(seeds[..., None], (nodes + prf.NODE).astype(np.uint64))
        w = prf.unit_np(ids)
        s = np.where(bits == 0, -np.log(1.0 - w), -np.log(w))
        return valid, ids, np.where(valid, s, 0.0)

    def statistic(self, tokens, seeds):
        return self._node_stats(tokens, seeds)[2].sum(axis=-1)

    def units(self, tokens, seeds):
        valid, ids, s = self._node_stats(tokens, seeds)
        pos = np.broadcast_to(np.arange(len(tokens))[:, None], valid.shape)
        return pos[valid], ids[valid], s[valid]

    def pvalue_sum(self, total, n_units):
        """Sum of N Exp(1) draws is Gamma(N) under H0; watermarking makes it small: P(Gamma(N) <= total)."""
        return nulls.erlang_lower(total, n_units)
