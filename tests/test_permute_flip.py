"""Permute-and-flip (PF) decoding with keyed noise: its sampling law, its exact null, held-out FPR and power.

The generic checks (FPR on every randomness source and corpus, twin agreement, power on every accepted
combination, determinism) run it through the shared grids of test_statistics.py, test_kernels.py and
test_power.py; this file holds what is PF's own.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from scipy import stats

from mmw.calibration import binomial_band, false_positive_rate, generate_synthetic, null_sequences
from mmw.errors import SpecError
from mmw.watermark import prf
from mmw.watermark.detector import Detector
from mmw.watermark.prf import key_from_string
from mmw.watermark.samplers import build_sampler
from mmw.watermark.samplers.permute_flip import pf_law
from mmw.watermark.scheme import SchemeSpec

KEY = key_from_string("permute-and-flip tests")
ALPHA = 0.02
VOCAB = 1000
SMALL = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def spec_of(**extra) -> SchemeSpec:
    return SchemeSpec.from_params({"sampler": "permute_flip", "randomness": "window", "window": 1, "score": "sum",
                                   "alpha": ALPHA, **extra})


def permute_and_flip_by_simulation(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """The mechanism as McKenna & Sheldon state it: visit the tokens in a uniformly random order and stop at token
    i with probability p_i / max p. Written independently of the sampler (and of ``pf_law``)."""
    q = probs / probs.max()
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        while True:  # the argmax always accepts, so one pass suffices; the loop is the textbook form
            order = rng.permutation(len(q))
            hits = order[rng.random(len(q)) < q[order]]
            if len(hits):
                out[k] = hits[0]
                break
    return out


# ---------------------------------------------------------------------------------------------- the PF law
def test_pf_law_hand_computed():
    """P(i) = q_i int_0^1 prod_{j != i} (1 - q_j t) dt. Two equal tokens: 1/2 each. p = (2/3, 1/3), q = (1, 1/2):
    P(0) = int (1 - t/2) = 3/4, P(1) = 1/2 int (1 - t) = 1/4 (softmax would give 2/3, 1/3). Three tokens q = (1, 1/2,
    1/2): P(1) = 1/2 int (1 - t)(1 - t/2) dt = 1/2 (1 - 3/4 + 1/6) = 5/24, P(0) = int (1 - t/2)^2 = 7/12."""
    np.testing.assert_allclose(pf_law(np.array([0.5, 0.5])), [0.5, 0.5], rtol=1e-14)
    np.testing.assert_allclose(pf_law(np.array([2 / 3, 1 / 3])), [0.75, 0.25], rtol=1e-14)
    np.testing.assert_allclose(pf_law(np.array([0.5, 0.25, 0.25])), [7 / 12, 5 / 24, 5 / 24], rtol=1e-14)
    np.testing.assert_allclose(pf_law(np.array([0.0, 1.0, 0.0])), [0.0, 1.0, 0.0])


def test_pf_law_is_the_permute_and_flip_mechanism():
    """The closed form against the textbook mechanism, simulated (chi-square, 40,000 draws)."""
    n = 40_000
    draws = permute_and_flip_by_simulation(SMALL, n, np.random.default_rng(0))
    assert stats.chisquare(np.bincount(draws, minlength=len(SMALL)), pf_law(SMALL) * n).pvalue > 1e-3


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_keyed_pf_samples_the_pf_law_not_the_softmax(temperature):
    """Over random seeds the watermarked choice follows PF's law at this temperature exactly (chi-square, 60,000
    draws) — and not the softmax: PF favours the likelier tokens, which the same test must see (its power)."""
    n, v = 60_000, len(SMALL)
    logits = torch.log(torch.from_numpy(SMALL))
    rng = np.random.default_rng(11)
    seeds = torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=n, dtype=np.int64))
    tokens = build_sampler(spec_of(), KEY, v).choose(logits.expand(n, v), seeds, temperature,
                                                     torch.from_numpy(rng.random(n))).numpy()
    observed = np.bincount(tokens, minlength=v)
    softmax = torch.softmax(logits / temperature, -1).numpy()
    assert stats.chisquare(observed, pf_law(softmax) * n).pvalue > 1e-3, (observed, pf_law(softmax) * n)
    assert stats.chisquare(observed, softmax * n).pvalue < 1e-6


def test_masked_rows_draw_the_unwatermarked_pf_decoder():
    """Repeated contexts (``mask_repeated``): one fixed seed for every row, so the keyed choice is one token; the
    masked rows' noise comes from each row's plain uniform instead and follows PF's law."""
    n, v = 40_000, len(SMALL)
    logits = torch.log(torch.from_numpy(SMALL)).expand(n, v)
    sampler = build_sampler(spec_of(mask_repeated=True), KEY, v)
    seeds = torch.full((n,), 12345, dtype=torch.int64)
    plain_u = prf.unit_t(prf.prf_t(torch.arange(n), 99))
    keyed = sampler.choose_or_plain(logits, seeds, 1.0, plain_u, torch.zeros(n, dtype=torch.bool))
    assert len(torch.unique(keyed)) == 1
    masked = sampler.choose_or_plain(logits, seeds, 1.0, plain_u, torch.ones(n, dtype=torch.bool)).numpy()
    assert stats.chisquare(np.bincount(masked, minlength=v), pf_law(SMALL) * n).pvalue > 1e-3


