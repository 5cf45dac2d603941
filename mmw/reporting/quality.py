"""One run's secondary quality: ``reports/quality.json`` from the ``quality`` stage's per-text scores.

Per group (``all`` and each task): the task measure (pass@1 / accuracy; null for judge-rated tasks, whose
quality is the judge's Q in metrics.json), median perplexity and mean repeated-n-gram shares, baseline vs
watermarked. MAUVE is pooled over all tasks (per task it would rest on a handful of texts). Every value is a
number or null.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from mmw.quality.mauve import MauveResult
from mmw.quality.repetition import ORDERS
from mmw.reporting import OVERALL
from mmw.tasks import JUDGE, MEASURES

SOURCES = ("baseline", "watermarked")
#: Columns of data/quality/scores.parquet.
SCORE_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "measure": pl.String,
                "task_score": pl.Float64, "task_status": pl.String, "perplexity": pl.Float64,
                **{f"repetition_{n}": pl.Float64 for n in ORDERS}}


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def group_quality(scores: pl.DataFrame, measure: str | None) -> dict[str, Any]:
    """The numbers of one group of rows of the scores table (both sources)."""
    out: dict[str, Any] = {"measure": measure}
    for source in SOURCES:
        rows = scores.filter(pl.col("source") == source)
        out[f"n_{source}"] = rows.height
        task_scores = rows["task_score"].drop_nulls()
        out[f"task_score_{source}"] = _number(task_scores.mean()) if measure not in (None, JUDGE) and \
            task_scores.len() else None
        out[f"perplexity_{source}"] = _number(rows["perplexity"].drop_nans().median())
        for n in ORDERS:
            out[f"repetition_{n}_{source}"] = _number(rows[f"repetition_{n}"].drop_nans().mean())
    base, wm = out["task_score_baseline"], out["task_score_watermarked"]
    out["task_score_delta"] = None if base is None or wm is None else wm - base
    return out


def quality_report(scores: pl.DataFrame, mauve: MauveResult | None, header: dict[str, Any]) -> dict[str, Any]:
    """reports/quality.json: ``header`` (scorer, metrics, sandbox), ``mauve`` and ``groups`` (all, then tasks)."""
    tasks = scores["task"].unique(maintain_order=True).to_list()
    groups = {OVERALL: group_quality(scores, None)}
    groups.update({task: group_quality(scores.filter(pl.col("task") == task), MEASURES.get(task, JUDGE))
                   for task in tasks})
    mauve_out = None if mauve is None else {
        "value": _number(mauve.value), "n_baseline": mauve.n_baseline, "n_watermarked": mauve.n_watermarked,
        "num_buckets": mauve.num_buckets}  # its run time goes to the timings log (`mmw timings`), not a DVC output
    return {**header, "mauve": mauve_out, "groups": groups}
