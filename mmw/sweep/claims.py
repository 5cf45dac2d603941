"""The paper's orderings of watermark size, checked on a sweep's confirmed cells.

The paper draws three orderings from its table ("The 'best' watermark", "Randomness source"):

* **distribution shift is best at T in [0, 0.7]**: its size is the smallest of the four families;
* **exponential is slightly ahead at T = 1**: its size is below distribution shift's;
* **text-dependent randomness is more efficient than fixed** at every temperature.

A sweep speaks to an ordering only through cells whose pick was *confirmed* on held-out prompts
(:mod:`mmw.sweep.cells`): a size measured on the tuning prompts, or of a pick that failed its constraints, says
nothing about "the best watermark under the constraint". Per claim, temperature and constraint, each comparison
"A smaller than B" is judged from the two cells' confirmation runs:

* both confirmed: the gap ``median(A) - median(B)`` of the size over every unattacked watermarked text of the
  cell's K confirmation runs (undetected = larger than any finite size, as the paper's infinity), with a two-sided
  percentile bootstrap interval at ``level`` over the confirmation prompts. The two cells ran on the **same**
  prompts, so each resample draws prompts once and takes both cells' texts of the drawn prompts (paired; all K
  runs of a prompt together, as :mod:`mmw.sweep.confirm` resamples). ``A`` when the interval lies below 0, ``B``
  when above, ``tie`` otherwise;
* one side confirmed, the other confidently out (not confirmed: a constraint's bound failed, or no feasible
  setting): the confirmed side is smaller (the out side has no watermark meeting the constraint, the paper's
  infinity);
* both out: ``none`` (nothing to order); a side pending or unresolved: ``unknown``.

Besides the paper's orderings, every pair of the table's columns (families, and outside watermarks) at a
temperature and constraint where at least one cell is confirmed is judged the same way (:func:`pairwise_orderings`):
which watermark to deploy is such an ordering, and a confirmed cell beats one that is confidently out there too.

"Confidently out" for an undetected pick rests on a bound, not on the median of the K runs' medians
(:func:`bound_undetected`): the pooled median size over the confirmation texts is infinite exactly when fewer
than half the texts are detected (a finite size of the cell's kind), so the pick is undetected when an upper
confidence bound on the detected share at the try's level lies below 1/2. The bound treats prompts as the
independent units (a prompt's K texts share its entropy, so they are not independent trials): each prompt
contributes its detected share ``d_i`` in [0, 1], and Hoeffding's Chernoff bound in its Kullback-Leibler form,
``P(mean(d) <= m - t) <= exp(-n KL(m - t || m))``, holds for independent [0, 1] variables with mean of means ``m``
whatever their distributions (Hoeffding 1963, Theorem 1), so ``u = max{m >= mean(d): n KL(mean(d) || m) <=
log(1 / alpha)}`` is a one-sided upper bound at level ``alpha`` (Clopper-Pearson's large-deviation form; for
binary data it is slightly wider than Clopper-Pearson). A pick whose bound reaches 1/2 is **unresolved
(detection)**, unless its quality or R bound already puts it out.

A claim row is **supported** when every comparison it makes goes its way, **contradicted** when one goes against
it, **not testable** when no comparison had a side to stand on (all ``none``), and **not resolved at this scale**
otherwise. Error: a supported (or contradicted) row needs every (one) of its comparisons significant at ``level``,
so a row errs with probability at most ``level`` (intersection-union); rows are not corrected for each other —
the table says how many there are. The sizes compared are of one kind (the cells' own kind when both cells share
it, else the checkpoint size ``size_valid`` that every scheme has).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy.optimize import brentq
from scipy.special import rel_entr

from mmw.sweep.confirm import CONFIRMED, NO_FEASIBLE, NOT_CONFIRMED, resample_counts
from mmw.sweep.confirm import UNRESOLVED as CELL_UNRESOLVED

#: A cell's pooled median size is infinite exactly when its detected share lies below this (the lower median).
MEDIAN_SHARE = 0.5
UNDETECTED, DETECTION = "undetected", "detection"
#: Which rows of the claims table are the paper's orderings and which judge every pair of the table's columns.
PAPER, PAIRWISE = "paper", "pairwise"
#: Per-text size columns of the per-prompt rows, by the cell's size kind.
SIZE_COLUMNS = {"all.size_anytime": "size_anytime", "all.size_valid": "size_valid", "all.size": "size"}
FALLBACK_KIND = "all.size_valid"
SUPPORTED, CONTRADICTED, UNRESOLVED, UNTESTABLE = (
    "supported", "contradicted", "not resolved at this scale", "not testable")
#: How a comparison's outcome reads in the tables.
OUTCOME_WORDS = {"A": "smaller", "B": "larger", "tie": "no significant difference", "none": "neither confirmed",
                 "unknown": "pending or unresolved"}
COLUMNS = {
    "claim": pl.String, "temperature": pl.Float64, "max_quality_loss": pl.Float64,
    "min_tamper_resistance": pl.Float64, "smaller": pl.String, "than": pl.String, "verdict": pl.String,
    "comparisons": pl.String, "size_kind": pl.String, "median_smaller": pl.Float64, "median_than": pl.Float64,
    "gap_low": pl.Float64, "gap_high": pl.Float64, "n_prompts": pl.Int64, "level": pl.Float64, "scope": pl.String,
}


@dataclass(frozen=True)
class Claim:
    """One of the paper's orderings: ``smaller`` has a smaller size than each of ``than`` (None: every other
    value of the table's ``column`` at that temperature) at the temperatures ``low <= T <= high``."""

    name: str
    column: str  # "family" (the paper's table) or "randomness_kind" (the randomness table)
    smaller: str
    than: tuple[str, ...] | None
    low: float
    high: float


