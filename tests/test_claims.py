"""The paper's orderings checked on confirmed cells (mmw.sweep.claims): the size-gap interval is calibrated
(equal cells are called different at most at the stated level) and has power, and the verdict follows the
comparisons' outcomes and the cells' statuses."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from mmw.sweep.claims import (
    CONTRADICTED,
    SUPPORTED,
    UNRESOLVED,
    UNTESTABLE,
    check_claims,
    size_gap,
    verdict,
    weighted_lower_median,
)
from mmw.sweep.confirm import CONFIRMED, NO_FEASIBLE, NOT_CONFIRMED, PENDING

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


def test_claims_follow_the_confirmed_cells() -> None:
    empty = pl.DataFrame()
    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": CONFIRMED, "binary": NOT_CONFIRMED,
                            "inverse_transform": NO_FEASIBLE},
                           {"distribution_shift": 8.0, "exponential": 20.0})
    row = check_claims(table, empty, texts, resamples=500).row(0, named=True)
    assert row["verdict"] == SUPPORTED and row["median_smaller"] < row["median_than"] and row["gap_high"] < 0
    assert "vs binary: smaller" in row["comparisons"]

    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": CONFIRMED},
                           {"distribution_shift": 20.0, "exponential": 8.0})
    assert check_claims(table, empty, texts, resamples=500)["verdict"].to_list() == [CONTRADICTED]

    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": PENDING}, {"distribution_shift": 8.0})
    assert check_claims(table, empty, texts, resamples=500)["verdict"].to_list() == [UNRESOLVED]

    table, texts = _tables({"distribution_shift": NOT_CONFIRMED, "exponential": NO_FEASIBLE}, {})
    assert check_claims(table, empty, texts, resamples=500)["verdict"].to_list() == [UNTESTABLE]

    table, texts = _tables({"distribution_shift": NOT_CONFIRMED, "exponential": CONFIRMED}, {"exponential": 9.0})
    assert check_claims(table, empty, texts, resamples=500)["verdict"].to_list() == [CONTRADICTED]


def test_randomness_claim_reads_the_randomness_table() -> None:
    table, texts = _tables({"distribution_shift": CONFIRMED, "exponential": CONFIRMED},
                           {"distribution_shift": 6.0, "exponential": 30.0})
    randomness = (table.rename({"family": "randomness_kind"})
                  .with_columns(pl.col("randomness_kind").replace({"distribution_shift": "text-dependent",
                                                                   "exponential": "fixed"}))
                  .drop("max_quality_loss", "min_tamper_resistance"))
    texts = texts.with_columns(pl.col("config_id"))
    rows = check_claims(pl.DataFrame(), randomness, texts, resamples=500)
    assert rows["claim"].to_list() == ["text-dependent randomness smaller than fixed"]
    assert rows["verdict"].to_list() == [SUPPORTED] and rows["max_quality_loss"].to_list() == [0.1]
