"""The paper's selection rule: feasibility under constraints, the smallest size, and picks per cell.

Input tables come from :mod:`mmw.selection.reading` (or anything with the same columns); nothing here reads
files or runs DVC. See docs/SELECTION.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl
from pydantic import ValidationError

from mmw.errors import SpecError
from mmw.validation import Section, allowed, spec_error

SIZE, QUALITY, RESISTANCE, FPR_HIGH = ("all.size", "all.relative_quality", "all.tamper_resistance",
                                       "all.fpr_ci_high")
#: Row kinds, in the order used to break exact ties (a named experiment can be re-run by name, the workspace not).
KINDS = ("experiment", "baseline", "workspace")
#: The paper's four constraints (appendix table "Size of ideal watermark under four tested constraints"):
#: (max quality loss, min tamper resistance); R "none" is 0.
PAPER_CONSTRAINTS = ((0.01, 0.2), (0.01, 0.0), (0.1, 0.2), (0.1, 0.0))


class Constraints(Section):
    """Deployment targets. A setting is feasible when all hold and its watermark is detected (finite size).

    * ``max_quality_loss`` in ``[0, 1)``: relative quality must be at least ``1 - max_quality_loss``
      (paper: 0.01).
    * ``min_tamper_resistance`` in ``[0, 1]``: ``R >= min_tamper_resistance`` (paper: 0.2).
    * ``max_fpr`` in ``[0, 1]`` or None: the upper end of the empirical false-positive rate's 95 % interval
      must not exceed it (None = not checked).

    Bad values raise :class:`SpecError` naming the command-line option (``--max-quality-loss``).
    """

    max_quality_loss: float = allowed("a quality loss in [0, 1), e.g. 0.01 for at most 1 %", ge=0.0, lt=1.0)
    min_tamper_resistance: float = allowed("a tamper resistance R in [0, 1], e.g. 0.2", ge=0.0, le=1.0)
    max_fpr: float | None = allowed("a false-positive rate in [0, 1], e.g. 0.05", ge=0.0, le=1.0)

    def __init__(self, max_quality_loss: float = 0.01, min_tamper_resistance: float = 0.2,
                 max_fpr: float | None = None) -> None:
        try:
            super().__init__(max_quality_loss=max_quality_loss, min_tamper_resistance=min_tamper_resistance,
                             max_fpr=max_fpr)
        except ValidationError as error:
            err = spec_error(error, Constraints, "")
            raise SpecError(f"--{err.key.replace('_', '-')}", err.problem, err.allowed) from None

    @property
    def min_relative_quality(self) -> float:
        return 1.0 - self.max_quality_loss


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select`.

    ``table``: every input row plus ``feasible`` (bool), ``reason`` (why infeasible, ``"; "``-joined, null when
    feasible) and ``rank`` (1 = the pick, null when infeasible), sorted feasible-first by rank.
    ``feasible``: the feasible rows sorted by size (ties: higher relative quality, higher R, experiment before
    baseline before workspace, name). ``pick``: the first feasible row as a dict, or None.
    """

    table: pl.DataFrame
    feasible: pl.DataFrame
    pick: dict[str, Any] | None
    constraints: Constraints


def _failures(constraints: Constraints) -> list[tuple[pl.Expr, pl.Expr]]:
    """``(failed, reason)`` expression pairs, one per condition a feasible row must meet."""
    q_min, r_min = constraints.min_relative_quality, constraints.min_tamper_resistance
    size, quality, resistance = pl.col(SIZE), pl.col(QUALITY), pl.col(RESISTANCE)
    checks = [
        (size.is_null(), pl.when(pl.col("error").is_not_null()).then(pl.format("no metrics: {}", pl.col("error")))
         .otherwise(pl.lit("size unknown"))),
        (size.is_not_null() & quality.is_null(), pl.lit("relative quality unknown (no ratings)")),
        (quality < q_min, pl.format(f"relative quality {{}} < {q_min:g} (loss > {constraints.max_quality_loss:g})",
                                    quality.round(4))),
        (size.is_not_null() & resistance.is_null(), pl.lit("tamper resistance unknown (no attack in R)")),
        (resistance < r_min, pl.format(f"R {{}} < {r_min:g}", resistance.round(4))),
        (size.is_infinite(), pl.lit("size inf (not detected in at least half of the generations)")),
    ]
    if constraints.max_fpr is not None:
        fpr_high = pl.col(FPR_HIGH)
        checks += [
            (size.is_not_null() & fpr_high.is_null(), pl.lit("FPR upper CI unknown (no baseline detections)")),
            (fpr_high > constraints.max_fpr,
             pl.format(f"FPR upper CI {{}} > {constraints.max_fpr:g}", fpr_high.round(4))),
        ]
    return checks


