"""A selection's report: its Markdown (constraints, pick, one row per setting, picks per cell) and its
size-quality figure (``mmw select``). Deciding is :mod:`mmw.selection`'s; this only shows the outcome."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import polars as pl

from mmw.selection.rerun import RerunCommand
from mmw.selection.selecting import FPR_HIGH, QUALITY, RESISTANCE, SIZE, Selection

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def selection_markdown(selection: Selection, rerun: RerunCommand | None = None) -> str:
    """A Markdown report: the constraints, the pick (and its re-evaluation command), and one table row per
    experiment (feasible ones first, by size), the pick in bold, the failed conditions of infeasible rows."""
    c = selection.constraints
    table = selection.table
    lines = ["# Watermark selection", "",
             "The paper's aggregate metric: among the evaluated settings, keep those with "
             f"relative quality >= {c.min_relative_quality:g} (quality loss <= {c.max_quality_loss:g}), "
             f"tamper resistance R >= {c.min_tamper_resistance:g}"
             + (f", FPR upper 95 % CI <= {c.max_fpr:g}" if c.max_fpr is not None else "")
             + " and a detected watermark (finite size); pick the smallest watermark size (median tokens to "
             "detect). Re-evaluate the pick with a fresh seed and key to remove the selection bias.", ""]
    if selection.pick is None:
        lines += ["**No feasible setting**: relax the constraints or evaluate more settings.", ""]
    else:
        pick = selection.pick
        lines += [f"**Pick: `{pick['name']}`** — size {_cell(pick[SIZE])} tokens, relative quality "
                  f"{_cell(pick[QUALITY])}, R {_cell(pick[RESISTANCE])} "
                  f"({selection.feasible.height} of {table.height} settings feasible).", ""]
        if rerun is not None:
            lines += ["Re-evaluate it with a fresh seed, and a fresh key in `MMW_KEY` (never written anywhere):",
                      "", "```bash", "export MMW_KEY=...   # a new secret key", rerun.command, "```", ""]
            if not rerun.exact:
                lines += [f"(The params of `{pick['name']}` differ from the workspace's in structure, which `-S` "
                          f"cannot express exactly; an exact re-run is `{rerun.fallback}`.)", ""]
    shown = ["name", "rank", "feasible", "reason", SIZE, QUALITY, RESISTANCE, "all.fpr", FPR_HIGH,
             "all.detection_rate", "status", "rev", "seed", "model.temperature"]
    shown += [col for col in table.columns if col.startswith("scheme.") and table[col].null_count() < table.height]
    shown = [col for col in shown if col in table.columns]
    lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for row in table.iter_rows(named=True):
        is_pick = selection.pick is not None and row["rev"] == selection.pick["rev"]
        cells = []
        for col in shown:
            text = _cell(row[col][:7] if col == "rev" and row["kind"] != "workspace" else row[col])
            if col == "name" and is_pick:
                text = f"**{text}** (pick)"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def selection_figure(selection: Selection) -> Figure:
    """Size (x) against relative quality (y) per setting: feasible filled, infeasible hollow, the pick a star.

    Undetected settings (infinite size) sit at the right edge, drawn as triangles; rows without a relative
    quality cannot be placed and are left out (the Markdown table lists them).
    """
    from matplotlib.figure import Figure

    c = selection.constraints
    rows = selection.table.filter(pl.col(QUALITY).is_not_null() & pl.col(SIZE).is_not_null())
    finite = rows.filter(pl.col(SIZE).is_finite())[SIZE]
    right_edge = float(finite.max()) * 1.15 + 1 if len(finite) else 1.0  # type: ignore[operator]
    figure = Figure(figsize=(6.4, 4.6), layout="constrained")
    ax = figure.subplots()
    groups = [("feasible", rows.filter(pl.col("feasible")), dict(marker="o", color="C2")),
              ("infeasible", rows.filter(~pl.col("feasible") & pl.col(SIZE).is_finite()),
               dict(marker="o", facecolors="none", edgecolors="C7")),
              ("not detected (size inf)", rows.filter(pl.col(SIZE).is_infinite()),
               dict(marker=">", facecolors="none", edgecolors="C3"))]
    labels: dict[tuple[float, float], list[str]] = {}
    for label, group, style in groups:
        if group.height:
            x = [right_edge if math.isinf(s) else s for s in group[SIZE].to_list()]
            ax.scatter(x, group[QUALITY].to_list(), s=40, label=label, **style)
            for point, name in zip(zip(x, group[QUALITY].to_list(), strict=True), group["name"].to_list(),
                                   strict=True):
                labels.setdefault(point, []).append(name)
    # The workspace often repeats an experiment: one label per point, not overprinted names.
    for point, names in labels.items():
        ax.annotate(", ".join(names), point, textcoords="offset points", xytext=(4, 4), fontsize=7)
    if rows.filter(pl.col(SIZE).is_infinite()).height:
        ax.axvline(right_edge, color="C3", linestyle=":", linewidth=1)
        ax.annotate("size inf", (right_edge, 0), xycoords=("data", "axes fraction"), textcoords="offset points",
                    xytext=(-4, 4), ha="right", fontsize=7, color="C3")
    if selection.pick is not None:
        ax.scatter([selection.pick[SIZE]], [selection.pick[QUALITY]], marker="*", s=260, color="C1",
                   edgecolors="black", zorder=3, label=f"pick: {selection.pick['name']}")
    ax.axhline(c.min_relative_quality, color="C0", linestyle="--", linewidth=1,
               label=f"relative quality >= {c.min_relative_quality:g}")
    ax.set_xlabel("watermark size (median tokens to detect)")
    ax.set_ylabel("relative quality (watermarked / baseline)")
    ax.set_title(f"{selection.feasible.height} of {selection.table.height} settings feasible "
                 f"(R >= {c.min_tamper_resistance:g})", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return figure


def cells_markdown(cells: pl.DataFrame) -> str:
    """The per-cell picks of :func:`mmw.selection.cell_picks` as a Markdown table (temperature x family)."""
    lines = ["", "## Picks per temperature x scheme family", "",
             "| temperature | family | settings | feasible | pick | size | relative quality | R |", "|---|---|---|---|---|---|---|---|"]
    for row in cells.iter_rows(named=True):
        lines.append(f"| {_cell(row.get('model.temperature'))} | {_cell(row.get('family'))} | {row['n_settings']} | "
                     f"{row['n_feasible']} | {_cell(row.get('pick.name')) or '∞ (none feasible)'} | "
                     f"{_cell(row.get('pick.' + SIZE))} | {_cell(row.get('pick.' + QUALITY))} | "
                     f"{_cell(row.get('pick.' + RESISTANCE))} |")
    return "\n".join(lines) + "\n"
