"""One run's secondary quality: ``reports/quality.json`` from the ``quality`` stage's per-text scores.

Per group (``all`` and each task), baseline vs watermarked: each measure's numbers (:mod:`mmw.quality.registry`;
e.g. the task measure, null for judge-rated tasks, whose quality is the judge's Q in metrics.json). Pooled
measures (MAUVE) sit at the top level. Every value is a number or null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from mmw.quality.registry import metric_classes
from mmw.reporting import OVERALL
from mmw.tasks import JUDGE, MEASURES

SOURCES = ("baseline", "watermarked")
#: Columns of data/quality/scores.parquet: the text, its task's measure, then each quality measure's columns.
SCORE_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "measure": pl.String,
                **{name: dtype for metric in metric_classes() for name, dtype in metric.columns.items()}}


def group_quality(scores: pl.DataFrame, measure: str | None) -> dict[str, Any]:
    """The numbers of one group of rows of the scores table (both sources)."""
    out: dict[str, Any] = {"measure": measure}
    for source in SOURCES:
        rows = scores.filter(pl.col("source") == source)
        out[f"n_{source}"] = rows.height
        for metric in metric_classes():
            out.update(metric.group(rows, measure, source))
    for metric in metric_classes():
        out.update(metric.group_change(out))
    return out


def quality_report(scores: pl.DataFrame, pooled: Mapping[str, dict[str, Any] | None],
                   header: dict[str, Any]) -> dict[str, Any]:
    """reports/quality.json: ``header`` (scorer, metrics, what the measures describe), each pooled measure's entry
    (null where not computed) and ``groups`` (all, then tasks)."""
    tasks = scores["task"].unique(maintain_order=True).to_list()
    groups = {OVERALL: group_quality(scores, None)}
    groups.update({task: group_quality(scores.filter(pl.col("task") == task), MEASURES.get(task, JUDGE))
                   for task in tasks})
    return {**header, **{m.name: pooled.get(m.name) for m in metric_classes() if m.pooled}, "groups": groups}
