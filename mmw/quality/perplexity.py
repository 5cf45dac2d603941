"""Perplexity (quality measure ``perplexity``): of each reply given its prompt under the scoring model
(:mod:`mmw.quality.scoring` computes it in the stage's one forward pass); per group, the median."""

from __future__ import annotations

import numpy as np
import polars as pl

from mmw.quality.base import QualityMetric, SummaryColumn, Texts, number


class Perplexity(QualityMetric):
    name = "perplexity"
    needs_scorer = True
    columns = {"perplexity": pl.Float64}
    summary_columns = (SummaryColumn("perplexity base → wm", "perplexity"),)
    summary_note = "Perplexity: median, under the scorer, of each reply given its prompt."

    def per_text(self, texts: Texts) -> dict[str, list]:
        assert texts.scores is not None, "the stage scores the texts for a measure that needs_scorer"
        return {"perplexity": [None if np.isnan(v) else float(v) for v in texts.scores.perplexity]}

    @classmethod
    def group(cls, rows: pl.DataFrame, measure: str | None, source: str) -> dict[str, float | None]:
        return {f"perplexity_{source}": number(rows["perplexity"].drop_nans().median())}
