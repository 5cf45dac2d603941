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
        """The code as flat device tensors (built once per device).

        ancestors [D*V]: the internal node at depth d of token v (flattened d-major), a dummy slot ``n_internal``
        past the token's depth; bits [D*V]: the branch taken there (-1 past the depth); past_depth [D*V]: where
        the comparison is skipped; left [n_internal]: the left child as an index into ``cat([mass, probs])``
        (internal nodes first, then leaves)."""
        if self._t is None or self._t["ancestors"].device != device:
            n_internal = len(self.code.children)
            ancestors = self.code.path_nodes.T.copy()  # [D, V]
            past_depth = ancestors < 0
            ancestors[past_depth] = n_internal
            bits = self.code.path_bits.T.astype(np.int64)
            left = self.code.children[:, 0]
            left = np.where(left >= 0, left, n_internal + 1 + (-left - 1))
            self._t = {"ancestors": torch.from_numpy(ancestors.reshape(-1)).to(device),
                       "bits": torch.from_numpy(bits.reshape(-1)).to(device),
                       "past_depth": torch.from_numpy(past_depth.reshape(-1)).to(device),
                       "left": torch.from_numpy(left).to(device),
                       "nodes": torch.arange(n_internal, dtype=torch.int64, device=device) + prf.NODE}
        return self._t

    def choose(self, logits, seeds, temperature, plain_u):
        """Every internal node's branch at once, then the one leaf whose path follows them (no walk).

        The walk from the root takes bit 1 at node m iff w_m >= P(left | m); the token it reaches is the unique
        leaf whose path bits equal those decisions at all its ancestors. Deciding all V-1 nodes in parallel and
        matching paths costs a fixed ~30 kernels instead of ~10 per tree level (launch-bound on a GPU)."""
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = probabilities(logits, temperature)  # [B, V]
        t = self._tensors(logits.device)
        b, vocab = probs.shape
        n_internal = len(self.code.children)
        depth = self.code.max_depth
        # Probability mass under every internal node: one scatter of each token's probability onto its ancestors.
        mass = torch.zeros(b, n_internal + 1, dtype=probs.dtype, device=probs.device)
        mass.scatter_add_(1, t["ancestors"].expand(b, -1), probs.repeat(1, depth))
        node_mass = mass[:, :n_internal]
        left_mass = torch.cat([mass, probs], dim=1).gather(1, t["left"].expand(b, -1))
        ratio = torch.where(node_mass > 0, left_mass / node_mass.clamp(min=torch.finfo(probs.dtype).tiny),
                            torch.full_like(node_mass, 0.5))
        w = prf.unit_t(prf.prf_t(seeds.unsqueeze(-1), t["nodes"]))  # [B, n_internal]
        # 1 = right branch; one padding column for the dummy slot (read only past a token's depth, never compared).
        decision = torch.nn.functional.pad((w >= ratio).long(), (0, 1))
        taken = decision.gather(1, t["ancestors"].expand(b, -1))  # [B, D*V]
        follows = (taken == t["bits"]) | t["past_depth"]
        return follows.view(b, depth, vocab).all(dim=1).int().argmax(dim=-1)

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
