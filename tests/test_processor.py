"""The shared watermark step: the C3 walk against a tree walk from first principles, and compiled == eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmw.watermark.prf import NODE, prf_int, unit_int
from mmw.watermark.processor import WatermarkStep, row_state
from mmw.watermark.samplers import build_sampler
from mmw.watermark.scheme import SchemeSpec

KEY = 77


def walk_reference(code, probs: np.ndarray, seed: int) -> int:
    """Christ et al.'s walk, spelled out: at node m take the left branch iff unit(prf(seed, NODE + m)) is below
    the left subtree's share of the node's probability (0.5 for a node of zero mass)."""

    def mass(child: int) -> float:
        if child < 0:
            return float(probs[-child - 1])
        return mass(int(code.children[child, 0])) + mass(int(code.children[child, 1]))

    node = 0
    while node >= 0:
        left, right = (int(c) for c in code.children[node])
        total = mass(left) + mass(right)
        ratio = mass(left) / total if total > 0 else 0.5
        w = unit_int(prf_int(seed, NODE + node))
        node = right if w >= ratio else left
    return -node - 1


@pytest.mark.parametrize("code", ["huffman", "fixed"])
def test_binary_choice_is_the_tree_walk(code):
    v, rows = 37, 200
    spec = SchemeSpec.from_params(dict(sampler="binary", binary_code=code, randomness="window", window=1,
                                       score="sum"))
    sampler = build_sampler(spec, KEY, v)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, v, generator=g) * 2
    logits[:, 5] = -float("inf")  # a zero-probability token must never be reached
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    chosen = sampler.choose(logits, seeds, 0.8, torch.full((rows,), 0.5)).numpy()
    probs = torch.softmax(logits.double() / 0.8, -1).numpy()
    want = [walk_reference(sampler.code, probs[i], int(seeds[i])) for i in range(rows)]
    np.testing.assert_array_equal(chosen, want)
    assert (chosen != 5).all() and len(set(chosen.tolist())) > 10


SCHEMES = [dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1, score="sum"),
           dict(sampler="exponential", randomness="minhash", window=3, score="sum"),
           dict(sampler="inverse_transform", randomness="window", window=1, score="sum"),
           dict(sampler="binary", randomness="window", window=2, score="sum"),
           dict(sampler="exponential", randomness="fixed", key_length=64, score="align", trials=99),
           dict(sampler="exponential", randomness="window", window=1, skip_prob=0.3, score="sum"), None,
           # beyond the paper: per-candidate seeds (SelfHash) and DiPmark's sort and reweighted mass
           dict(sampler="distribution_shift", delta=2.0, randomness="selfhash", window=4, score="sum"),
           dict(sampler="reweight", reweight_alpha=0.3, randomness="window", window=1, score="sum")]


@pytest.mark.heavy
@pytest.mark.parametrize("params", SCHEMES, ids=lambda p: (p or {}).get("sampler", "none"))
def test_compiled_step_chooses_what_the_eager_step_chooses(params):
    """torch.compile (here Inductor's CPU backend; CUDA on a GPU) must not change a token or an entropy beyond
    rounding, across batch sizes (the second size recompiles with a symbolic batch)."""
    spec = SchemeSpec.from_params(params) if params else None
    vocab = 700
    eager = WatermarkStep(spec, KEY, vocab, 0.9, compiled=False)
    compiled = WatermarkStep(spec, KEY, vocab, 0.9, compiled=True, mode="default")
    g = torch.Generator().manual_seed(1)
    for batch in (8, 13):
        state = row_state(spec, list(range(batch)))
        scores = torch.randn(batch, vocab + 5, generator=g) * 3
        context = torch.randint(0, vocab, (batch, eager.context_len), generator=g)
        steps = torch.randint(0, 50, (batch,), generator=g)
        a = eager(scores, context, steps, **state)
        b = compiled(scores, context, steps, **state)
        assert compiled.is_compiled, compiled.compile_error
        assert torch.equal(a[0], b[0])
        torch.testing.assert_close(a[1], b[1], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a[2], b[2], rtol=1e-12, atol=1e-12)
