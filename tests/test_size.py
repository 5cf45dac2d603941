"""The valid size: checkpoint grid by hand, its any-prefix false-positive rate on null text, its power."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from scipy import stats

from mmw.calibration import binomial_band, generate_synthetic, null_sequences, uniform_subset_model
from mmw.watermark.detector import Detector
from mmw.watermark.prf import key_from_string, prf_int
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import checkpoint_grid, first_crossing, valid_size

from _t3_sequential import (FINAL, LOOKS, N_MAX, NOMINAL, boundaries, operating_characteristic,
                            sequential_false_alarms)

KEY = key_from_string("size-test-key")
ALPHA = 0.02
N_SEQUENCES = 2000
VOCAB = 1000


# ---------------------------------------------------------------------------------------------- by hand
@pytest.mark.parametrize("n_tokens,grid", [(0, []), (1, [1]), (16, [16]), (17, [16, 17]), (32, [16, 32]),
                                           (200, [16, 32, 64, 128, 200]), (256, [16, 32, 64, 128, 256])])
def test_grid_doubles_from_16_and_ends_at_the_text(n_tokens, grid):
    assert checkpoint_grid(n_tokens, ALPHA).tolist() == grid


@pytest.mark.parametrize("trials,grid", [(99, [128, 200]), (149, [64, 128, 200]), (249, [16, 32, 64, 128, 200]),
                                         (49, [200]), (10_000, [16, 32, 64, 128, 200])])
def test_permutation_grid_keeps_only_reachable_levels(trials, grid):
    # alpha / m must be >= 1 / (T + 1): m <= floor(0.02 (T + 1)) = 2, 3, 5, 1 for T = 99, 149, 249, 49.
    assert checkpoint_grid(200, ALPHA, trials).tolist() == grid


def green_pvalues(greens: list[int]) -> np.ndarray:
    """Per-prefix p-values of a C4 text with gamma = 1/2 from its green flags: P(Binomial(n, 1/2) >= greens so far),
    written out as a sum of binomial coefficients (math.comb) rather than through the library."""
    from math import comb

    out, k = [], 0
    for n, green in enumerate(greens, start=1):
        k += green
        out.append(sum(comb(n, j) for j in range(k, n + 1)) / 2**n)
    return np.array(out)


def test_first_crossing_by_hand():
    # All green: p(n) = 2^-n. At alpha = 0.05: p(4) = 1/16 = 0.0625 > 0.05, p(5) = 1/32 <= 0.05 -> E = 5.
    assert first_crossing(green_pvalues([1] * 8), 0.05) == 5
    # One red first, then greens: n - 1 greens among n, p(n) = (n + 1) / 2^n: p(7) = 8/128 = 0.0625,
    # p(8) = 9/256 = 0.035 -> E = 8.
    assert first_crossing(green_pvalues([0] + [1] * 9), 0.05) == 8
    assert first_crossing(green_pvalues([0, 1, 0, 1]), 0.05) is None
    assert first_crossing(np.array([]), 0.05) is None


def test_valid_size_by_hand():
    # 40 tokens: grid 16, 32, 40; alpha = 0.03 -> level 0.01 per checkpoint.
    p = np.ones(40)
    p[15] = 0.011  # prefix 16: just above 0.01
    p[16] = 0.0  # prefix 17: not a checkpoint (reading p[grid] instead of p[grid - 1] would stop here)
    p[31] = 0.01  # prefix 32: exactly the level
    assert valid_size(p, 0.03) == 32
    assert first_crossing(p, 0.03) == 16  # the paper's E takes the first prefix at 0.03
    p[31] = 0.0101
    assert valid_size(p, 0.03) is None  # 40: p = 1
    p[39] = 0.0099
    assert valid_size(p, 0.03) == 40
    # Permutation p-values with 99 trials at alpha = 0.02: grid {128, 200}, level 1/100 = the smallest p-value.
    q = np.full(200, 2 / 100)
    q[127] = 1 / 100
    assert valid_size(q, ALPHA, trials=99) == 128
    q[127] = 2 / 100
    assert valid_size(q, ALPHA, trials=99) is None


def test_valid_size_all_green_text_by_hand():
    # All 40 tokens green at gamma = 1/2, alpha = 0.02, grid 16, 32, 40 -> level 0.02 / 3: p(16) = 2^-16 passes.
    assert valid_size(green_pvalues([1] * 40), ALPHA) == 16
    # Greens only from token 17 on: p(16) = 1, p(32) = P(Bin(32, 1/2) >= 16) ~ 0.57, p(40) = P(Bin(40,1/2) >= 24)
    # ~ 0.13: no checkpoint passes, while E finds no prefix either (p never reaches 0.02).
    greens = [0] * 16 + [1] * 24
    assert valid_size(green_pvalues(greens), ALPHA) is None
    assert green_pvalues(greens)[39] == pytest.approx(stats.binom.sf(23, 40, 0.5))


# ---------------------------------------------------------------------------------------------- null texts
SUM_SCHEMES = {
    "shift-w1": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1),
    "exp-w3": dict(sampler="exponential", randomness="window", window=3),
    "inverse-w1": dict(sampler="inverse_transform", randomness="window", window=1),
    "binary-minhash3": dict(sampler="binary", randomness="minhash", window=3),
}


def any_prefix_rates(spec: SchemeSpec, sequences: list[np.ndarray], key_per_text: bool,
                     key: int = KEY) -> tuple[float, float]:
    """(share of texts with some prefix at p <= alpha, share with a valid size) on unwatermarked sequences."""
    if key_per_text:  # randomness shared across texts: one key per text keeps the verdicts independent
        results = [Detector(spec, prf_int(key, i), VOCAB).detect([s])[0] for i, s in enumerate(sequences)]
    else:
        results = Detector(spec, key, VOCAB).detect(sequences)
    return (float(np.mean([r.size is not None for r in results])),
            float(np.mean([r.size_valid is not None for r in results])))


@pytest.mark.parametrize("corpus", ["random", "text"])
@pytest.mark.parametrize("scheme", list(SUM_SCHEMES))
def test_valid_size_controls_the_any_prefix_rate_sum_scores(scheme, corpus):
    spec = SchemeSpec.from_params({**SUM_SCHEMES[scheme], "score": "sum", "alpha": ALPHA})
    sequences = null_sequences(corpus, N_SEQUENCES, 200, VOCAB, seed=zlib.crc32(f"{scheme}{corpus}".encode()))
    first, valid = any_prefix_rates(spec, sequences, key_per_text=False)
    _, high = binomial_band(N_SEQUENCES, ALPHA)
    assert valid <= high, f"{scheme} on {corpus}: valid size's any-prefix FPR {valid:.4f} > {high:.4f}"
    # The defect the valid size fixes: the first crossing over 200 prefixes flags far more than alpha.
    assert first > high, f"{scheme} on {corpus}: first-crossing any-prefix rate {first:.4f} within the band"


@pytest.mark.heavy  # ~25 s on 2 cores: ~1,000 texts x 150 keys of align (one detector per text) and edit
@pytest.mark.parametrize("score,extra", [("align", {"randomness": "fixed", "key_length": 16}),
                                         ("edit", {"randomness": "window", "window": 1, "psi": 0.5})])
def test_valid_size_controls_the_any_prefix_rate_permutation_scores(score, extra):
    """The valid size's any-prefix rate is held to the bar of 2,000 texts and the 99% band (at most 0.4% chance
    of failing a correct detector, at least 99.6% of failing a doubled rate), read 250 texts at a time by the
    sequential check of tests/_t3_sequential.py (~1,000 texts on average instead of 2,000). The first crossing,
    on the same texts, must lie above the band of as many texts."""
    # 64 tokens, grid 16, 32, 64 at level alpha / 3: 149 trials make 1 / 150 <= 0.02 / 3 reachable.
    spec = SchemeSpec.from_params({"sampler": "exponential", "score": score, "trials": 149, "alpha": ALPHA,
                                   **extra})
    sequences = null_sequences("text", N_MAX, 64, VOCAB, seed=zlib.crc32(score.encode()))
    per_text = spec.randomness == "fixed"
    first_alarms = []

    def valid_alarms(start: int, stop: int) -> int:
        # one key per text (where needed) distinct over the run: prf(prf(KEY, start), i)
        first, valid = any_prefix_rates(spec, sequences[start:stop], per_text, prf_int(KEY, start) if per_text else KEY)
        first_alarms.append(round(first * (stop - start)))
        return round(valid * (stop - start))

    passed, alarms, read = sequential_false_alarms(valid_alarms)
    assert passed, f"{score}: valid size's any-prefix FPR: {alarms} of {read} texts at alpha {ALPHA}"
    _, high = binomial_band(read, ALPHA)
    first = sum(first_alarms) / read
    assert first > high, f"{score}: first-crossing any-prefix rate {first:.4f} within the band of {read} texts"


def test_sequential_fpr_check_is_as_strict_as_the_fixed_2000_text_test():
    """The sequential check fails a correct detector no more often, and a doubled false-positive rate no less
    often, than the fixed test on 2,000 texts with the 99% band's upper end; and it reads half the texts."""
    limit = round(binomial_band(N_SEQUENCES, ALPHA)[1] * N_SEQUENCES)
    fixed_false_alarm = stats.binom.sf(limit, N_SEQUENCES, ALPHA)
    fixed_power = stats.binom.sf(limit, N_SEQUENCES, 2 * ALPHA)
    assert (limit, round(fixed_false_alarm, 4), round(fixed_power, 4)) == (57, 0.004, 0.9963)
    assert NOMINAL == ALPHA
    false_alarm, read_at_alpha = operating_characteristic(ALPHA)
    power, _ = operating_characteristic(2 * ALPHA)
    assert false_alarm <= fixed_false_alarm and power >= fixed_power, (false_alarm, power)
    assert read_at_alpha < 0.5 * N_SEQUENCES, read_at_alpha
    # The run itself: a count below the pass line stops at the first look where that line reaches it, one above
    # the fail line at once; exactly 2% of every slice passes; the last look decides.
    passes, fails = boundaries()
    assert all(low < high for low, high in zip(passes[:-1], fails[:-1])) and passes[-1] == fails[-1] == FINAL
    first_pass = LOOKS[next(k for k, low in enumerate(passes) if low >= 0)]
    assert sequential_false_alarms(lambda start, stop: 0) == (True, 0, first_pass)
    assert sequential_false_alarms(lambda start, stop: stop - start)[0] is False
    assert sequential_false_alarms(lambda start, stop: stop // 50 - start // 50)[0] is True


# ---------------------------------------------------------------------------------------------- power
def test_valid_size_keeps_most_of_the_power():
    """On watermarked synthetic text (entropy log 8 per token) the valid size detects about as often as E and is
    at most one checkpoint later: the price of a controlled FPR is a coarser, later size, not lost detections."""
    spec = SchemeSpec.from_params({"sampler": "exponential", "randomness": "window", "window": 1, "score": "sum",
                                   "alpha": ALPHA})
    logits = uniform_subset_model(VOCAB, support=8, rows=64, seed=7)
    tokens = generate_synthetic(spec, KEY, logits, rows=64, length=200, vocab_size=VOCAB)
    results = Detector(spec, KEY, VOCAB).detect(list(tokens))
    first = np.array([r.size if r.size is not None else np.inf for r in results], dtype=float)
    valid = np.array([r.size_valid if r.size_valid is not None else np.inf for r in results], dtype=float)
    assert np.mean(np.isfinite(valid)) >= 0.95
    assert np.all(valid >= first)  # a checkpoint at p <= alpha / m is also a prefix at p <= alpha
    grid = checkpoint_grid(200, ALPHA)
    # At most one checkpoint later than the first checkpoint at or after E.
    ceiling = np.searchsorted(grid, first[np.isfinite(first)])
    assert np.all(np.searchsorted(grid, valid[np.isfinite(first)]) <= np.minimum(ceiling + 1, len(grid)))
