"""The paper's orderings checked on confirmed cells (mmw.sweep.claims): the size-gap interval is calibrated
(equal cells are called different at most at the stated level) and has power, the verdict follows the
comparisons' outcomes and the cells' statuses, "undetected" rests on a calibrated bound on the detected share, and
every pair of columns with a confirmed side is judged (a confirmed cell beats one that is confidently out)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from mmw.sweep.claims import (
    CONTRADICTED,
    PAIRWISE,
    PAPER,
    SUPPORTED,
    UNRESOLVED,
    UNTESTABLE,
    bound_undetected,
    check_claims,
    detection_upper_bound,
    size_gap,
    verdict,
    weighted_lower_median,
)
from mmw.sweep.confirm import CONFIRMED, NO_FEASIBLE, NOT_CONFIRMED, PENDING
from mmw.sweep.confirm import UNRESOLVED as CELL_UNRESOLVED

N_PROMPTS, K = 48, 5


def _cell(rng: np.random.Generator, prompt_effect: np.ndarray, scale: float, undetected: float) -> np.ndarray:
    """Sizes of K runs x N prompts: a shared per-prompt effect (low-entropy prompts need more tokens for every
    scheme) times log-normal noise, rounded to tokens; a share undetected (+inf)."""
    sizes = np.ceil(scale * prompt_effect[None, :] * rng.lognormal(0.0, 0.6, (K, N_PROMPTS)))
    return np.where(rng.random((K, N_PROMPTS)) < undetected, np.inf, sizes).ravel()


def _significant(scale_b: float, sims: int, level: float = 0.05) -> tuple[int, int]:
    """How often (A smaller, A larger) is declared over ``sims`` paired cells, A at scale 10, B at ``scale_b``."""
    rng = np.random.default_rng(7)
    prompt_of = np.tile(np.arange(N_PROMPTS), K)
    smaller = larger = 0
    for sim in range(sims):
        effect = rng.lognormal(0.0, 0.5, N_PROMPTS)
        a, b = _cell(rng, effect, 10.0, 0.1), _cell(rng, effect, scale_b, 0.1)
        _, _, low, high = size_gap(a, prompt_of, b, prompt_of, N_PROMPTS, level, 1000, sim)
        smaller += high < 0
        larger += low > 0
    return smaller, larger


def test_equal_cells_are_called_different_at_most_at_the_level() -> None:
    sims, level = 400, 0.05
    smaller, larger = _significant(10.0, sims, level)
    # one-sided binomial test against the nominal level: fails when the interval is anti-conservative
    assert binomtest(smaller + larger, sims, level, alternative="greater").pvalue > 0.001, (smaller, larger)


def test_a_halved_size_is_found() -> None:
    smaller, larger = _significant(20.0, 100)
    assert larger == 0 and smaller >= 80, (smaller, larger)


def test_weighted_lower_median_matches_the_repeated_sample() -> None:
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.integers(1, 50, 30).astype(float), [np.inf] * 5])
    weights = rng.integers(0, 4, (values.size, 6)).astype(float)
    got = weighted_lower_median(values, weights)
    for column in range(weights.shape[1]):
        repeated = np.sort(np.repeat(values, weights[:, column].astype(int)))
        assert got[column] == repeated[(repeated.size - 1) // 2]


@pytest.mark.parametrize(("outcomes", "expected"), [
    (["A", "A"], SUPPORTED), (["A", "tie"], UNRESOLVED), (["A", "B"], CONTRADICTED), (["none", "none"], UNTESTABLE),
    (["A", "unknown"], UNRESOLVED), (["none", "A"], UNRESOLVED), (["tie", "B"], CONTRADICTED)])
def test_verdict(outcomes: list[str], expected: str) -> None:
    assert verdict(outcomes) == expected


def _tables(statuses: dict[str, str], sizes: dict[str, float]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A one-temperature (T = 0.7) paper's table and the per-prompt rows of its confirmed cells."""
    rows, texts = [], []
    for family, status in statuses.items():
        cid = f"cfg-{family}"
        rows.append({"temperature": 0.7, "family": family, "max_quality_loss": 0.1, "min_tamper_resistance": 0.0,
                     "status": status, "config_id": cid, "size_kind": "all.size_valid"})
        if status == CONFIRMED:
            for run in range(K):
                for p in range(N_PROMPTS):
                    texts.append({"config_id": cid, "role": "confirmation", "source": "watermarked",
                                  "prompt_id": f"p{p}", "size_valid": sizes[family] + (p + run) % 3})
    return pl.DataFrame(rows), pl.DataFrame(texts)