def select(table: pl.DataFrame, constraints: Constraints) -> Selection:
    """Apply ``constraints`` to an :func:`experiments_from_exp_show` table (needs ``name, kind`` and the
    ``all.size / all.relative_quality / all.tamper_resistance / all.fpr_ci_high`` columns; ``error`` optional).

    A row is feasible when it has metrics, ``relative_quality >= 1 - max_quality_loss``,
    ``tamper_resistance >= min_tamper_resistance``, a finite size and, with ``max_fpr``,
    ``fpr_ci_high <= max_fpr``; an unknown (null) metric fails its condition. The pick is the feasible row of
    smallest size (see :class:`Selection` for ties).
    """
    if table.height == 0:
        raise SpecError("experiments", "the table is empty", "run `dvc repro` or `dvc exp run -S ...` first")
    if "error" not in table.columns:
        table = table.with_columns(pl.lit(None, dtype=pl.String).alias("error"))
    checks = _failures(constraints)
    reasons = pl.concat_list([pl.when(failed.fill_null(False)).then(reason).otherwise(None)
                              for failed, reason in checks]).list.drop_nulls()
    kind_order = pl.col("kind").replace_strict(dict(zip(KINDS, range(len(KINDS)), strict=True)), default=len(KINDS),
                                               return_dtype=pl.Int64)
    judged = (table.with_columns(reasons.alias("_reasons"), kind_order.alias("_kind_order"))
              .with_columns((pl.col("_reasons").list.len() == 0).alias("feasible"),
                            pl.col("_reasons").list.join("; ").alias("reason"))
              .with_columns(pl.when(pl.col("feasible")).then(None).otherwise(pl.col("reason")).alias("reason")))
    order = [SIZE, QUALITY, RESISTANCE, "_kind_order", "name"]
    descending = [False, True, True, False, False]
    feasible = (judged.filter(pl.col("feasible")).sort(order, descending=descending, nulls_last=True)
                .with_row_index("rank", offset=1).with_columns(pl.col("rank").cast(pl.Int64)))
    infeasible = (judged.filter(~pl.col("feasible")).sort(order, descending=descending, nulls_last=True)
                  .with_columns(pl.lit(None, dtype=pl.Int64).alias("rank")))
    columns = ["rank", *table.columns, "feasible", "reason"]
    result = pl.concat([feasible.select(columns), infeasible.select(columns)])
    pick = feasible.select(columns).row(0, named=True) if feasible.height else None
    return Selection(table=result, feasible=feasible.select(columns), pick=pick, constraints=constraints)



def cell_picks(table: pl.DataFrame, constraints: list[Constraints],
               by: tuple[str, ...] = ("model.temperature", "family")) -> pl.DataFrame:
    """The pick of each cell ``by`` x constraint: one row per (cell, constraint) that has any row, with the
    cell columns, ``max_quality_loss``, ``min_tamper_resistance``, ``n_settings`` and ``n_feasible``, and the
    picked row's columns (null when nothing in the cell is feasible: the paper's "infinity").

    ``table`` must hold the columns :func:`select` needs plus ``by``.
    """
    rows: list[dict[str, Any]] = []
    for key, cell in table.group_by(list(by), maintain_order=True):
        cell_values = dict(zip(by, key, strict=True))
        for constraint in constraints:
            selection = select(cell, constraint)
            row: dict[str, Any] = {**cell_values, "max_quality_loss": constraint.max_quality_loss,
                                   "min_tamper_resistance": constraint.min_tamper_resistance,
                                   "n_settings": cell.height, "n_feasible": selection.feasible.height}
            pick = selection.pick or {}
            row.update({f"pick.{k}": v for k, v in pick.items() if k not in by and k not in ("rank", "feasible",
                                                                                              "reason")})
            rows.append(row)
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return frame.sort([*by, "max_quality_loss", "min_tamper_resistance"], descending=[False] * len(by) + [False, True])
