"""The confirmed table of a sweep: per temperature x family x constraint, the tuning ranking, the confirmation
tries and the cell's status with its evidence (see :mod:`mmw.sweep.confirm` for the procedure).

Inputs are the collection's tables: ``results`` (one row per config: the tuning runs), ``reevaluations`` (one row
per confirmation run: ``config_id``, ``seed``, ``status``, the size columns) and the per-prompt rows of the
confirmation runs (:mod:`mmw.sweep.evidence`, column ``experiment``). Its Markdown is
:func:`mmw.sweep.tables.confirmed_markdown`'s.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import polars as pl

from mmw.errors import SpecError
from mmw.selection import Constraints, median_mad
from mmw.sweep.confirm import (
    CONFIRMED,
    NOT_CONFIRMED,
    PENDING,
    SIZE_E,
    UNRESOLVED,
    CellOutcome,
    Check,
    Confirmation,
    Evidence,
    check,
    confirm_cell,
    ranked_candidates,
    size_kind,
    valid_size_measured,
)
from mmw.sweep.evidence import evidence

CELL = ("model.temperature", "family")
#: table.parquet's columns, in order (the tries' own numbers are in ``tries.parquet``).
COLUMNS = {
    "temperature": pl.Float64, "family": pl.String, "max_quality_loss": pl.Float64,
    "min_tamper_resistance": pl.Float64, "status": pl.String, "reason": pl.String, "config_id": pl.String,
    "size_kind": pl.String, "size_median": pl.Float64, "size_mad": pl.Float64, "e_median": pl.Float64,
    "quality": pl.Float64, "quality_low": pl.Float64, "quality_high": pl.Float64, "resistance": pl.Float64,
    "resistance_low": pl.Float64, "resistance_high": pl.Float64, "alpha": pl.Float64, "level": pl.Float64,
    "tries": pl.Int64, "max_tries": pl.Int64, "k": pl.Int64, "k_planned": pl.Int64, "n_prompts": pl.Int64,
    "n_attacked": pl.Int64, "pending": pl.String, "n_settings": pl.Int64, "n_feasible": pl.Int64,
    "pick_size": pl.Float64,
}


def _evidence_of(config_id: str, kind: str, reevaluations: pl.DataFrame, prompts: pl.DataFrame, k: int
                 ) -> tuple[Evidence, float | None] | None:
    """The K finished confirmation runs of ``config_id`` as evidence (and the median of their E), or None until
    all K have finished with per-prompt rows."""
    runs = reevaluations.filter((pl.col("config_id") == config_id) & (pl.col("status") == "done")).sort("experiment")
    if runs.height < k or prompts.height == 0:
        return None
    rows = prompts.filter(pl.col("experiment").is_in(runs["experiment"].to_list()))
    if rows["experiment"].n_unique() < runs.height:
        return None
    sizes = runs[kind].to_list() if kind in runs.columns else [None] * runs.height
    e_median, _ = median_mad(runs[SIZE_E].to_list())
    return evidence(rows, sizes), e_median


def _labels(by: tuple[str, ...], key: tuple[Any, ...]) -> dict[str, Any]:
    """A cell's columns: ``temperature`` for ``model.temperature``, the other ``by`` columns by their names."""
    return {("temperature" if b == "model.temperature" else b): v for b, v in zip(by, key, strict=True)}


def _row(labels: dict[str, Any], constraints: Constraints, outcome: CellOutcome, kind: str,
         e_medians: dict[str, float | None], confirmation: Confirmation, k: int, extra: dict[str, Any]) -> dict:
    last: Check | None = outcome.tries[-1] if outcome.tries else None
    shown = next((t for t in outcome.tries if t.config_id == outcome.pick), last)
    row: dict[str, Any] = {**labels, "max_quality_loss": constraints.max_quality_loss,
                           "min_tamper_resistance": constraints.min_tamper_resistance,
                           "status": outcome.status, "reason": outcome.reason, "size_kind": kind,
                           "level": confirmation.level, "tries": len(outcome.tries),
                           "max_tries": confirmation.max_tries,
                           "k_planned": k, "pending": outcome.pending, **extra}
    if shown is not None:
        row.update(config_id=shown.config_id, size_median=shown.size_median, size_mad=shown.size_mad,
                   e_median=e_medians.get(shown.config_id), quality=shown.quality, quality_low=shown.quality_low,
                   quality_high=shown.quality_high, resistance=shown.resistance,
                   resistance_low=shown.resistance_low, resistance_high=shown.resistance_high, alpha=shown.alpha,
                   k=shown.k, n_prompts=shown.n_prompts, n_attacked=shown.n_attacked)
    return row


