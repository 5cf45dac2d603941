"""One run's human-readable summary: ``reports/summary.md`` (its tables, and the secondary-quality section from
``reports/quality.json``) and the tamper-resistance figure, from what :mod:`mmw.reporting.run` computed.

No wall times: summary.md is a cached DVC output and must reproduce (they are in reports/timings/, `mmw timings`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from mmw.metrics import tamper_resistance_of
from mmw.quality.base import SummaryColumn
from mmw.quality.registry import metric_classes
from mmw.reporting.formats import fmt_count, fmt_fixed, fmt_number, fmt_percent, fmt_size
from mmw.reporting.run import hull_frontier

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
        relative = f"{fmt_fixed(m['relative_quality'])} [{fmt_fixed(m['relative_quality_ci_low'])}, " \
                   f"{fmt_fixed(m['relative_quality_ci_high'])}] ({m['relative_quality_n']})"
        lines.append(f"| {group} | {m['generations']} | {fmt_fixed(m['quality_baseline'])} | "
                     f"{fmt_fixed(m['quality_watermarked'])} | {relative} | "
                     f"{fmt_fixed(m['detection_rate'], percent=True)} | "
                     f"{fmt_fixed(m['tamper_resistance'])} ({fmt_fixed(m['no_attack_watermarked'], percent=True)}) | "
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
        fpr = f"{fmt_fixed(m['fpr'], percent=True)} [{fmt_fixed(m['fpr_ci_low'], percent=True)}, " \
              f"{fmt_fixed(m['fpr_ci_high'], percent=True)}] (n={m['fpr_n']})"
        spread = (f"{fmt_fixed(m['fpr_key_min'], percent=True)} / {fmt_fixed(m['fpr_key_median'], percent=True)} / "
                  f"{fmt_fixed(m['fpr_key_max'], percent=True)} "
                  f"({fmt_fixed(m['fpr_keys_above_band'], percent=True)} of "
                  f"{m['fpr_keys']} keys > {fmt_fixed(m['fpr_key_band_high'], percent=True)})")
        lines.append(f"| {group} | {fmt_size(m['size'], m['size_undetected_share'])} | "
                     f"{fmt_size(m['size_valid'], m['size_valid_undetected_share'])} | "
                     f"{fmt_size(m['size_anytime'], m['size_anytime_undetected_share'])} | {fpr} | "
                     f"{fmt_fixed(m['fpr_any_prefix'], percent=True)} | "
                     f"{fmt_fixed(m['fpr_any_prefix_valid'], percent=True)} | "
                     f"{fmt_fixed(m['fpr_any_prefix_anytime'], percent=True)} | {spread} |")
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
                     f"{row['n_failed']} | {fmt_fixed(row['watermarked'], percent=True)} | "
                     f"{fmt_fixed(row['quality_retained'])} | {fmt_count(row['size'])} |")
    lines += ["", "## Judge", ""]
    flag = judge.get("discriminates")
    lines.append(f"- rating mode used: **{judge.get('mode')}** (requested: {judge.get('requested_mode')})")
    lines.append(f"- discriminates baseline from word-shuffled baseline: **{'yes' if flag else 'NO'}**"
                 + ("" if flag else " — quality numbers are not meaningful with this judge"))
    for mode, stats in (judge.get("modes") or {}).items():
        lines.append(f"- {mode}: " + ", ".join(f"{k} {f'{v:.2g}' if k == 'pvalue' else fmt_fixed(v)}"
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
        frontier = hull_frontier(rows)
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
               title=f"{group}: R = {fmt_fixed(tamper_resistance_of(rows))}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("still watermarked $W_A$")
    handles = [axes[0].scatter([], [], color=colors[name], marker="o", s=40) for name in names]
    handles += axes[0].plot([], [], color="tab:blue", lw=1.5)
    handles.append(axes[0].scatter([], [], color="black", marker="*", s=90))
    figure.legend(handles, [*names, "hull frontier (area = R / 2)", "no attack (measured)"],
                  loc="outside lower center", ncols=min(len(names) + 2, 6), fontsize=8, frameon=False)
    return figure


def quality_markdown(report: dict[str, Any]) -> str:
    """The "Secondary quality" section of summary.md: each measure's pooled line, columns and note."""
    metrics = metric_classes()
    lines = ["## Secondary quality (reports/quality.json)", "",
             f"- scorer: {report.get('scorer')}; metrics: {', '.join(report.get('metrics', []))}"]
    for metric in metrics:
        pooled = report.get(metric.name) if metric.pooled else None
        if pooled:
            lines.append("- " + metric.summary_pooled.format(
                **{k: fmt_number(v) if isinstance(v, float) else v for k, v in pooled.items()}))
    columns = [column for metric in metrics for column in metric.summary_columns]
    lines += ["", "| group | measure | " + " | ".join(c.header for c in columns) + " |",
              "|---|---|" + "---|" * len(columns)]
    for group, m in report["groups"].items():
        lines.append(f"| {group} | {m['measure'] or '–'} | " + " | ".join(_quality_cell(c, m) for c in columns) + " |")
    lines += ["", " ".join(metric.summary_note for metric in metrics if metric.summary_note)]
    return "\n".join(lines) + "\n"


def _quality_cell(column: SummaryColumn, numbers: dict[str, Any]) -> str:
    """``baseline → watermarked`` of one column in one group."""
    fmt = fmt_percent if column.percent else fmt_number
    base, wm = numbers[f"{column.key}_baseline"], numbers[f"{column.key}_watermarked"]
    return "–" if column.whole_or_none and base is None else f"{fmt(base)} → {fmt(wm)}"