def _paper(claims: pl.DataFrame) -> pl.DataFrame:
    return claims.filter(pl.col("scope") == PAPER)


def test_claims_follow_the_confirmed_cells() -> None:
    empty = pl.DataFrame()
    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": CONFIRMED, "binary": NOT_CONFIRMED,
                            "inverse_transform": NO_FEASIBLE},
                           {"distribution_shift": 8.0, "exponential": 20.0})
    row = _paper(check_claims(table, empty, texts, resamples=500)).row(0, named=True)
    assert row["verdict"] == SUPPORTED and row["median_smaller"] < row["median_than"] and row["gap_high"] < 0
    assert "vs binary: smaller" in row["comparisons"]

    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": CONFIRMED},
                           {"distribution_shift": 20.0, "exponential": 8.0})
    assert _paper(check_claims(table, empty, texts, resamples=500))["verdict"].to_list() == [CONTRADICTED]

    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": PENDING}, {"distribution_shift": 8.0})
    assert _paper(check_claims(table, empty, texts, resamples=500))["verdict"].to_list() == [UNRESOLVED]

    table, texts = _tables({"distribution_shift": NOT_CONFIRMED, "exponential": NO_FEASIBLE}, {})
    assert _paper(check_claims(table, empty, texts, resamples=500))["verdict"].to_list() == [UNTESTABLE]

    table, texts = _tables({"distribution_shift": NOT_CONFIRMED, "exponential": CONFIRMED}, {"exponential": 9.0})
    assert _paper(check_claims(table, empty, texts, resamples=500))["verdict"].to_list() == [CONTRADICTED]


def test_randomness_claim_reads_the_randomness_table() -> None:
    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": CONFIRMED},
                           {"distribution_shift": 6.0, "exponential": 30.0})
    randomness = (table.rename({"family": "randomness_kind"})
                  .with_columns(pl.col("randomness_kind").replace({"distribution_shift": "text-dependent",
                                                                   "exponential": "fixed"}))
                  .drop("max_quality_loss", "min_tamper_resistance"))
    texts = texts.with_columns(pl.col("config_id"))
    rows = _paper(check_claims(pl.DataFrame(), randomness, texts, resamples=500))
    assert rows["claim"].to_list() == ["text-dependent randomness smaller than fixed"]
    assert rows["verdict"].to_list() == [SUPPORTED] and rows["max_quality_loss"].to_list() == [0.1]


# -- "undetected" rests on a bound -----------------------------------------------------------------------------

def _shares(rng: np.random.Generator, mean: float, sims: int) -> np.ndarray:
    """Per-prompt detected shares of K texts, ``(sims, N_PROMPTS)``: prompts differ (a prompt's own detection
    probability is Beta-spread around ``mean``), and a prompt's K texts share it (they are not independent)."""
    p = rng.beta(2 * mean / (1 - mean), 2.0, (sims, N_PROMPTS)) if mean < 1 else np.ones((sims, N_PROMPTS))
    return rng.binomial(K, p) / K


