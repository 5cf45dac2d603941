"""The anytime size (mixture e-process over the sum scores' unit pivots): by hand, the martingale property, its
any-prefix false-positive rate on exact-null and real text, its power, bad input, and the numba twins against the
numpy reference (CPU here; CUDA through the simulator in a subprocess, as ``tests/test_kernels.py``)."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import integrate

from mmw.calibration import binomial_band, generate_synthetic, null_sequences, uniform_subset_model
from mmw.watermark.detector import Detector
from mmw.errors import SpecError
from mmw.watermark.prf import key_from_string
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import ANYTIME_GRID, anytime_bets, anytime_log_evalues, anytime_size, anytime_threshold

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
TWIN = "cuda" if SIMULATOR else "cpu"
KEY = key_from_string("anytime-test-key")
ALPHA = 0.02
VOCAB = 1000
SUM_SCHEMES = {
    "shift-w1": dict(sampler="distribution_shift", delta=2.0, gamma=0.25, randomness="window", window=1),
    "exp-w3": dict(sampler="exponential", randomness="window", window=3),
    "inverse-w1": dict(sampler="inverse_transform", randomness="window", window=1),
    "binary-minhash3": dict(sampler="binary", randomness="minhash", window=3),
}


def sum_spec(name: str, alpha: float = ALPHA) -> SchemeSpec:
    return SchemeSpec.from_params({**SUM_SCHEMES[name], "score": "sum", "alpha": alpha})


def null_units(spec: SchemeSpec, rng: np.random.Generator, n: int, units: int) -> tuple[np.ndarray, np.ndarray]:
    """Running (sum, count) of ``units`` i.i.d. unit statistics drawn from the exact null, n sequences at once:
    -Exp(1) (C1, C2), +Exp(1) (C3), -Bernoulli(gamma) (C4) -> float64 [n, units], int64 [units]."""
    if spec.sampler == "distribution_shift":
        values = -(rng.random((n, units)) < spec.gamma).astype(np.float64)
    else:
        values = rng.exponential(size=(n, units)) * (1.0 if spec.sampler == "binary" else -1.0)
    return np.cumsum(values, axis=1), np.arange(1, units + 1, dtype=np.int64)


# ---------------------------------------------------------------------------------------------- by hand
@pytest.mark.skipif(SIMULATOR, reason="host code")
def test_green_bet_by_hand():
    # gamma = 1/2, one bet rho = 1/2 -> q = 3/4: a green multiplies the e-value by 3/2, a red by 1/2.
    spec = SchemeSpec.from_params({"sampler": "distribution_shift", "delta": 2.0, "gamma": 0.5,
                                   "randomness": "window", "window": 1, "score": "sum"})
    bets = anytime_bets(spec, grid=(0.5,))
    greens = np.array([1, 1, 0, 1] + [1] * 20)
    log_e = anytime_log_evalues(-np.cumsum(greens).astype(float), np.arange(1, 25), bets)
    expected = np.cumsum(np.where(greens == 1, math.log(1.5), math.log(0.5)))
    np.testing.assert_allclose(log_e, expected, rtol=1e-12)
    # 1.5^k * 0.5 >= 50 first at k = 12 greens (1.5^12 / 2 = 64.9; 1.5^11 / 2 = 43.2): prefix 13.
    assert anytime_size(log_e, 0.02) == 13
    assert anytime_size(log_e, 1e-9) is None


@pytest.mark.skipif(SIMULATOR, reason="host code")
def test_exponential_mixture_by_hand():
    # Two bets rho = 0.2, 0.6 on -Exp(1) units (C1): M_n = mean_j (1 - rho_j)^C e^{rho_j X}, X = -S.
    bets = anytime_bets(sum_spec("exp-w3"), grid=(0.2, 0.6))
    total, count = np.array([-3.0, -3.0, -7.5]), np.array([1, 1, 2])
    expected = [math.log(0.5 * (0.8 ** c * math.exp(0.2 * -s) + 0.4 ** c * math.exp(0.6 * -s)))
                for s, c in zip(total, count, strict=True)]
    np.testing.assert_allclose(anytime_log_evalues(total, count, bets), expected, rtol=1e-12)
    # C3 (+Exp(1) units that shrink): rate r = 1 / (1 - rho) = 2.5 for rho = 0.6: factor r^C e^{-(r - 1) S}.
    bets = anytime_bets(sum_spec("binary-minhash3"), grid=(0.6,))
    np.testing.assert_allclose(anytime_log_evalues(np.array([0.1]), np.array([3]), bets),
                               [3 * math.log(2.5) - 1.5 * 0.1], rtol=1e-12)
    # No unit yet: e-value 1.
    assert anytime_log_evalues(np.zeros(3), np.zeros(3, dtype=np.int64), bets).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.skipif(SIMULATOR, reason="host code")
@pytest.mark.parametrize("scheme", list(SUM_SCHEMES))
def test_every_bet_is_a_fair_factor_under_the_null(scheme):
    """E_null[factor of one unit] = 1 for every bet of the grid: the product is a nonnegative martingale."""
    spec = sum_spec(scheme)
    bets = anytime_bets(spec)
    for a, b in zip(bets.a, bets.b, strict=True):
        if spec.sampler == "distribution_shift":  # unit = -1 with probability gamma, else 0
            mean = spec.gamma * math.exp(a - b) + (1 - spec.gamma) * math.exp(a)
        else:
            sign = 1.0 if spec.sampler == "binary" else -1.0  # unit = sign * Exp(1)
            mean = integrate.quad(lambda x, a=a, b=b: math.exp(a + b * sign * x - x), 0, np.inf)[0]
        assert mean == pytest.approx(1.0, rel=1e-9)


# ---------------------------------------------------------------------------------------------- validity
@pytest.mark.skipif(SIMULATOR, reason="statistics, not the twin")
@pytest.mark.parametrize("scheme", list(SUM_SCHEMES))
def test_any_prefix_rate_on_the_exact_null(scheme):
    """5,000 sequences of 500 i.i.d. null units: the share whose e-value ever reaches 1/alpha is <= alpha (within
    the binomial band's upper end; a valid e-process sits well below alpha)."""
    spec = sum_spec(scheme)
    bets = anytime_bets(spec)
    rng = np.random.default_rng(zlib.crc32(scheme.encode()))
    totals, count = null_units(spec, rng, 5000, 500)
    crossed = [anytime_size(anytime_log_evalues(t, count, bets), ALPHA) is not None for t in totals]
    _, high = binomial_band(5000, ALPHA)
    assert np.mean(crossed) <= high, f"{scheme}: any-prefix rate {np.mean(crossed):.4f} > {high:.4f}"


@pytest.mark.skipif(SIMULATOR, reason="statistics, not the twin")
@pytest.mark.parametrize("corpus", ["random", "text"])
@pytest.mark.parametrize("scheme", list(SUM_SCHEMES))
def test_any_prefix_rate_on_unwatermarked_text(scheme, corpus):
    """Through the detector (deduplicated units of real token sequences): any-prefix rate of size_anytime <= alpha,
    while E's first crossing is far above it on the same texts."""
    spec = sum_spec(scheme)
    sequences = null_sequences(corpus, 2000, 200, VOCAB, seed=zlib.crc32(f"any{scheme}{corpus}".encode()))
    results = Detector(spec, KEY, VOCAB).detect(sequences)
    anytime = np.mean([r.size_anytime is not None for r in results])
    first = np.mean([r.size is not None for r in results])
    _, high = binomial_band(2000, ALPHA)
    assert anytime <= high, f"{scheme} on {corpus}: anytime any-prefix rate {anytime:.4f} > {high:.4f}"
    assert first > high


#: Real text the generator did not write, from this machine: licences and C headers (bench/anytime_corpus.py
#: measures the same kinds, and man pages and Python source, through the generator's tokenizer at 3,000 windows).
SYSTEM_TEXT = (("/usr/share/common-licenses", "*"), ("/usr/include", "*.h"))


@functools.lru_cache(maxsize=1)
def system_text_bytes() -> np.ndarray:
    """The system files of SYSTEM_TEXT as one byte sequence (sorted by path; empty where none exist)."""
    files = sorted(p for root, pattern in SYSTEM_TEXT for p in Path(root).glob(pattern) if p.is_file())
    return np.frombuffer(b"\n".join(p.read_bytes() for p in files), dtype=np.uint8).astype(np.int64)


@pytest.mark.skipif(SIMULATOR, reason="statistics, not the twin")
@pytest.mark.parametrize("scheme", list(SUM_SCHEMES))
def test_any_prefix_rate_on_system_text(scheme):
    """Licences and C headers (code and legal text: long verbatim repeats), byte windows relabelled per text:
    any-prefix rate of size_anytime <= alpha through the detector."""
    corpus = system_text_bytes()
    if len(corpus) < 100_000:
        pytest.skip("needs licences under /usr/share/common-licenses and headers under /usr/include (Debian-like)")
    sequences = null_sequences("text", 2000, 200, VOCAB, seed=zlib.crc32(f"system{scheme}".encode()), corpus=corpus)
    results = Detector(sum_spec(scheme), KEY, VOCAB).detect(sequences)
    anytime = np.mean([r.size_anytime is not None for r in results])
    _, high = binomial_band(2000, ALPHA)
    assert anytime <= high, f"{scheme} on system text: anytime any-prefix rate {anytime:.4f} > {high:.4f}"


# ---------------------------------------------------------------------------------------------- power
@pytest.mark.skipif(SIMULATOR, reason="statistics, not the twin")
@pytest.mark.parametrize("scheme", ["shift-w1", "exp-w3"])
def test_anytime_size_detects_watermarked_text(scheme):
    """Entropy log 8 per token, 200 tokens: the anytime size detects (nearly) every text, at a median within 3x of
    E (which is not FPR-controlled) and no later than the checkpoint size's median (which is)."""
    spec = sum_spec(scheme)
    tokens = generate_synthetic(spec, KEY, uniform_subset_model(VOCAB, 8, 48, seed=5), rows=48, length=200,
                                vocab_size=VOCAB)
    results = Detector(spec, KEY, VOCAB).detect(list(tokens))
    sizes = np.array([np.inf if r.size_anytime is None else r.size_anytime for r in results])
    first = np.array([np.inf if r.size is None else r.size for r in results])
    valid = np.array([np.inf if r.size_valid is None else r.size_valid for r in results])
    assert np.mean(np.isfinite(sizes)) >= 0.95
    assert np.all(sizes[np.isfinite(sizes)] >= 1)
    assert np.median(sizes) <= 3 * np.median(first)
    assert np.median(sizes) <= np.median(valid)


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.skipif(SIMULATOR, reason="host code")
@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")])
def test_alpha_outside_the_unit_interval_is_refused(alpha):
    with pytest.raises(SpecError, match=r"scheme\.alpha.*\(0, 1\)"):
        anytime_threshold(alpha)
    with pytest.raises(SpecError, match=r"scheme\.alpha"):
        anytime_size(np.zeros(3), alpha)


@pytest.mark.skipif(SIMULATOR, reason="host code")
@pytest.mark.parametrize("params", [dict(sampler="exponential", randomness="fixed", key_length=16, score="align"),
                                    dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1,
                                         score="edit", psi=0.5)])
