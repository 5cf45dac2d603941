"""One run's numbers: ``reports/metrics.json`` content and the CSV tables behind ``dvc plots``.

Everything here is computed from the pipeline's tables with the pure functions of :mod:`mmw.metrics`; the
``aggregate`` stage only reads the tables and writes what this module returns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from mmw.audit import key_spread
from mmw.io import TIMINGS_DIR, read_json
from mmw.metrics import (
    attack_points,
    detection_rate,
    paired_relative_quality,
    quality,
    tamper_frontier,
    tamper_resistance_of,
    watermark_size,
)
from mmw.reporting import OVERALL


def finite_or_none(value: float | None) -> float | None:
    """A metric for metrics.json: a number or null. The only infinity is E's "undetected", which the accompanying
    ``*_undetected_share`` explains (null with a share >= 1/2 = not detected at the median); a string "inf"
    would make ``dvc metrics diff`` unable to subtract."""
    return None if value is None or math.isinf(value) else value


def _undetected_share(sizes: pl.Series) -> float | None:
    return float(sizes.null_count() / len(sizes)) if len(sizes) else None


def _flips(detections: pl.DataFrame) -> int:
    """Attacked prompts whose verdict from the stored tokens differs from the verdict from their re-tokenized text
    (non-zero means a no-op attack would already change W_A)."""
    stored = detections.filter(pl.col("source") == "watermarked").select("prompt_id", "detected")
    text = detections.filter(pl.col("source") == "retokenized").select("prompt_id", pl.col("detected").alias("t"))
    return int(stored.join(text, on="prompt_id").filter(pl.col("detected") != pl.col("t")).height)


def group_metrics(detections: pl.DataFrame, ratings: pl.DataFrame, points: pl.DataFrame,
                  alpha: float, anytime: bool = True) -> dict[str, Any]:
    """The headline numbers of one group of prompts (one task, or all of them).

    ``detections``/``ratings``: rows of every source for the group; ``points``: its :func:`attack_points` rows;
    ``alpha``: the detection threshold (for the FPR audit over keys). Sizes are in tokens; ``size`` is the paper's
    E (first crossing: the any-prefix rate ``fpr_any_prefix`` is its false-positive rate), ``size_valid`` the
    FPR-controlled size (``mmw.watermark.size``; its any-prefix rate ``fpr_any_prefix_valid`` is <= alpha by design) and
    ``size_anytime`` the e-process size (token resolution; ``fpr_any_prefix_anytime`` <= alpha by Ville's
    inequality). ``anytime``: False when the score has no e-process (align, edit): its three keys are null.
    """
    q_base = quality(ratings.filter(pl.col("source") == "baseline")["rating"])
    q_wm = quality(ratings.filter(pl.col("source") == "watermarked")["rating"])
    relative = paired_relative_quality(ratings)
    watermarked = detections.filter(pl.col("source") == "watermarked")
    baseline = detections.filter(pl.col("source") == "baseline")
    fpr = detection_rate(baseline["detected"])
    tpr = detection_rate(watermarked["detected"])
    audit = (np.array(baseline["audit_pvalues"].to_list(), dtype=np.float64).reshape(baseline.height, -1)
             if baseline.height else np.zeros((0, 0)))
    no_attack = points["no_attack_watermarked"].drop_nulls()
    return {
        "generations": watermarked.height,
        "quality_baseline": q_base.mean,
        "quality_watermarked": q_wm.mean,
        "relative_quality": relative.ratio,
        "relative_quality_ci_low": relative.low,
        "relative_quality_ci_high": relative.high,
        "relative_quality_n": relative.n,
        "ratings_missing": int(ratings["rating"].fill_nan(None).null_count()),
        "size": finite_or_none(watermark_size(watermarked["size"])),
        "size_undetected_share": _undetected_share(watermarked["size"]),
        "size_valid": finite_or_none(watermark_size(watermarked["size_valid"])),
        "size_valid_undetected_share": _undetected_share(watermarked["size_valid"]),
        **anytime_metrics(watermarked, baseline, anytime),
        "detection_rate": tpr.rate,
        "tamper_resistance": tamper_resistance_of(points),
        "no_attack_watermarked": float(no_attack[0]) if no_attack.len() else None,
        "retokenization_flips": _flips(detections),
        "fpr": fpr.rate,
        "fpr_ci_low": fpr.low,
        "fpr_ci_high": fpr.high,
        "fpr_n": fpr.n,
        "fpr_any_prefix": detection_rate(baseline["size"].is_not_null()).rate,
        "fpr_any_prefix_valid": detection_rate(baseline["size_valid"].is_not_null()).rate,
        **key_spread(audit, alpha),
        "mean_tokens": float(watermarked["n_tokens"].mean()) if watermarked.height else None,
    }


def anytime_metrics(watermarked: pl.DataFrame, baseline: pl.DataFrame, anytime: bool) -> dict[str, Any]:
    """Median e-process size, its undetected share and its any-prefix FPR on the baseline (null when the score has
    no e-process, or the tables predate the ``size_anytime`` column)."""
    if not anytime or "size_anytime" not in watermarked.columns:
        return {"size_anytime": None, "size_anytime_undetected_share": None, "fpr_any_prefix_anytime": None}
    return {"size_anytime": finite_or_none(watermark_size(watermarked["size_anytime"])),
            "size_anytime_undetected_share": _undetected_share(watermarked["size_anytime"]),
            "fpr_any_prefix_anytime": detection_rate(baseline["size_anytime"].is_not_null()).rate}


def build_metrics(detections: pl.DataFrame, ratings: pl.DataFrame, perturbed: pl.DataFrame,
                  judge: dict[str, Any], alpha: float, anytime: bool = True) -> tuple[dict[str, Any], pl.DataFrame]:
    """``reports/metrics.json`` content and the per-attack table (one row per attack and task, ``task == "all"``
    for the pooled rows). Every metric is a number or null (see :func:`finite_or_none`). ``anytime``: whether the
    scheme's score has an e-process (sum scores)."""
    by_task = attack_points(detections, ratings, perturbed, by_task=True)
    pooled = attack_points(detections, ratings, perturbed, by_task=False).with_columns(
        pl.lit(OVERALL).alias("task"))
    tasks = detections["task"].unique(maintain_order=True).to_list()
    task_order = pl.DataFrame({"task": tasks, "task_rank": range(len(tasks))})
    by_task = by_task.join(task_order, on="task", how="left").sort("task_rank", "attack").drop("task_rank")
    attacks = pl.concat([pooled.select(by_task.columns), by_task])
    metrics: dict[str, Any] = {OVERALL: group_metrics(detections, ratings, pooled, alpha, anytime)}
    for task in tasks:
        metrics[task] = group_metrics(detections.filter(pl.col("task") == task),
                                      ratings.filter(pl.col("task") == task),
                                      by_task.filter(pl.col("task") == task), alpha, anytime)
    metrics["attacks"] = {
        row["attack"]: {"watermarked": row["watermarked"], "quality_retained": row["quality_retained"],
                        "size": finite_or_none(row["size"]), "n": row["n"], "n_failed": row["n_failed"]}
        for row in pooled.iter_rows(named=True)
    }
    metrics["judge"] = {"mode": judge.get("mode"), "discriminates": judge.get("discriminates")}
    return metrics, attacks


