"""The shared watermark step: the C3 walk against a tree walk from first principles, compiled == eager, and the
CUDA softmax kernels (in numba's simulator) == torch's law and entropies."""

from __future__ import annotations

import os
import subprocess
import sys

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


SIMULATED_LAW = """
import numpy as np, torch
from mmw.kernels import softmax as kernels
from mmw.watermark import processor
from mmw.watermark.processor import WatermarkStep, entropies, row_state
from mmw.watermark.samplers.base import probabilities
from mmw.watermark.scheme import SchemeSpec
kernels.THREADS = 8  # the simulator runs a thread a Python thread
gen = torch.Generator().manual_seed(3)
rows, vocab = 6, 300
# flat to peaked laws; a masked tail and a masked token; a row whose maximum comes late in every segment
logits = torch.randn(rows, vocab + 9, generator=gen) * torch.tensor([[1.0], [3.0], [8.0], [30.0], [3.0], [2.0]])
logits[4, 250:] = -float("inf")
logits[4, 10] = -float("inf")
logits[5] = torch.linspace(-20.0, 5.0, vocab + 9)
logits = logits[:, :vocab].contiguous()  # the simulator copies contiguous arrays only
shannon, spike_ref = entropies(logits)
for temperature in (1.0, 0.7):
    for parts in (1, 3):
        partial, row_stats = np.zeros((rows, parts, kernels.FIELDS)), np.zeros((rows, kernels.FIELDS))
        probs, entropy, spike = np.zeros((rows, vocab)), np.zeros(rows), np.zeros((rows, parts))
        kernels.launch_law(logits.numpy(), temperature, partial, row_stats, probs, entropy, spike)
        np.testing.assert_allclose(probs, probabilities(logits, temperature).numpy(), rtol=1e-13, atol=0)
        assert (probs[4, 250:] == 0).all() and probs[4, 10] == 0
        np.testing.assert_allclose(entropy, shannon.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(spike.sum(1), spike_ref.numpy(), rtol=1e-12)


def simulated_law(logits, temperature):  # the custom op's body, on host arrays in the simulator
    rows, parts = logits.shape[0], 3
    probs = np.zeros(logits.shape)
    entropy, spike = np.zeros(rows), np.zeros((rows, parts))
    kernels.launch_law(logits.contiguous().numpy(), temperature, np.zeros((rows, parts, kernels.FIELDS)),
                       np.zeros((rows, kernels.FIELDS)), probs, entropy, spike)
    return torch.from_numpy(probs), torch.stack([torch.from_numpy(entropy), torch.from_numpy(spike.sum(1))])


processor.softmax_law = simulated_law
schemes = [None, dict(sampler="tournament", layers=12, randomness="window", window=1, score="sum"),
           dict(sampler="exponential", randomness="window", window=1, skip_prob=0.3, score="sum"),
           dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1, score="sum")]
for params in schemes:
    spec = SchemeSpec.from_params(params) if params else None
    steps = []
    for fused in (False, True):
        step = WatermarkStep(spec, 5, vocab, 0.8, compiled=False)
        step._prepare(torch.device("cpu"))
        step._fused_softmax = fused
        steps.append(step)
    state = row_state(spec, list(range(rows)))
    context = torch.randint(0, vocab, (rows, steps[0].context_len), generator=gen)
    at = torch.randint(1, 50, (rows,), generator=gen)
    histories = [step.new_history(rows, "cpu") for step in steps]
    if histories[0] is not None:  # half the rows' seeds already seen: drawn plainly from the same law
        seeds = steps[0].seeds(context, at, state["shift"])
        for history in histories:
            history[: rows // 2, 0] = seeds[: rows // 2]
    for _ in range(2):
        torch_side, fused_side = (step(logits, context, at.clone(), **state, history=h)
                                  for step, h in zip(steps, histories))
        assert torch.equal(torch_side[0], fused_side[0]), (params, torch_side[0], fused_side[0])
        torch.testing.assert_close(torch_side[1], fused_side[1], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(torch_side[2], fused_side[2], rtol=1e-12, atol=1e-14)
        at += 1
print("ok")
"""


def test_cuda_softmax_equals_torchs_law_and_entropies_in_the_simulator():
    """The step's CUDA law and entropies (``mmw.kernels.softmax``, two passes, an online softmax over segments),
    run by numba's CUDA simulator with one and several segments a row, at T = 1 and 0.7, on flat to peaked logits
    with masked tokens: the law equals torch's float64 softmax to 1e-13 (relative), the entropies to 1e-12; and a
    step fed by them (plain, the tournament with repeated contexts, a sampler with skipped tokens, and one that
    draws from other logits and keeps torch's code) chooses the tokens and records the entropies the step with
    torch's code does."""
    pytest.importorskip("numba")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
    result = subprocess.run([sys.executable, "-c", SIMULATED_LAW], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr
