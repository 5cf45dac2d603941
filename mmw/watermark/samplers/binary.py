"""C3 binary (Christ et al.): tokens as bit strings; each bit drawn by a keyed uniform against P(bit = 0)."""

from __future__ import annotations

import numpy as np
import torch
from mmw.watermark import nulls, prf
from mmw.watermark.samplers.base import Sampler, cumsum_last, law_of
from mmw.watermark.samplers.binary_code import build_code
from mmw.watermark.samplers.parts import BinaryPart


class Binary(Sampler, BinaryPart):
    """At internal node m with seed r: w = unit(prf(r, NODE + m)); bit 0 iff w < P(left subtree | node).

    Statistic per node (the paper's): -log(1 - w) for bit 0, -log(w) for bit 1 — Exp(1) under H0 and smaller
    when watermarked; a token's statistic is the sum over its nodes. Each (seed, node) pair is one draw."""

    def __init__(self, spec, key, vocab_size):
        super().__init__(spec, key, vocab_size)
        self.code = build_code(spec.binary_code or "huffman", vocab_size)
        # A plain int: reading it off the numpy code inside a compiled step makes Dynamo guard on the array, and
        # that guard breaks under inference mode (torch 2.11: "Guard failed on the same frame it was created").
        self.max_depth = self.code.max_depth
        self._t: dict[str, torch.Tensor] | None = None

    def prepare(self, device):
        """The code as device tensors (built once per device), laid out for ``choose``.

        leaf_order [V]: token ids in depth-first (left-first) leaf order, so every internal node covers one
        contiguous run of it; lo/mid/hi [n_internal]: where node m's run starts, where its right subtree starts,
        and where the run ends; child [2 * n_internal]: child of node m along bit b at ``2m + b`` (a leaf is
        ``-(token + 1)``); nodes [n_internal]: ``NODE + m``, the PRF input of node m."""
        if self._t is None or self._t["child"].device != device:
            leaf_order, lo, mid, hi = _leaf_layout(self.code)
            self._t = {"leaf_order": torch.from_numpy(leaf_order).to(device),
                       "lo": torch.from_numpy(lo).to(device), "mid": torch.from_numpy(mid).to(device),
                       "hi": torch.from_numpy(hi).to(device),
                       "child": torch.from_numpy(self.code.children.reshape(-1)).to(device),
                       "nodes": torch.arange(len(lo), dtype=torch.int64, device=device) + prf.NODE}
        return self._t

    takes_law = True

    def choose(self, logits, seeds, temperature, plain_u, probs=None):
        """Every internal node's branch at once, then a walk from the root along them.

        A node's probability mass is a difference of the prefix sums over the depth-first leaf order (one scan
        for the whole tree, where summing each token's probability into all its ancestors moved D x B x V
        values). The difference of two prefix sums carries an absolute rounding error ~1e-16, so a node's
        left/right ratio is off by ~1e-16 / mass(node); the walk reaches a node with probability mass(node), so
        a token's chance of being changed by rounding is ~depth x 1e-16. The walk is ``max_depth`` gathers on
        [B] (one fused kernel when compiled)."""
        if temperature == 0:
            return logits.argmax(dim=-1)
        probs = law_of(logits, temperature, probs)  # [B, V]
        t = self.prepare(logits.device)
        cdf = torch.nn.functional.pad(cumsum_last(probs[:, t["leaf_order"]]), (1, 0))  # [B, V + 1]
        start = cdf[:, t["lo"]]
        node_mass = cdf[:, t["hi"]] - start
        left_mass = cdf[:, t["mid"]] - start
        ratio = torch.where(node_mass > 0, left_mass / node_mass.clamp(min=torch.finfo(probs.dtype).tiny),
                            torch.full_like(node_mass, 0.5))
        w = prf.unit_t(prf.prf_t(seeds.unsqueeze(-1), t["nodes"]))  # [B, n_internal]
        right = (w >= ratio).long()  # the walk from node m takes bit 1 iff w_m >= P(left | m)
        node = torch.zeros_like(seeds)  # >= 0: internal node; < 0: the leaf -(token + 1) reached
        for _ in range(self.max_depth):
            at = node.clamp(min=0)
            node = torch.where(node >= 0, t["child"][2 * at + right.gather(1, at.unsqueeze(-1)).squeeze(-1)], node)
        return -node - 1

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


def _leaf_layout(code) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Depth-first (left-first) order of the leaves and each internal node's run in it (see ``Binary.prepare``).

    Returns leaf_order int64 [V], lo/mid/hi int64 [n_internal]."""
    n_internal = len(code.children)
    lo, mid, hi = (np.empty(n_internal, dtype=np.int64) for _ in range(3))
    order: list[int] = []
    stack = [(0, 0)]  # (node, phase): 0 = entering, 1 = left subtree done, 2 = right subtree done

    def descend(child: int) -> None:
        if child >= 0:
            stack.append((int(child), 0))
        else:
            order.append(-int(child) - 1)

    while stack:
        m, phase = stack.pop()
        if phase == 0:
            lo[m] = len(order)
            stack.append((m, 1))
            descend(code.children[m, 0])
        elif phase == 1:
            mid[m] = len(order)
            stack.append((m, 2))
            descend(code.children[m, 1])
        else:
            hi[m] = len(order)
    return np.array(order, dtype=np.int64), lo, mid, hi