PAPER_CLAIMS = (
    Claim("distribution shift is best at T <= 0.7", "family", "distribution_shift", None, 0.0, 0.7),
    Claim("exponential ahead of distribution shift at T = 1", "family", "exponential", ("distribution_shift",),
          1.0, 1.0),
    Claim("text-dependent randomness smaller than fixed", "randomness_kind", "text-dependent", ("fixed",),
          0.0, float("inf")),
)


# -- the size gap -------------------------------------------------------------------------------------------------

def weighted_lower_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Lower median of ``values`` (shape ``(N,)``, +inf allowed) under each column of ``weights`` (``(N, B)``):
    the smallest value whose cumulative weight reaches half the total. Shape ``(B,)``; NaN where a column's
    weights are all zero."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order], axis=0)
    total = cumulative[-1]
    index = np.argmax(cumulative >= total / 2.0, axis=0)
    return np.where(total > 0, values[order][index], np.nan)


def _gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a - b`` with inf - inf = 0 (both undetected: equal)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(a) & np.isinf(b) & (a == b), 0.0, a - b)


def size_gap(sizes_a: np.ndarray, prompts_a: np.ndarray, sizes_b: np.ndarray, prompts_b: np.ndarray, n: int,
             level: float, resamples: int, seed: int) -> tuple[float, float, float, float]:
    """``(median_a, median_b, gap_low, gap_high)``: both cells' lower median size over their texts (undetected =
    +inf) and a two-sided percentile bootstrap interval at ``level`` for ``median_a - median_b``, resampling the
    ``n`` shared prompts (``prompts_a`` / ``prompts_b``: each text's prompt index in ``[0, n)``).

    The interval's ends are order statistics of the resampled gaps (``lower`` / ``higher``), which keeps them
    defined when a gap is infinite."""
    counts = resample_counts(n, resamples, seed)  # (n, B)
    ones_a, ones_b = np.ones((sizes_a.size, 1)), np.ones((sizes_b.size, 1))
    median_a = float(weighted_lower_median(sizes_a, ones_a)[0])
    median_b = float(weighted_lower_median(sizes_b, ones_b)[0])
    gaps = _gap(weighted_lower_median(sizes_a, counts[prompts_a]), weighted_lower_median(sizes_b, counts[prompts_b]))
    gaps = gaps[~np.isnan(gaps)]
    low = float(np.quantile(gaps, level / 2, method="lower"))
    high = float(np.quantile(gaps, 1 - level / 2, method="higher"))
    return median_a, median_b, low, high


# -- the detection bound -----------------------------------------------------------------------------------------

def _kl(p: float, q: float) -> float:
    """Kullback-Leibler divergence of Bernoulli(p) from Bernoulli(q)."""
    return float(rel_entr(p, q) + rel_entr(1.0 - p, 1.0 - q))


def detection_upper_bound(shares: np.ndarray, alpha: float) -> float:
    """One-sided upper bound at level ``alpha`` on the mean detected share of independent prompts (``shares``:
    each prompt's detected share in [0, 1], shape ``(n,)``): the Chernoff-Hoeffding bound of the module
    docstring, ``max{m >= mean: n KL(mean || m) <= log(1 / alpha)}``."""
    n = shares.size
    if n == 0:
        return 1.0
    mean = float(np.clip(np.mean(shares), 0.0, 1.0))
    budget = math.log(1.0 / alpha) / n
    top = 1.0 - 1e-12  # KL(mean || 1) is infinite for mean < 1: the root lies below
    if mean >= top or _kl(mean, top) <= budget:
        return 1.0
    return float(brentq(lambda m: _kl(mean, m) - budget, mean, top, xtol=1e-10))