def test_detection_bound_is_calibrated_at_the_median_share() -> None:
    """At a true detected share of exactly 1/2 (the median size on the edge of infinite), a pick is called
    undetected (bound below 1/2) at most at the level."""
    sims, alpha = 2000, 0.05
    rng = np.random.default_rng(11)
    shares = _shares(rng, 0.5, sims)
    called = sum(detection_upper_bound(row, alpha) < 0.5 for row in shares)
    assert binomtest(called, sims, alpha, alternative="greater").pvalue > 0.001, called


def test_detection_bound_finds_a_rarely_detected_pick() -> None:
    rng = np.random.default_rng(12)
    shares = _shares(rng, 0.2, 200)
    assert sum(detection_upper_bound(row, 0.025) < 0.5 for row in shares) >= 190


def _undetected_cell(share: float, quality_high: float = 1.1) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One not-confirmed (undetected) cell and its confirmation texts: a ``share`` of each prompt's texts
    detected (size 30), the rest never."""
    row = {"temperature": 0.7, "family": "reweight", "max_quality_loss": 0.1, "min_tamper_resistance": 0.0,
           "status": NOT_CONFIRMED, "reason": "undetected", "config_id": "dip", "size_kind": "all.size_valid",
           "quality_low": 0.95, "quality_high": quality_high, "alpha": 0.025}
    detected = round(share * K)
    texts = [{"config_id": "dip", "role": "confirmation", "source": "watermarked", "prompt_id": f"p{p}",
              "size_valid": 30.0 if run < detected else None} for p in range(N_PROMPTS) for run in range(K)]
    return pl.DataFrame([row]), pl.DataFrame(texts)


@pytest.mark.parametrize(("share", "quality_high", "status", "reason"), [
    (0.2, 1.1, NOT_CONFIRMED, "undetected"),  # confidently below half: out
    (0.4, 1.1, CELL_UNRESOLVED, "detection"),  # 0.4 of 240 texts in 48 prompts: not confidently below half
    (0.4, 0.85, NOT_CONFIRMED, "quality"),  # the quality bound already puts it out
])
def test_undetected_cells_are_judged_on_the_bound(share: float, quality_high: float, status: str,
                                                  reason: str) -> None:
    table, texts = _undetected_cell(share, quality_high)
    judged, _ = bound_undetected(table, None, texts, 0.025)
    row = judged.row(0, named=True)
    assert (row["status"], row["reason"]) == (status, reason)
    assert row["detected_share"] == pytest.approx(share) and row["detected_high"] > share


def test_a_confirmed_cell_beats_a_confidently_out_one_in_every_pair() -> None:
    """Outside the paper's orderings too: the confirmed cell's pair with an out cell is supported, with an
    unresolved one it stays open, and each side is named as a reader knows it."""
    table, texts = _tables({"exponential": CONFIRMED, "reweight": NOT_CONFIRMED, "hf_kgw": CELL_UNRESOLVED},
                           {"exponential": 19.0})
    names = {"cfg-exponential": "Gumbel-max (vLLM's setting)", "reweight": "DiPmark"}
    pairs = check_claims(table, pl.DataFrame(), texts, resamples=500, names=names).filter(
        pl.col("scope") == PAIRWISE)
    verdicts = dict(zip(pairs["claim"], pairs["verdict"], strict=True))
    assert verdicts == {"Gumbel-max (vLLM's setting) smaller than DiPmark": SUPPORTED,
                        "Gumbel-max (vLLM's setting) smaller than hf_kgw": UNRESOLVED}


def test_pairs_of_confirmed_cells_name_the_smaller_first() -> None:
    table, texts = _tables({"exponential": CONFIRMED, "distribution_shift": CONFIRMED},
                           {"exponential": 30.0, "distribution_shift": 8.0})
    pairs = check_claims(table, pl.DataFrame(), texts, resamples=500).filter(pl.col("scope") == PAIRWISE)
    assert pairs["claim"].to_list() == ["distribution_shift smaller than exponential"]
    assert pairs["verdict"].to_list() == [SUPPORTED] and pairs["gap_high"][0] < 0