def confirmed_table(results: pl.DataFrame, reevaluations: pl.DataFrame, prompts: pl.DataFrame,
                    confirmation: Confirmation, k: int, by: tuple[str, str] = CELL,
                    constraint_list: tuple[tuple[float, float], ...] | None = None
                    ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(table, tries)``: one row per cell (``by``: temperature x family for the paper's table) x constraint
    (:data:`COLUMNS`, ``family`` renamed to ``by[1]``), and one row per judged try (the cell's columns and the
    :class:`~mmw.sweep.confirm.Check` fields).

    ``pending`` names the candidate whose K confirmation runs are needed next (the runner's work list).
    ``constraint_list``: (quality loss, R) pairs, default the confirmation's (``confirm.quality_losses``)."""
    constraint_list = confirmation.constraints if constraint_list is None else constraint_list
    done = results.filter(pl.col("status") == "done")
    rows: list[dict[str, Any]] = []
    tries: list[dict[str, Any]] = []
    valid_measured = valid_size_measured(done)
    for key, cell in done.group_by(list(by), maintain_order=True):
        labels = _labels(by, key)
        kind = size_kind(cell, valid_measured)
        for loss, r_min in constraint_list:
            constraints = Constraints(max_quality_loss=loss, min_tamper_resistance=r_min)
            _, candidates = ranked_candidates(cell, constraints, kind)
            found: dict[str, Evidence] = {}
            e_medians: dict[str, float | None] = {}
            for config_id in candidates[:confirmation.max_tries]:
                pair = _evidence_of(config_id, kind, reevaluations, prompts, k)
                if pair is not None:
                    found[config_id], e_medians[config_id] = pair
            try:
                outcome = confirm_cell(candidates, found, constraints, confirmation)
            except SpecError as err:  # e.g. too few attacked prompts for this cell's R interval
                outcome = CellOutcome(UNRESOLVED, f"{err.key}: {err.problem}", None, candidates=tuple(candidates))
            pick_size = cell.filter(pl.col("config_id") == candidates[0])[kind].item() if candidates else None
            extra = {"n_settings": cell.height, "n_feasible": len(candidates), "pick_size": pick_size}
            rows.append(_row(labels, constraints, outcome, kind, e_medians, confirmation, k, extra))
            for number, tried in enumerate(outcome.tries, start=1):
                tries.append({**labels, "max_quality_loss": loss, "min_tamper_resistance": r_min, "try": number,
                              **asdict(tried)})
    second = by[1]
    schema = {(second if c == "family" else c): t for c, t in COLUMNS.items()}
    table = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    table = table.sort(["temperature", second, "max_quality_loss", "min_tamper_resistance"],
                       descending=[False, False, False, True])
    return table, pl.DataFrame(tries, infer_schema_length=None)


#: The randomness comparison's constraint (quality loss <= 10 %, no R) and its columns.
RANDOMNESS_CONSTRAINT = ((0.1, 0.0),)
RANDOMNESS_COLUMNS = ("temperature", "randomness_kind", "status", "reason", "config_id", "size_kind", "size_median",
                      "size_mad", "e_median", "quality", "quality_low", "quality_high", "tries", "k", "n_prompts",
                      "pending")


def confirmed_randomness(results: pl.DataFrame, reevaluations: pl.DataFrame, prompts: pl.DataFrame,
                         confirmation: Confirmation, k: int) -> pl.DataFrame:
    """Text-dependent vs fixed randomness, confirmed: per temperature x randomness kind, the smallest config at
    quality loss <= 10 % (window 0 excluded, as :func:`mmw.sweep.collect.randomness_table`), re-checked on the
    confirmation runs like a cell of the paper's table."""
    kept = results.filter(pl.col("randomness_kind").is_not_null())
    if "scheme.window" in kept.columns:
        kept = kept.filter(pl.col("scheme.window").is_null() | (pl.col("scheme.window") != 0))
    table, _ = confirmed_table(kept, reevaluations, prompts, confirmation, k, ("model.temperature", "randomness_kind"),
                               RANDOMNESS_CONSTRAINT)
    return table.select(RANDOMNESS_COLUMNS)


def pending_config_ids(table: pl.DataFrame) -> list[str]:
    """Distinct candidates whose confirmation runs are needed next, in table order."""
    if table.height == 0:
        return []
    return list(dict.fromkeys(table.filter(pl.col("status") == PENDING)["pending"].drop_nulls().to_list()))


# -- later rounds (``confirm.extend``) ---------------------------------------------------------------------------

def first_rounds(reevaluations: pl.DataFrame, seeds: list[int]) -> pl.DataFrame:
    """The runs of the first confirmation rounds: those with the definition's re-evaluation ``seeds`` (a later
    round's runs carry its own seeds, :class:`mmw.sweep.confirm.Extension`)."""
    if reevaluations.height == 0 or "seed" not in reevaluations.columns:
        return reevaluations
    return reevaluations.filter(pl.col("seed").is_in(seeds))


def extension_candidates(table: pl.DataFrame, extension: Any) -> list[tuple[dict[str, Any], Any]]:
    """``(row, cell entry)`` of every cell of ``table`` that ``extension`` (a later round) declares and that is
    still unresolved with a candidate to re-test, in the round's declared order of cells."""
    rows = table.to_dicts() if table.height else []
    found = []
    for entry in extension.cells:
        for row in rows:
            if (row["temperature"] == entry.temperature and row.get("family") == entry.family
                    and row["min_tamper_resistance"] in entry.min_r and row["status"] == UNRESOLVED
                    and row.get("config_id") and row.get("round") != extension.name):
                found.append((row, entry))
    return found


def _detection_rejudged(check: Check, rows: pl.DataFrame, kind: str, constraints: Constraints) -> tuple[
        Check, float | None, float | None]:
    """A later round's try judged "undetected" on its runs' median size, judged again on the detection bound
    over its own prompts (:func:`mmw.sweep.claims.bound_undetected`'s rule); with the pooled share and its bound."""
    from dataclasses import replace

    from mmw.sweep.claims import _rejudged, detected_shares, detection_upper_bound

    if check.status != "not confirmed" or check.reason != "undetected":
        return check, None, None
    shares = detected_shares(rows, check.config_id, kind)
    upper = detection_upper_bound(shares, check.alpha)
    status, reason = _rejudged(asdict(check), upper, constraints.min_relative_quality,
                               constraints.min_tamper_resistance)
    return replace(check, status=status, reason=reason), (float(shares.mean()) if shares.size else None), upper


def extended_table(table: pl.DataFrame, tries: pl.DataFrame, reevaluations: pl.DataFrame, prompts: pl.DataFrame,
                   confirmation: Confirmation) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(table, tries)`` after the later rounds of ``confirmation.extend``, in order: each cell a round declares
    and the rounds before left unresolved re-tests its candidate (the setting its last try judged) once, on the
    round's runs alone (its seeds, its prompts), at the round's level. The candidate's verdict in the latest round
    that judged it replaces its earlier ones; the cell is confirmed when a candidate's latest verdict is, unresolved
    while any candidate's latest verdict is, else not confirmed. Its ``level`` becomes the sum of the levels of
    every round that judged it (the union bound over its tries: at most that chance of a false confirmation);
    ``round`` names the last round that judged it. A cell whose round has not finished all its runs stays as it
    was. ``tries`` gains one row per later try (column ``round``; a first-rounds try ``round n`` is the n-th)."""
    if table.height == 0:
        return table, tries
    rows = table.with_columns(pl.lit(None, dtype=pl.String).alias("round")).to_dicts()
    attempts = tries.to_dicts() if tries.height else []
    for attempt in attempts:
        attempt["round"] = f"round {attempt['try']}"
    keys = ("temperature", "family", "max_quality_loss", "min_tamper_resistance")
    for extension in confirmation.extend:
        judge = confirmation.model_copy(update={"level": extension.level, "max_tries": 1, "extend": []})
        frame = pl.DataFrame(rows, schema={**table.schema, "round": pl.String}, infer_schema_length=None)
        for row, entry in extension_candidates(frame, extension):
            row = next(r for r in rows if all(r[k] == row[k] for k in keys))
            seeds = extension.seeds(entry.k)
            runs = reevaluations.filter(pl.col("seed").is_in(seeds)) if reevaluations.height else reevaluations
            kind = row["size_kind"] or SIZE_E
            pair = _evidence_of(row["config_id"], kind, runs, prompts, entry.k)
            if pair is None:
                continue
            constraints = Constraints(max_quality_loss=row["max_quality_loss"],
                                      min_tamper_resistance=row["min_tamper_resistance"])
            try:
                tried = check(row["config_id"], pair[0], constraints, judge)
            except SpecError:
                continue
            own = prompts.filter(pl.col("experiment").is_in(
                runs.filter(pl.col("config_id") == row["config_id"])["experiment"].to_list()))
            tried, share, high = _detection_rejudged(tried, own, kind, constraints)
            mine = [a for a in attempts if all(a[k] == row[k] for k in keys)]
            latest = {a["config_id"]: (a["status"], a["reason"]) for a in mine}
            latest[tried.config_id] = (tried.status, tried.reason)
            attempts.append({**{k: row[k] for k in keys}, "try": len(mine) + 1, **asdict(tried),
                             "round": extension.name})
            if any(s == CONFIRMED for s, _ in latest.values()):
                status, reason = CONFIRMED, None
            elif any(s == UNRESOLVED for s, _ in latest.values()):
                status, reason = UNRESOLVED, next(r for s, r in latest.values() if s == UNRESOLVED)
            else:
                status, reason = NOT_CONFIRMED, tried.reason
            row.update(status=status, reason=reason, round=extension.name, level=(row["level"] or 0) + extension.level,
                       tries=(row["tries"] or 0) + 1, e_median=pair[1], size_median=tried.size_median,
                       size_mad=tried.size_mad, quality=tried.quality, quality_low=tried.quality_low,
                       quality_high=tried.quality_high, resistance=tried.resistance,
                       resistance_low=tried.resistance_low, resistance_high=tried.resistance_high, alpha=tried.alpha,
                       k=tried.k, n_prompts=tried.n_prompts, n_attacked=tried.n_attacked)
            if "detected_share" in row:
                row.update(detected_share=share, detected_high=high)
    out = pl.DataFrame(rows, schema={**table.schema, "round": pl.String}, infer_schema_length=None)
    return out, pl.DataFrame(attempts, infer_schema_length=None) if attempts else tries