def detected_shares(prompts: pl.DataFrame, config_id: str, kind: str) -> np.ndarray:
    """Per confirmation prompt of ``config_id``, the share of its unattacked watermarked texts detected (a finite
    size of ``kind``), in prompt order."""
    texts = _texts(prompts, config_id, SIZE_COLUMNS.get(kind, SIZE_COLUMNS[FALLBACK_KIND]))
    if texts.height == 0:
        return np.empty(0)
    return (texts.group_by("prompt_id").agg(pl.col("size").is_finite().mean().alias("share"))
            .sort("prompt_id")["share"].to_numpy())


def _rejudged(row: dict[str, Any], upper: float, q_min: float, r_min: float) -> tuple[str, str]:
    """A try judged "undetected" on the median of its runs, judged again on the detection bound ``upper``: still
    out (undetected) when the bound lies below 1/2; out on quality or R when their bounds say so; else unresolved,
    naming every constraint whose interval straddles."""
    if upper < MEDIAN_SHARE:
        return NOT_CONFIRMED, UNDETECTED
    q_low, q_high = row.get("quality_low"), row.get("quality_high")
    r_low, r_high = row.get("resistance_low"), row.get("resistance_high")
    if q_high is not None and q_high < q_min:
        return NOT_CONFIRMED, "quality"
    if r_min > 0 and r_high is not None and r_high <= r_min:
        return NOT_CONFIRMED, "R"
    open_ = [name for name, straddles in (("quality", q_low is None or q_low < q_min),
                                          ("R", r_min > 0 and (r_low is None or r_low <= r_min))) if straddles]
    return CELL_UNRESOLVED, ", ".join([*open_, DETECTION])


def bound_undetected(table: pl.DataFrame, tries: pl.DataFrame | None, prompts: pl.DataFrame, alpha: float
                     ) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """``(table, tries)`` with every try judged "not confirmed (undetected)" judged again on the detection bound
    (module docstring) at the try's level (``alpha`` where a row has none), and each cell's status and reason
    following its tries as :func:`mmw.sweep.confirm.confirm_cell` does (unresolved when any try is, else the first
    try's reason). Adds ``detected_share`` and ``detected_high`` (the pooled share and its upper bound) to the
    cells that had such a try.

    ``table``: a confirmed table (the paper's, ``family``; or the randomness table, ``randomness_kind``, whose one
    constraint is quality loss <= 10 %, no R); ``tries``: its tries (None: each row is its cell's one try);
    ``prompts``: the confirmation runs' per-prompt rows."""
    if table.height == 0 or "status" not in table.columns:
        return table, tries
    column = "family" if "family" in table.columns else "randomness_kind"
    keys = [c for c in ("temperature", column, "max_quality_loss", "min_tamper_resistance") if c in table.columns]
    cells = table.with_columns(pl.lit(None, dtype=pl.Float64).alias("detected_share"),
                               pl.lit(None, dtype=pl.Float64).alias("detected_high")).to_dicts()
    attempts = tries.to_dicts() if tries is not None and tries.height else [dict(c) for c in cells]
    by_cell: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for attempt in attempts:
        by_cell.setdefault(tuple(attempt.get(k) for k in keys), []).append(attempt)
    for cell in cells:
        mine = by_cell.get(tuple(cell[k] for k in keys), [])
        if cell["status"] != NOT_CONFIRMED or not any(t.get("reason") == UNDETECTED for t in mine):
            continue
        q_min = 1.0 - (cell.get("max_quality_loss") or 0.1)
        r_min = cell.get("min_tamper_resistance") or 0.0
        for attempt in mine:
            if attempt.get("status") != NOT_CONFIRMED or attempt.get("reason") != UNDETECTED:
                continue
            shares = detected_shares(prompts, attempt["config_id"], cell.get("size_kind") or FALLBACK_KIND)
            upper = detection_upper_bound(shares, attempt.get("alpha") or alpha)
            attempt["status"], attempt["reason"] = _rejudged(attempt, upper, q_min, r_min)
            if cell["detected_share"] is None and shares.size:
                cell["detected_share"], cell["detected_high"] = float(shares.mean()), upper
        unresolved = [t for t in mine if t.get("status") == CELL_UNRESOLVED]
        cell["status"], cell["reason"] = ((CELL_UNRESOLVED, unresolved[0]["reason"]) if unresolved
                                          else (NOT_CONFIRMED, mine[0]["reason"]))
    schema = {**table.schema, "detected_share": pl.Float64, "detected_high": pl.Float64}
    judged = pl.DataFrame(cells, schema=schema)
    if tries is None or tries.height == 0:
        return judged, tries
    return judged, pl.DataFrame(attempts, schema=tries.schema)


