"""Assemble the benchmark's results: ``reports/metrics.json`` content, plot data, summary.md and the figure.

Everything here is computed from the pipeline's tables with the pure functions of :mod:`mmw.metrics`; the
``aggregate`` stage only reads the tables and writes what this module returns.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from mmw.audit import key_spread
from mmw.metrics import (
    attack_points,
    detection_rate,
    paired_relative_quality,
    quality,
    tamper_frontier,
    tamper_resistance_of,
    watermark_size,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OVERALL = "all"


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
    FPR-controlled size (``mmw.size``; its any-prefix rate ``fpr_any_prefix_valid`` is <= alpha by design) and
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
        **_anytime_metrics(watermarked, baseline, anytime),
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


def _anytime_metrics(watermarked: pl.DataFrame, baseline: pl.DataFrame, anytime: bool) -> dict[str, Any]:
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


def _frontier(rows: pl.DataFrame) -> np.ndarray:
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
    frontier = _frontier(pooled)
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


def _fmt_size(size: float | None, undetected: float | None) -> str:
    """A median size (null = undetected at the median) with the share of undetected generations."""
    return f"{_fmt_tokens(size)} ({_fmt(undetected, percent=True)})"


def summary_markdown(metrics: dict[str, Any], attacks: pl.DataFrame, judge: dict[str, Any],
                     header: dict[str, str]) -> str:
    """The human-readable report (reports/summary.md). No wall times: it is a cached DVC output and must
    reproduce (they are in reports/timings/, `mmw timings`)."""
    groups = [g for g in metrics if g not in ("attacks", "judge")]
    lines = ["# mmw benchmark summary", ""]
    lines += [f"- **{k}**: {v}" for k, v in header.items()]
    lines += ["", "## Per task", "",
              "| task | n | Q baseline | Q watermarked | relative Q [95% CI] (pairs) | detected | R (no-attack W) "
              "| missing ratings |",
              "|---|---|---|---|---|---|---|---|"]
    for group in groups:
        m = metrics[group]
        relative = f"{_fmt(m['relative_quality'])} [{_fmt(m['relative_quality_ci_low'])}, " \
                   f"{_fmt(m['relative_quality_ci_high'])}] ({m['relative_quality_n']})"
        lines.append(f"| {group} | {m['generations']} | {_fmt(m['quality_baseline'])} | "
                     f"{_fmt(m['quality_watermarked'])} | {relative} | {_fmt(m['detection_rate'], percent=True)} | "
                     f"{_fmt(m['tamper_resistance'])} ({_fmt(m['no_attack_watermarked'], percent=True)}) | "
                     f"{m['ratings_missing']} |")
    lines += ["", "Q: mean judge rating (missing ratings excluded); relative Q: paired by prompt (prompts rated on "
              "both sides), BCa bootstrap interval; R: tamper resistance (2 × area under the attacks' convex-hull "
              "frontier, anchored at the measured no-attack point (1, W): the watermarked texts of the attacked "
              "prompts, detected from their text like the attacked ones; paraphrases excluded), at most W.", "",
              "## Size and false positives", "",
              "| task | E first crossing (undetected) | size valid (undetected) | size anytime (undetected) | "
              "FPR full text [95% CI] | FPR any prefix (E) | FPR any checkpoint (valid) | FPR any prefix (anytime) | "
              "one-key FPR over keys: min / median / max (above band) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for group in groups:
        m = metrics[group]
        fpr = f"{_fmt(m['fpr'], percent=True)} [{_fmt(m['fpr_ci_low'], percent=True)}, " \
              f"{_fmt(m['fpr_ci_high'], percent=True)}] (n={m['fpr_n']})"
        spread = (f"{_fmt(m['fpr_key_min'], percent=True)} / {_fmt(m['fpr_key_median'], percent=True)} / "
                  f"{_fmt(m['fpr_key_max'], percent=True)} ({_fmt(m['fpr_keys_above_band'], percent=True)} of "
                  f"{m['fpr_keys']} keys > {_fmt(m['fpr_key_band_high'], percent=True)})")
        lines.append(f"| {group} | {_fmt_size(m['size'], m['size_undetected_share'])} | "
                     f"{_fmt_size(m['size_valid'], m['size_valid_undetected_share'])} | "
                     f"{_fmt_size(m['size_anytime'], m['size_anytime_undetected_share'])} | {fpr} | "
                     f"{_fmt(m['fpr_any_prefix'], percent=True)} | {_fmt(m['fpr_any_prefix_valid'], percent=True)} | "
                     f"{_fmt(m['fpr_any_prefix_anytime'], percent=True)} | {spread} |")
    lines += ["", "E (the paper's size): median over generations of the first prefix with p ≤ α, a first-crossing "
              "time over every prefix: on unwatermarked text its false-positive rate is the *any-prefix* rate, "
              "not α. Size valid: first checkpoint (16, 32, 64, ... tokens, then the full text) with p ≤ α / m "
              "over the m checkpoints: its any-checkpoint false-positive rate is at most α. Size anytime: first prefix "
              "whose e-value (a mixture of likelihood-ratio martingales over the deduplicated units) reaches 1 / α: "
              "its any-prefix false-positive rate is at most α (Ville's inequality; – for align/edit scores, which "
              "have no per-token pivot; docs/SIZE.md). "
              "Undetected generations count as ∞ in the medians (– = half or more undetected). One-key FPR: the "
              "baseline re-detected under each audit key (derived one-way from the run's key); above band = the "
              "share of keys whose FPR exceeds the upper end of Binomial(n, α)'s central 95% interval.", "",
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
    return "\n".join(lines) + "\n"


def tamper_figure(attacks: pl.DataFrame) -> Figure:
    """Quality retained vs share still watermarked per attack, with the hull frontier and its area shaded;
    one panel for the pooled tasks, then one per task. Paraphrases (not in R) are drawn as crosses."""
    from matplotlib.figure import Figure

    groups = attacks["task"].unique(maintain_order=True).to_list()
    names = attacks["attack"].unique(maintain_order=True).to_list()
    if not groups:  # attacks.specs: [] (e.g. validation runs): nothing to draw, say so instead of failing
        figure = Figure(figsize=(4, 1.2), layout="constrained")
        figure.text(0.5, 0.5, "no attacks configured (attacks.specs is empty): R is undefined", ha="center")
        return figure
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    figure = Figure(figsize=(3.6 * len(groups), 4.4), layout="constrained")
    axes = figure.subplots(1, len(groups), squeeze=False)[0]
    for ax, group in zip(axes, groups, strict=True):
        rows = attacks.filter((pl.col("task") == group) & pl.col("quality_retained").is_not_null()
                              & pl.col("watermarked").is_not_null())
        frontier = _frontier(rows)
        ax.fill_between(frontier[:, 0], frontier[:, 1], color="tab:blue", alpha=0.12)
        ax.plot(frontier[:, 0], frontier[:, 1], color="tab:blue", lw=1.5)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
        if frontier.size:  # the measured no-attack point the hull is anchored at
            ax.scatter(1.0, rows["no_attack_watermarked"].drop_nulls()[0], color="black", marker="*", s=90,
                       zorder=4)
        for row in rows.iter_rows(named=True):
            ax.scatter(row["quality_retained"], row["watermarked"], color=colors[row["attack"]],
                       marker="o" if row["in_R"] else "x", s=40, zorder=3, alpha=0.85)
        ax.set(xlim=(-0.02, 1.05), ylim=(-0.02, 1.05), xlabel="quality retained $Q_A$",
               title=f"{group}: R = {_fmt(tamper_resistance_of(rows))}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("still watermarked $W_A$")
    handles = [axes[0].scatter([], [], color=colors[name], marker="o", s=40) for name in names]
    handles += axes[0].plot([], [], color="tab:blue", lw=1.5)
    handles.append(axes[0].scatter([], [], color="black", marker="*", s=90))
    figure.legend(handles, [*names, "hull frontier (area = R / 2)", "no attack (measured)"],
                  loc="outside lower center", ncols=min(len(names) + 2, 6), fontsize=8, frameon=False)
    return figure