def test_scores_without_a_pivot_have_no_anytime_size(params):
    spec = SchemeSpec.from_params({**params, "trials": 99})
    with pytest.raises(SpecError, match=r"scheme\.score.*no per-token pivot"):
        anytime_bets(spec)
    result = Detector(spec, KEY, VOCAB, device="reference").detect([np.arange(30)])[0]
    assert result.size_anytime is None and result.log_evalues is None


@pytest.mark.skipif(SIMULATOR, reason="host code")
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_statistics_are_refused(bad):
    bets = anytime_bets(sum_spec("exp-w3"))
    total = np.array([-1.0, bad, -3.0])
    with pytest.raises(SpecError, match="non-finite unit statistic at token 2"):
        anytime_log_evalues(total, np.array([1, 2, 3]), bets)
    from mmw.kernels.backend import NumbaBackend

    detector = Detector(sum_spec("exp-w3"), KEY, VOCAB, device="cpu")
    assert isinstance(detector.backend, NumbaBackend)
    with pytest.raises(SpecError, match="non-finite"):
        detector.backend.anytime_batch([(np.array([-1.0]), np.array([1])), (total, np.array([1, 2, 3]))],
                                       bets, anytime_threshold(ALPHA))


@pytest.mark.skipif(SIMULATOR, reason="host code")
def test_bad_grid_is_refused():
    with pytest.raises(SpecError, match="anytime grid"):
        anytime_bets(sum_spec("exp-w3"), grid=(0.5, 1.0))