# -- the claims ---------------------------------------------------------------------------------------------------

def _texts(prompts: pl.DataFrame, config_id: str, column: str) -> pl.DataFrame:
    """The unattacked watermarked texts of ``config_id``'s confirmation runs: ``prompt_id`` and ``size``
    (+inf when undetected)."""
    rows = prompts.filter((pl.col("config_id") == config_id) & (pl.col("source") == "watermarked"))
    if "role" in rows.columns:
        rows = rows.filter(pl.col("role") == "confirmation")
    return rows.select("prompt_id", pl.col(column).cast(pl.Float64).fill_null(float("inf")).alias("size"))


def _compare(a: dict[str, Any], b: dict[str, Any], prompts: pl.DataFrame, level: float, resamples: int, seed: int
             ) -> tuple[str, dict[str, Any]]:
    """One comparison "a smaller than b" of two table rows: its outcome and, when both are confirmed, the
    numbers."""
    out = (NOT_CONFIRMED, NO_FEASIBLE)
    if a["status"] == CONFIRMED and b["status"] == CONFIRMED:
        kind = a["size_kind"] if a["size_kind"] == b["size_kind"] else FALLBACK_KIND
        column = SIZE_COLUMNS[kind]
        texts_a, texts_b = _texts(prompts, a["config_id"], column), _texts(prompts, b["config_id"], column)
        if texts_a.height == 0 or texts_b.height == 0:
            return "unknown", {}
        shared = sorted(set(texts_a["prompt_id"].to_list()) | set(texts_b["prompt_id"].to_list()))
        index = {p: i for i, p in enumerate(shared)}
        prompt_a = np.array([index[p] for p in texts_a["prompt_id"]], dtype=np.int64)
        prompt_b = np.array([index[p] for p in texts_b["prompt_id"]], dtype=np.int64)
        median_a, median_b, low, high = size_gap(texts_a["size"].to_numpy(), prompt_a, texts_b["size"].to_numpy(),
                                                 prompt_b, len(shared), level, resamples, seed)
        numbers = {"size_kind": kind, "median_smaller": median_a, "median_than": median_b, "gap_low": low,
                   "gap_high": high, "n_prompts": len(shared)}
        return ("A" if high < 0 else "B" if low > 0 else "tie"), numbers
    if a["status"] == CONFIRMED and b["status"] in out:
        return "A", {}
    if b["status"] == CONFIRMED and a["status"] in out:
        return "B", {}
    if a["status"] in out and b["status"] in out:
        return "none", {}
    return "unknown", {}


def verdict(outcomes: Sequence[str]) -> str:
    """A claim row's verdict from its comparisons' outcomes (``A``: the claimed order holds significantly)."""
    if any(o == "B" for o in outcomes):
        return CONTRADICTED
    if outcomes and all(o == "A" for o in outcomes):
        return SUPPORTED
    if all(o == "none" for o in outcomes):
        return UNTESTABLE
    return UNRESOLVED


def _name(row: dict[str, Any], column: str, names: Mapping[str, str]) -> str:
    """A cell's watermark as a reader knows it: its pick's name, else its column's (``names``: config id or
    column value -> name)."""
    return names.get(row.get("config_id") or "") or names.get(row[column]) or row[column]


