"""Stage ``quality``: secondary quality measures of the baseline and watermarked generations (params
``quality:``): task measures (pass@1 in the sandbox, accuracy), repetition, perplexity and MAUVE under a local
scoring model. Writes data/quality/scores.parquet and reports/quality.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from mmw.io import GENERATIONS, read_table, write_json, write_table
from mmw.params import derive_seed, load_params
from mmw.quality.params import QualityParams
from mmw.quality.repetition import ORDERS, repetition
from mmw.reporting.quality import SCORE_SCHEMA, quality_report
from mmw.quality.task_measures import Verdict, run_humaneval, score_choice
from mmw.sandbox import SandboxLimits, isolation
from mmw.stages.timing import timed
from mmw.tasks import JUDGE, MEASURES, task_references

SCORES = Path("data/quality/scores.parquet")
REPORT = Path("reports/quality.json")


def task_verdicts(texts: pl.DataFrame, limits: SandboxLimits) -> list[Verdict | None]:
    """One verdict per row of ``texts`` (prompt_id, text); None for tasks measured by the judge only."""
    references = task_references(texts["prompt_id"].unique().to_list())
    verdicts: list[Verdict | None] = []
    for prompt_id, text in texts.select("prompt_id", "text").iter_rows():
        reference = references.get(prompt_id)
        if reference is None:
            verdicts.append(None)
        elif reference.problem is not None:
            verdicts.append(run_humaneval(reference.problem, text, limits))
        else:
            verdicts.append(score_choice(reference.answer, text, reference.choices))
    return verdicts


def run(params_path: Path) -> None:
    with timed("quality") as info:
        params = load_params(params_path, ("seed", "quality"), models={"quality": QualityParams})
        settings = params.quality
        sandbox = isolation(settings.sandbox) if "task" in settings.metrics else None  # refuses before any work
        texts = pl.concat([read_table(GENERATIONS[source], columns=("prompt_id", "task", "prompt", "text"))
                           .select("prompt_id", "task", "prompt", "text")
                           .with_columns(pl.lit(source).alias("source")) for source in ("baseline", "watermarked")])
        n = texts.height
        columns: dict[str, list] = {"measure": [MEASURES.get(t, JUDGE) for t in texts["task"].to_list()]}
        verdicts = task_verdicts(texts, SandboxLimits(settings.sandbox_timeout_s, settings.sandbox_memory_mb,
                                                    mode=settings.sandbox)) \
            if "task" in settings.metrics else [None] * n
        columns["task_score"] = [v.score if v else None for v in verdicts]
        columns["task_status"] = [v.status if v else None for v in verdicts]
        reps = [repetition(t) for t in texts["text"].to_list()] if "repetition" in settings.metrics else None
        for order in ORDERS:
            columns[f"repetition_{order}"] = [r[order] for r in reps] if reps else [None] * n
        mauve = None
        perplexity: list[float | None] = [None] * n
        if {"perplexity", "mauve"} & set(settings.metrics):
            from mmw.engines.models import load_model
            from mmw.quality.scoring import score_texts

            tokenizer, model = load_model(settings.scorer, settings.device, settings.dtype)
            scores = score_texts(tokenizer, model, texts["prompt"].to_list(), texts["text"].to_list(),
                                 settings.max_tokens, settings.batch_size)
            if "perplexity" in settings.metrics:
                perplexity = [None if np.isnan(v) else float(v) for v in scores.perplexity]
            if "mauve" in settings.metrics:
                from mmw.quality.mauve import mauve_score

                is_base = (texts["source"] == "baseline").to_numpy()
                mauve = mauve_score(scores.features[is_base], scores.features[~is_base], settings.mauve_buckets,
                                    seed=derive_seed(params.seed, "mauve") % (2**31))
        columns["perplexity"] = perplexity
        table = texts.select("prompt_id", "task", "source").with_columns(
            *(pl.Series(name, values, dtype=SCORE_SCHEMA[name]) for name, values in columns.items())
        ).select(list(SCORE_SCHEMA))
        header = {"scorer": settings.scorer, "metrics": list(settings.metrics),
                  "sandbox": sandbox.describe() if sandbox else None}
        write_table(table, SCORES)
        write_json(quality_report(table, mauve, header), REPORT)
        info.update(rows=n, mauve_s=round(mauve.wall_s, 3) if mauve else None)
