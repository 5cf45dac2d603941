"""Assemble the benchmark's results: ``reports/metrics.json`` content, plot data, summary.md and the figure.

Everything here is computed from the pipeline's tables with the pure functions of :mod:`mmw.metrics`; the
``aggregate`` stage only reads the tables and writes what this module returns.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from mmw.metrics import (
    attack_points,
    detection_rate,
    quality,
    relative_quality,
    tamper_frontier,
    tamper_resistance_of,
    watermark_size,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OVERALL = "all"


def group_metrics(detections: pl.DataFrame, ratings: pl.DataFrame, points: pl.DataFrame) -> dict[str, Any]:
    """The headline numbers of one group of prompts (one task, or all of them).

    ``detections``/``ratings``: rows of every source for the group; ``points``: its :func:`attack_points` rows.
    """
    q_base = quality(ratings.filter(pl.col("source") == "baseline")["rating"])
    q_wm = quality(ratings.filter(pl.col("source") == "watermarked")["rating"])
    watermarked = detections.filter(pl.col("source") == "watermarked")
    fpr = detection_rate(detections.filter(pl.col("source") == "baseline")["detected"])
    tpr = detection_rate(watermarked["detected"])
    return {
        "generations": watermarked.height,
        "quality_baseline": q_base.mean,
        "quality_watermarked": q_wm.mean,
        "relative_quality": relative_quality(q_wm.mean, q_base.mean),
        "ratings_missing": int(ratings["rating"].fill_nan(None).null_count()),
        "size": watermark_size(watermarked["size"]),
        "detection_rate": tpr.rate,
        "tamper_resistance": tamper_resistance_of(points),
        "fpr": fpr.rate,
        "fpr_ci_low": fpr.low,
        "fpr_ci_high": fpr.high,
        "fpr_n": fpr.n,
        "mean_tokens": float(watermarked["n_tokens"].mean()) if watermarked.height else None,
    }


def build_metrics(detections: pl.DataFrame, ratings: pl.DataFrame, perturbed: pl.DataFrame,
                  judge: dict[str, Any]) -> tuple[dict[str, Any], pl.DataFrame]:
    """``reports/metrics.json`` content and the per-attack table (one row per attack and task, ``task == "all"``
    for the pooled rows)."""
    by_task = attack_points(detections, ratings, perturbed, by_task=True)
    pooled = attack_points(detections, ratings, perturbed, by_task=False).with_columns(
        pl.lit(OVERALL).alias("task"))
    tasks = detections["task"].unique(maintain_order=True).to_list()
    task_order = pl.DataFrame({"task": tasks, "task_rank": range(len(tasks))})
    by_task = by_task.join(task_order, on="task", how="left").sort("task_rank", "attack").drop("task_rank")
    attacks = pl.concat([pooled.select(by_task.columns), by_task])
    metrics: dict[str, Any] = {OVERALL: group_metrics(detections, ratings, pooled)}
    for task in tasks:
        metrics[task] = group_metrics(detections.filter(pl.col("task") == task),
                                      ratings.filter(pl.col("task") == task),
                                      by_task.filter(pl.col("task") == task))
    metrics["attacks"] = {
        row["attack"]: {k: row[k] for k in ("watermarked", "quality_retained", "size", "n", "n_failed")}
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


def plot_tables(detections: pl.DataFrame, attacks: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """CSV tables behind dvc.yaml's ``plots:`` (file stem -> table); pooled over tasks."""
    pooled = attacks.filter(pl.col("task") == OVERALL)
    points = pooled.filter(pl.col("in_R") & pl.col("quality_retained").is_not_null()
                           & pl.col("watermarked").is_not_null())
    frontier = tamper_frontier(points.select("quality_retained", "watermarked").to_numpy())
    longest = int(detections["n_tokens"].max() or 1)
    tables = {
        "attacks": pooled.select("attack", "family", "in_R", "quality_retained", "watermarked", "size"),
        "frontier": pl.DataFrame({"quality_retained": frontier[:, 0], "watermarked": frontier[:, 1]}),
    }
    for source in ("baseline", "watermarked"):
        rows = detections.filter(pl.col("source") == source)
        tables[f"size_{source}"] = _share_detected_within(rows["size"], longest)
        tables[f"pvalue_{source}"] = _pvalue_ecdf(rows["pvalue"])
    return tables