# ---------------------------------------------------------------------------------------------- twins
@pytest.mark.skipif(SIMULATOR, reason="host code")
@pytest.mark.parametrize("scheme", list(SUM_SCHEMES))
def test_detector_twin_and_reference_agree(scheme):
    spec = sum_spec(scheme)
    tokens = list(generate_synthetic(spec, KEY, uniform_subset_model(VOCAB, 4, 6, seed=1), rows=6, length=80,
                                     vocab_size=VOCAB)) + [np.zeros(0, np.int64), np.arange(3)]
    fast = Detector(spec, KEY, VOCAB, device="cpu").detect(tokens)
    slow = Detector(spec, KEY, VOCAB, device="reference").detect(tokens)
    assert [r.size_anytime for r in fast] == [r.size_anytime for r in slow]
    assert any(r.size_anytime is not None for r in fast)
    for f, s in zip(fast, slow, strict=True):
        np.testing.assert_allclose(f.log_evalues, s.log_evalues, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------- tables, metrics
@pytest.mark.skipif(SIMULATOR, reason="host code")
def test_detection_rows_and_metrics_carry_the_anytime_size():
    from mmw.reporting.run import anytime_metrics
    from mmw.stages.detect import DETECTION_SCHEMA, detection_rows

    spec = sum_spec("exp-w3")
    tokens = list(generate_synthetic(spec, KEY, uniform_subset_model(VOCAB, 16, 4, seed=2), rows=4, length=60,
                                     vocab_size=VOCAB))
    results = Detector(spec, KEY, VOCAB).detect(tokens + [np.zeros(0, np.int64)])
    texts = pl.DataFrame({"prompt_id": [str(i) for i in range(5)], "task": ["t"] * 5})
    rows = detection_rows(texts, "watermarked", results)
    assert DETECTION_SCHEMA["size_anytime"] == pl.Int64
    assert rows["size_anytime"].to_list() == [r.size_anytime for r in results]
    assert rows["size_anytime"][4] is None and rows["size_anytime"].null_count() == 1
    baseline = rows.with_columns(pl.Series("size_anytime", [None, None, None, 7, None], dtype=pl.Int64))
    m = anytime_metrics(rows, baseline, anytime=True)
    assert m["size_anytime_undetected_share"] == pytest.approx(0.2)
    assert m["size_anytime"] == float(np.median([r.size_anytime for r in results[:4]] + [np.inf]))
    assert m["fpr_any_prefix_anytime"] == pytest.approx(0.2)
    assert anytime_metrics(rows, baseline, anytime=False) == {
        "size_anytime": None, "size_anytime_undetected_share": None, "fpr_any_prefix_anytime": None}
