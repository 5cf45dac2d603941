"""Stage ``quality``: secondary quality measures of the baseline and watermarked generations (params
``quality:``), each a class of :mod:`mmw.quality.registry` (task measures in the sandbox, repetition, perplexity,
MAUVE). Writes data/quality/scores.parquet and reports/quality.json."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl

from mmw.io import GENERATIONS, read_table, write_json, write_table
from mmw.params import load_params
from mmw.quality.base import Texts
from mmw.quality.params import QualityParams
from mmw.quality.registry import build_metrics, metric_classes
from mmw.reporting.quality import SCORE_SCHEMA, quality_report
from mmw.stages.timing import timed
from mmw.tasks import JUDGE, MEASURES

SCORES = Path("data/quality/scores.parquet")
REPORT = Path("reports/quality.json")
#: The scores table's columns that say which text a row is.
ROW_KEYS = ("prompt_id", "task", "source")


def run(params_path: Path) -> None:
    with timed("quality") as info:
        params = load_params(params_path, ("seed", "quality"), models={"quality": QualityParams})
        settings = params.quality
        metrics = build_metrics(settings)  # an unknown name, or a measure that cannot run here, refuses first
        texts = pl.concat([read_table(GENERATIONS[source], columns=("prompt_id", "task", "prompt", "text"))
                           .select("prompt_id", "task", "prompt", "text")
                           .with_columns(pl.lit(source).alias("source")) for source in ("baseline", "watermarked")])
        n = texts.height
        scores = None
        if any(metric.needs_scorer for metric in metrics):  # one forward pass serves them all
            from mmw.engines.models import load_model
            from mmw.quality.scoring import score_texts

            loading = time.perf_counter()
            tokenizer, model = load_model(settings.scorer, settings.device, settings.dtype)
            info["load_s"] = round(time.perf_counter() - loading, 3)  # ~0 where a warm process shares its load
            scoring = time.perf_counter()
            scores = score_texts(tokenizer, model, texts["prompt"].to_list(), texts["text"].to_list(),
                                 settings.max_tokens, settings.batch_size)
            info["scoring_s"] = round(time.perf_counter() - scoring, 3)
        measured = Texts(texts, settings, params.seed, scores)
        columns: dict[str, list] = {"measure": [MEASURES.get(t, JUDGE) for t in texts["task"].to_list()]}
        pooled: dict[str, dict | None] = {}
        header = {"scorer": settings.scorer, "metrics": list(settings.metrics)}
        for metric_class in metric_classes():
            header.update(metric_class.header_defaults)
        for metric in metrics:
            started = time.perf_counter()
            columns.update(metric.per_text(measured))
            if metric.pooled:
                pooled[metric.name] = metric.pool(measured)
            header.update(metric.header())
            info[f"{metric.name}_s"] = round(time.perf_counter() - started, 3)
        table = texts.select(*ROW_KEYS).with_columns(
            *(pl.Series(name, columns.get(name, [None] * n), dtype=dtype)
              for name, dtype in SCORE_SCHEMA.items() if name not in ROW_KEYS)
        ).select(list(SCORE_SCHEMA))
        write_table(table, SCORES)
        write_json(quality_report(table, pooled, header), REPORT)
        info.update(rows=n)