def _fmt(value: Any, digits: int = 3, percent: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if percent:
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _fmt_tokens(value: float | None) -> str:
    """A token count: integral medians without decimals, half-integral ones (even counts) with one."""
    return _fmt(value) if value is None or math.isinf(value) else f"{value:g}"


def summary_markdown(metrics: dict[str, Any], attacks: pl.DataFrame, judge: dict[str, Any],
                     timings: list[dict[str, Any]], header: dict[str, str]) -> str:
    """The human-readable report (reports/summary.md)."""
    groups = [g for g in metrics if g not in ("attacks", "judge")]
    lines = ["# mmw benchmark summary", ""]
    lines += [f"- **{k}**: {v}" for k, v in header.items()]
    lines += ["", "## Per task", "",
              "| task | n | Q baseline | Q watermarked | relative Q | E (tokens) | detected | R | FPR [95% CI] "
              "| missing ratings |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for group in groups:
        m = metrics[group]
        fpr = f"{_fmt(m['fpr'], percent=True)} [{_fmt(m['fpr_ci_low'], percent=True)}, " \
              f"{_fmt(m['fpr_ci_high'], percent=True)}] (n={m['fpr_n']})"
        lines.append(f"| {group} | {m['generations']} | {_fmt(m['quality_baseline'])} | "
                     f"{_fmt(m['quality_watermarked'])} | {_fmt(m['relative_quality'])} | {_fmt_tokens(m['size'])} | "
                     f"{_fmt(m['detection_rate'], percent=True)} | {_fmt(m['tamper_resistance'])} | {fpr} | "
                     f"{m['ratings_missing']} |")
    lines += ["", "Q: mean judge rating (missing ratings excluded); E: median shortest detected prefix (∞ when "
              "half or more are undetected); R: tamper resistance (2 × area under the attacks' convex-hull "
              "frontier; paraphrases excluded); FPR: share of unwatermarked baseline texts detected.", "",
              "## Attacks", "",
              "| task | attack | in R | n | failed | W_A (still watermarked) | Q_A (quality retained) | E_A |",
              "|---|---|---|---|---|---|---|---|"]
    for row in attacks.iter_rows(named=True):
        lines.append(f"| {row['task']} | {row['attack']} | {'yes' if row['in_R'] else 'no'} | {row['n']} | "
                     f"{row['n_failed']} | {_fmt(row['watermarked'], percent=True)} | "
                     f"{_fmt(row['quality_retained'])} | {_fmt_tokens(row['size'])} |")
    lines += ["", "## Judge", ""]
    flag = judge.get("discriminates")
    lines.append(f"- rating mode used: **{judge.get('mode')}** (requested: {judge.get('requested_mode')})")
    lines.append(f"- discriminates baseline from word-shuffled baseline: **{'yes' if flag else 'NO'}**"
                 + ("" if flag else " — quality numbers are not meaningful with this judge"))
    for mode, stats in (judge.get("modes") or {}).items():
        lines.append(f"- {mode}: " + ", ".join(f"{k} {f'{v:.2g}' if k == 'pvalue' else _fmt(v)}"
                                               for k, v in stats.items()))
    lines += ["", "## Wall time per stage (last run of each)", "", "| stage | seconds | share |", "|---|---|---|"]
    total = sum(t["wall_s"] for t in timings) or 1.0
    for t in timings:
        lines.append(f"| {t['stage']} | {t['wall_s']:.1f} | {100 * t['wall_s'] / total:.0f}% |")
    lines.append(f"| total | {total:.1f} | 100% |")
    return "\n".join(lines) + "\n"


def tamper_figure(attacks: pl.DataFrame) -> Figure:
    """Quality retained vs share still watermarked per attack, with the hull frontier and its area shaded;
    one panel for the pooled tasks, then one per task. Paraphrases (not in R) are drawn as crosses."""
    from matplotlib.figure import Figure

    groups = attacks["task"].unique(maintain_order=True).to_list()
    names = attacks["attack"].unique(maintain_order=True).to_list()
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    figure = Figure(figsize=(3.6 * len(groups), 4.4), layout="constrained")
    axes = figure.subplots(1, len(groups), squeeze=False)[0]
    for ax, group in zip(axes, groups, strict=True):
        rows = attacks.filter((pl.col("task") == group) & pl.col("quality_retained").is_not_null()
                              & pl.col("watermarked").is_not_null())
        frontier = tamper_frontier(rows.filter(pl.col("in_R")).select("quality_retained", "watermarked").to_numpy())
        ax.fill_between(frontier[:, 0], frontier[:, 1], color="tab:blue", alpha=0.12)
        ax.plot(frontier[:, 0], frontier[:, 1], color="tab:blue", lw=1.5)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
        for row in rows.iter_rows(named=True):
            ax.scatter(row["quality_retained"], row["watermarked"], color=colors[row["attack"]],
                       marker="o" if row["in_R"] else "x", s=40, zorder=3, alpha=0.85)
        ax.set(xlim=(-0.02, 1.05), ylim=(-0.02, 1.05), xlabel="quality retained $Q_A$",
               title=f"{group}: R = {_fmt(tamper_resistance_of(rows))}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("still watermarked $W_A$")
    handles = [axes[0].scatter([], [], color=colors[name], marker="o", s=40) for name in names]
    handles += axes[0].plot([], [], color="tab:blue", lw=1.5)
    figure.legend(handles, [*names, "hull frontier (area = R / 2)"], loc="outside lower center",
                  ncols=min(len(names) + 1, 6), fontsize=8, frameon=False)
    return figure