def _share_detected_within(sizes: pl.Series, max_tokens: int) -> pl.DataFrame:
    """Share of texts whose shortest detected prefix is <= n tokens, for n = 1..max_tokens (an ECDF of size)."""
    n = len(sizes)
    finite = np.sort(sizes.drop_nulls().to_numpy())
    tokens = np.arange(1, max_tokens + 1)
    share = np.searchsorted(finite, tokens, side="right") / n if n else np.zeros(len(tokens))
    return pl.DataFrame({"tokens": tokens, "detected_share": share})


def _pvalue_ecdf(pvalues: pl.Series) -> pl.DataFrame:
    values = np.sort(pvalues.drop_nulls().to_numpy())
    return pl.DataFrame({"pvalue": values, "ecdf": np.arange(1, len(values) + 1) / max(len(values), 1)})


def hull_frontier(rows: pl.DataFrame) -> np.ndarray:
    """The hull frontier of one group's attack rows (float64 [m, 2]); empty when the no-attack point of the group
    was not measured (no R without it)."""
    anchor = rows["no_attack_watermarked"].drop_nulls()
    if anchor.len() == 0:
        return np.zeros((0, 2))
    points = rows.filter(pl.col("in_R") & pl.col("quality_retained").is_not_null()
                         & pl.col("watermarked").is_not_null())
    return tamper_frontier(points.select("quality_retained", "watermarked").to_numpy(), float(anchor[0]))


def plot_tables(detections: pl.DataFrame, attacks: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """CSV tables behind dvc.yaml's ``plots:`` (file stem -> table); pooled over tasks. ``size_*`` are the ECDFs of
    the first-crossing size E, ``size_valid_*`` those of the FPR-controlled size."""
    pooled = attacks.filter(pl.col("task") == OVERALL)
    frontier = hull_frontier(pooled)
    longest = int(detections["n_tokens"].max() or 1)
    tables = {
        "attacks": pooled.select("attack", "family", "in_R", "quality_retained", "watermarked", "size"),
        "frontier": pl.DataFrame({"quality_retained": frontier[:, 0], "watermarked": frontier[:, 1]}),
    }
    for source in ("baseline", "watermarked"):
        rows = detections.filter(pl.col("source") == source)
        tables[f"size_{source}"] = _share_detected_within(rows["size"], longest)
        tables[f"size_valid_{source}"] = _share_detected_within(rows["size_valid"], longest)
        tables[f"pvalue_{source}"] = _pvalue_ecdf(rows["pvalue"])
    return tables


#: Pipeline order of the stages in ``mmw timings`` (others follow, by name).
STAGE_ORDER = ("key", "low_entropy_inputs", "prompts", "generate_baseline", "generate_watermarked", "perturb",
               "detect_baseline", "detect_watermarked", "rate_baseline", "rate_watermarked", "quality", "aggregate")


def timings_markdown() -> str:
    """A Markdown table of the last wall time of each stage that ran here (``mmw timings``)."""
    records = [read_json(path) for path in TIMINGS_DIR.glob("*.json")]
    order = {stage: index for index, stage in enumerate(STAGE_ORDER)}
    records.sort(key=lambda r: (order.get(r["stage"], len(order)), r["stage"]))
    total = sum(r["wall_s"] for r in records) or 1.0
    lines = ["| stage | seconds | share |", "|---|---|---|"]
    lines += [f"| {r['stage']} | {r['wall_s']:.1f} | {100 * r['wall_s'] / total:.0f}% |" for r in records]
    lines.append(f"| total | {sum(r['wall_s'] for r in records):.1f} | 100% |")
    return "\n".join(lines)