def pairwise_orderings(table: pl.DataFrame, prompts: pl.DataFrame, level: float = 0.05, resamples: int = 2000,
                       seed: int = 0, names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Claims rows (:data:`COLUMNS`, scope ``pairwise``) for every pair of the table's columns at a temperature
    and constraint where at least one cell is confirmed: "A smaller than B", with A the confirmed side (both
    confirmed: the smaller median), judged like a comparison of the paper's orderings. ``names``: display names
    by config id or family (default: the family)."""
    names = names or {}
    rows: list[dict[str, Any]] = []
    if table.height == 0 or "family" not in table.columns:
        return rows
    keys = ["temperature", "max_quality_loss", "min_tamper_resistance"]
    for key, cell in table.group_by(keys, maintain_order=True):
        by_family = {r["family"]: r for r in cell.iter_rows(named=True)}
        judged: set[frozenset[str]] = set()
        for first in sorted(f for f, r in by_family.items() if r["status"] == CONFIRMED):
            for second in sorted(by_family):
                if second == first or frozenset((first, second)) in judged:
                    continue
                judged.add(frozenset((first, second)))
                a, b = by_family[first], by_family[second]
                outcome, numbers = _compare(a, b, prompts, level, resamples, seed)
                if numbers and numbers["median_smaller"] > numbers["median_than"]:  # name the smaller first
                    a, b = b, a
                    outcome, numbers = _compare(a, b, prompts, level, resamples, seed)
                rows.append({"claim": f"{_name(a, 'family', names)} smaller than {_name(b, 'family', names)}",
                             **dict(zip(keys, key, strict=True)), "smaller": a["family"], "than": b["family"],
                             "verdict": verdict([outcome]),
                             "comparisons": f"vs {_name(b, 'family', names)}: {OUTCOME_WORDS[outcome]}", **numbers,
                             "level": level, "scope": PAIRWISE})
    return rows


def check_claims(table: pl.DataFrame, randomness: pl.DataFrame, prompts: pl.DataFrame, level: float = 0.05,
                 resamples: int = 2000, seed: int = 0, claims: Sequence[Claim] = PAPER_CLAIMS,
                 names: Mapping[str, str] | None = None) -> pl.DataFrame:
    """One row per claim x temperature x constraint that the confirmed tables hold (:data:`COLUMNS`): the paper's
    orderings (scope ``paper``), then every resolved-or-open pair of the table's columns with a confirmed side
    (scope ``pairwise``, :func:`pairwise_orderings`).

    Args:
        table: the confirmed paper's table (:func:`mmw.sweep.cells.confirmed_table`; ``family`` column).
        randomness: the confirmed randomness table (:func:`mmw.sweep.cells.confirmed_randomness`).
        prompts: the per-prompt rows of the confirmation runs (``config_id``, ``source``, ``prompt_id``, sizes).
        names: display names of the watermarks by config id or family, for the pairwise rows.
    """
    rows: list[dict[str, Any]] = []
    for claim in claims:
        source = table if claim.column == "family" else randomness
        if source.height == 0 or claim.column not in source.columns:
            continue
        source = source.filter(pl.col("temperature").is_between(claim.low, claim.high))
        if "max_quality_loss" not in source.columns:  # the randomness table has one constraint: 10 %, no R
            source = source.with_columns(pl.lit(0.1).alias("max_quality_loss"),
                                         pl.lit(0.0).alias("min_tamper_resistance"))
        keys = ["temperature", "max_quality_loss", "min_tamper_resistance"]
        for key, cell in source.group_by(keys, maintain_order=True):
            by_value = {r[claim.column]: r for r in cell.iter_rows(named=True)}
            if claim.smaller not in by_value:
                continue
            others = [v for v in (claim.than or sorted(by_value)) if v != claim.smaller and v in by_value]
            if not others:
                continue
            outcomes, numbers = [], {}
            for other in others:
                outcome, found = _compare(by_value[claim.smaller], by_value[other], prompts, level, resamples, seed)
                outcomes.append(outcome)
                if found and (not numbers or found["gap_high"] > numbers["gap_high"]):
                    numbers = found  # the weakest of the significant-or-not gaps: the one closest to failing
            rows.append({"claim": claim.name, **dict(zip(keys, key, strict=True)), "smaller": claim.smaller,
                         "than": ", ".join(others), "verdict": verdict(outcomes),
                         "comparisons": "; ".join(f"vs {o}: {OUTCOME_WORDS[c]}"
                                                  for o, c in zip(others, outcomes, strict=True)),
                         **numbers, "level": level, "scope": PAPER})
    order = ["claim", "temperature", "max_quality_loss", "min_tamper_resistance"]
    paper = (pl.DataFrame(rows, schema=COLUMNS) if rows else pl.DataFrame(schema=COLUMNS)).sort(
        order, descending=[False, False, False, True], maintain_order=True)
    pairs = pairwise_orderings(table, prompts, level, resamples, seed, names)
    pairwise = (pl.DataFrame(pairs, schema=COLUMNS) if pairs else pl.DataFrame(schema=COLUMNS)).sort(
        ["temperature", "max_quality_loss", "min_tamper_resistance", "claim"], descending=[False, False, True, False],
        maintain_order=True)
    return pl.concat([paper, pairwise])
