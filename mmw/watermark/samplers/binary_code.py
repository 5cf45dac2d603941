"""Binary codes for the C3 sampler: tokens as leaves of a binary tree (Huffman or fixed-width).

Huffman weights: offline there is no corpus count per token, so the default weight of token id i is the Zipf
proxy ``1 / (i + 10)`` — BPE vocabularies are ordered roughly by merge frequency. A counts file (``.npy`` of
length V) can replace it. The code is deterministic (ties broken by creation order), so generation and detection
rebuild the same tree.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class BinaryCode:
    """Tree over V leaves with internal nodes numbered breadth-first (root 0).

    children: int64 [n_internal, 2] — child node id (>= 0) or ``-(token + 1)`` for a leaf.
    path_nodes: int64 [V, D] — internal nodes on each token's root-to-leaf path, -1 past its depth.
    path_bits: int8 [V, D] — the branch taken at each of those nodes (0 left, 1 right), -1 past its depth.
    depth: int64 [V].
    """

    children: np.ndarray
    path_nodes: np.ndarray
    path_bits: np.ndarray
    depth: np.ndarray

    @property
    def max_depth(self) -> int:
        return int(self.path_nodes.shape[1])


def _from_tree(root: object, vocab_size: int) -> BinaryCode:
    """root: nested (left, right) tuples with int leaves. Numbers internal nodes breadth-first."""
    children: list[list[int]] = []
    paths: list[list[tuple[int, int]]] = [[] for _ in range(vocab_size)]
    queue = [(root, [])]
    head = 0
    internal_id: dict[int, int] = {}
    # First pass: assign ids breadth-first.
    order = []
    while head < len(queue):
        node, path = queue[head]
        head += 1
        if isinstance(node, tuple):
            nid = len(order)
            internal_id[id(node)] = nid
            order.append(node)
            for bit, child in enumerate(node):
                queue.append((child, path + [(nid, bit)]))
        else:
            paths[node] = path
    for node in order:
        row = []
        for child in node:
            row.append(internal_id[id(child)] if isinstance(child, tuple) else -(child + 1))
        children.append(row)
    depth = np.array([len(p) for p in paths], dtype=np.int64)
    d = int(depth.max())
    path_nodes = np.full((vocab_size, d), -1, dtype=np.int64)
    path_bits = np.full((vocab_size, d), -1, dtype=np.int8)
    for v, p in enumerate(paths):
        for j, (nid, bit) in enumerate(p):
            path_nodes[v, j] = nid
            path_bits[v, j] = bit
    return BinaryCode(np.array(children, dtype=np.int64), path_nodes, path_bits, depth)


def fixed_width_code(vocab_size: int) -> BinaryCode:
    """Plain binary code: a balanced tree (depth ceil(log2 V)), token ids in order."""
    level: list[object] = list(range(vocab_size))
    while len(level) > 1:
        level = [(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return _from_tree(level[0], vocab_size)


def huffman_code(weights: np.ndarray) -> BinaryCode:
    """Huffman tree over token weights (float [V], > 0); deterministic tie-breaking."""
    heap = [(float(w), i, i) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        w1, _, a = heapq.heappop(heap)
        w2, _, b = heapq.heappop(heap)
        heapq.heappush(heap, (w1 + w2, counter, (a, b)))
        counter += 1
    return _from_tree(heap[0][2], len(weights))


#: The codes ``build_code`` makes (the scheme's ``binary_code``; the first is the default).
CODES = ("huffman", "fixed")


@lru_cache(maxsize=8)
def build_code(kind: str, vocab_size: int) -> BinaryCode:
    if kind == "fixed":
        return fixed_width_code(vocab_size)
    return huffman_code(1.0 / (np.arange(vocab_size, dtype=np.float64) + 10.0))
