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
            n_internal = len(self.code.children)
            ancestors = self.code.path_nodes.T.copy()  # [D, V]
            ancestors[ancestors < 0] = n_internal  # past a leaf's depth: a dummy slot that is never read
            self._t = {"children": torch.from_numpy(self.code.children).to(device),
                       "ancestors": torch.from_numpy(ancestors).to(device)}
        return self._t

    def choose(self, logits, seeds, temperature, plain_u):
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = probabilities(logits, temperature)
        t = self._tensors(logits.device)
        b, n_internal = logits.shape[0], len(self.code.children)
        # Mass under every internal node: each token adds its probability to its ancestor at each depth.
        mass = torch.zeros(b, n_internal + 1, dtype=probs.dtype, device=probs.device)
        for anc in t["ancestors"]:
            mass.scatter_add_(1, anc.expand(b, -1), probs)

        def child_mass(child: torch.Tensor) -> torch.Tensor:
            inner = mass.gather(1, child.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            leaf = probs.gather(1, (-child - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
            return torch.where(child >= 0, inner, leaf)

        rows = torch.arange(b, device=logits.device)
        node = torch.zeros(b, dtype=torch.int64, device=logits.device)
        token = torch.zeros(b, dtype=torch.int64, device=logits.device)
        done = torch.zeros(b, dtype=torch.bool, device=logits.device)
        for _ in range(self.code.max_depth):  # fixed trip count: no host sync inside the walk
            kids = t["children"][node]  # [B, 2]
            p_left, p_node = child_mass(kids[:, 0]), mass[rows, node]
            ratio = torch.where(p_node > 0, p_left / p_node, torch.full_like(p_node, 0.5))
            w = prf.unit_t(prf.prf_t(seeds, node + prf.NODE))
            nxt = kids.gather(1, (w >= ratio).long().unsqueeze(-1)).squeeze(-1)
            leaf = (nxt < 0) & ~done
            token = torch.where(leaf, -nxt - 1, token)
            done |= leaf
            node = torch.where(done, node, nxt)
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