def test_choice_is_the_argmax_of_p_over_r_read_off_the_prf():
    """y = argmax_i p_i / r_i with r_i = unit(prf(seed, i)) computed from the PRF's Python-int spec."""
    v = 40
    logits = torch.randn(16, v, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    seeds = np.random.default_rng(4).integers(0, 2**62, size=16)
    chosen = build_sampler(spec_of(), KEY, v).choose(logits, torch.from_numpy(seeds), 0.7,
                                                     torch.full((16,), 0.5)).numpy()
    probs = torch.softmax(logits / 0.7, -1).numpy()
    r = np.array([[prf.unit_int(prf.prf_int(int(s), t)) for t in range(v)] for s in seeds])
    np.testing.assert_array_equal(chosen, (probs / r).argmax(axis=1))
    assert (chosen != probs.argmax(axis=1)).sum() >= 3  # the noise matters on this batch


def test_skip_prob_is_refused():
    with pytest.raises(SpecError, match=r"^scheme\.skip_prob: not used by the permute-and-flip sampler"):
        spec_of(skip_prob=0.2)


# ---------------------------------------------------------------------------------------------- the exact null
def test_statistic_and_pvalue_hand_computed():
    """Window 0 (one seed prf(k, WINDOW) for every token), distinct tokens: the score is sum_t log r_t with r read
    off the PRF spec, and p = P(Gamma(n, 1) >= -S) = e^S sum_{k<n} (-S)^k / k! (Erlang upper tail, by hand)."""
    spec = spec_of(window=0)
    seed = prf.prf_int(KEY, prf.WINDOW)
    text = np.array([5, 17, 3, 99, 250, 7])
    logs = [math.log(prf.unit_int(prf.prf_int(seed, int(t)))) for t in text]
    for device in ("reference", "cpu"):
        res = Detector(spec, KEY, VOCAB, device=device).detect([text])[0]
        total = np.cumsum(logs)
        want = [math.exp(s) * sum((-s) ** k / math.factorial(k) for k in range(n)) for n, s in
                zip(range(1, len(text) + 1), total)]
        np.testing.assert_allclose(res.pvalues, want, rtol=1e-10)
        assert res.n_scored == len(text)


@pytest.mark.parametrize("corpus,length", [("text", 200), ("text", 32), ("random", 200), ("repetitive", 200)])
def test_held_out_false_positive_rate_is_nominal(corpus, length):
    """FPR on 2,000 unwatermarked sequences (``text``: windows of real English the sampler never saw) is within the
    99 % binomial band around alpha: not above it (the null is valid) and, where every unit is distinct (random
    tokens), not below it either (the null is exact, not conservative). One key per text: the verdicts are then
    independent (under one key, texts sharing a (context, token) pair share its draw) and the band is exact."""
    seqs = null_sequences(corpus, 2000, length, VOCAB, seed=zlib.crc32(f"pf{corpus}{length}".encode()))
    rate = false_positive_rate(spec_of(), KEY, seqs, VOCAB, device="reference", key_per_text=True)
    assert rate <= binomial_band(2000, ALPHA)[1], rate
    if corpus == "random":
        assert rate >= binomial_band(2000, ALPHA, level=0.999)[0], rate


# ---------------------------------------------------------------------------------------------- power
def zipf_model(vocab_size: int, rows: int, seed: int, exponent: float = 1.1):
    """A synthetic LM whose steps are Zipf laws (p_k ~ k^-exponent) over a fresh random order of the vocabulary:
    unlike a uniform-subset model, the temperature changes its entropy. Returns ``logits(step)``."""
    base = -exponent * torch.log(torch.arange(1, vocab_size + 1, dtype=torch.float32))

    def logits(step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        order = torch.argsort(torch.rand(rows, vocab_size, generator=g), dim=-1)
        return torch.empty(rows, vocab_size).scatter_(1, order, base.expand(rows, -1))
    return logits


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_power_at_moderate_length_with_its_key_only(temperature):
    """Watermarked text of 100 tokens from a Zipf model is detected (>= 90 %) at T = 0.7 and 1; the same texts
    under another key are not (at most the binomial band of alpha)."""
    rows = 32
    spec = spec_of(window=2)
    toks = list(generate_synthetic(spec, KEY, zipf_model(VOCAB, rows, seed=7), rows=rows, length=100,
                                   vocab_size=VOCAB, temperature=temperature))
    detected = np.mean([r.detected for r in Detector(spec, KEY, VOCAB).detect(toks)])
    assert detected >= 0.9, detected
    other = Detector(spec, key_from_string("another key"), VOCAB).detect(toks)
    assert np.mean([r.detected for r in other]) <= binomial_band(rows, ALPHA, level=0.999)[1]
