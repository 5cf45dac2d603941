"""The report's figures (matplotlib), returned as inline SVG markup: the page needs no script and no network.

Text stays text in the SVG (``svg.fonttype: none``: smaller, searchable, crisp at any zoom) and the element ids
are salted per figure, so several figures can share one page and a rerun on the same data writes the same file.
"""

from __future__ import annotations

import io
import math
import textwrap
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
import polars as pl
from matplotlib.patches import Patch
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from mmw.reporting.data import (
    SingleRun,
    Sweep,
    attack_points,
    family_label,
    hull,
    picks,
    representatives,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: Colour per family (the paper's four first), stable across figures.
FAMILY_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


def to_svg(figure: Figure, name: str) -> str:
    """``<svg ...>...</svg>`` of ``figure`` (no XML prolog; ids salted with ``name``; no date: reproducible)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"mmw-{name}"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


def _family_styles(families: list[str]) -> dict[str, dict[str, str]]:
    return {f: {"color": FAMILY_COLORS[i % len(FAMILY_COLORS)], "marker": MARKERS[i % len(MARKERS)]}
            for i, f in enumerate(families)}


def _grid(n: int, per_row: int, width: float, height: float) -> tuple[Figure, list[Axes]]:
    from matplotlib.figure import Figure

    cols = max(1, min(n, per_row))
    rows = max(1, math.ceil(n / cols))
    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = list(figure.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return figure, axes[:n]


def _legend_columns(labels: list[str], width_in: float) -> int:
    """How many legend entries fit side by side in ``width_in`` inches (a long name such as "SynthID-Text
    (transformers)" takes about 2 inches at the legend's size): the rest wrap to new rows instead of being cut off
    at the figure's edge."""
    widest = max((len(label) for label in labels), default=1)
    per_entry = 0.5 + 0.075 * widest  # marker and gap, then ~0.075 in a character at 9-10 pt
    return max(1, min(len(labels), int(width_in // per_entry)))


def has_sizes(sweep: Sweep) -> bool:
    """Whether Figure 1 has something to draw: some cell under some constraint has a size to show, a bar or ∞ (a
    confirmed table shows only confirmed cells' sizes)."""
    for constraint in sweep.constraints:
        rows = picks(sweep, constraint)
        sizes = pl.concat([rows["size_median"], rows.filter(pl.col("k").fill_null(0) == 0)["pick_size"]])
        if sizes.drop_nulls().drop_nans().len():
            return True
    return False


#: How Figure 1 marks a cell without a bar: its status (a confirmed table) -> the mark.
STATUS_MARKS = {"unresolved": "?", "not confirmed": "✗", "pending": "…"}


def figure_sizes(sweep: Sweep) -> Figure:
    """The paper's Figure 1, per constraint: re-evaluated size (median, MAD error bar) per family x temperature.

    Picks that are not detected in half the texts (size ∞) are marked ∞ at the top of the panel; picks not
    re-evaluated show their selection-time size as a hollow bar marked *; cells where no setting met the
    constraint are marked "none" on the axis; in a confirmed table, unresolved cells "?", not confirmed "✗",
    pending "…" (no size is a result there); a panel with no bar says so.
    """
    constraints = sweep.constraints
    figure, axes = _grid(len(constraints), 2, 6.2, 3.6)
    families, temperatures = sweep.families, sweep.temperatures
    styles = _family_styles(families)
    width = 0.8 / max(len(families), 1)
    for ax, constraint in zip(axes, constraints, strict=True):
        rows = {(r["temperature"], r["family"]): r for r in picks(sweep, constraint).iter_rows(named=True)}
        finite = [v for r in rows.values() for v in (r["size_median"], r["pick_size"] if not r["k"] else None)
                  if v is not None and math.isfinite(v)]
        top = max(finite, default=100.0) * 1.35
        for i, family in enumerate(families):
            for j, t in enumerate(temperatures):
                row = rows.get((t, family))
                x = j - 0.4 + width * (i + 0.5)
                if row is None:
                    continue
                median = row["size_median"]
                mark = STATUS_MARKS.get(row.get("status") or "")
                if row["config_id"] is None:
                    ax.text(x, top * 0.02, "none", rotation=90, ha="center", va="bottom", fontsize=7,
                            color=styles[family]["color"])
                elif mark is not None and median is None:
                    ax.text(x, top * 0.02, mark, ha="center", va="bottom", fontsize=10, color=styles[family]["color"])
                elif median is not None and math.isinf(median):
                    ax.text(x, top * 0.985, "∞", ha="center", va="top", fontsize=14, color=styles[family]["color"])
                elif not row["k"] and row["pick_size"] is not None and math.isfinite(row["pick_size"]):
                    # Not re-evaluated: the optimistic selection-time size, hollow and starred.
                    ax.bar(x, row["pick_size"], width, color="none", edgecolor=styles[family]["color"],
                           hatch="//", lw=0.8)
                    ax.text(x, row["pick_size"], "*", ha="center", va="bottom", fontsize=10)
                elif median is not None:
                    mad = row["size_mad"] if (row["k"] or 0) > 1 else None
                    ax.bar(x, median, width, color=styles[family]["color"], alpha=0.85,
                           yerr=None if mad is None else [[mad], [mad]], capsize=2, ecolor="black")
        if not finite:
            ax.text(0.5, 0.55, "no confirmed size under this constraint", transform=ax.transAxes, ha="center",
                    va="center", color="grey", fontsize=9)
        ax.set_xticks(range(len(temperatures)), [f"T = {t:g}" for t in temperatures])
        ax.set_xlim(-0.5, len(temperatures) - 0.5)
        ax.set_ylim(0, top)
        ax.set_ylabel("watermark size (tokens)")
        ax.set_title(constraint.label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=styles[f]["color"], label=family_label(f)) for f in families]
    marks = [Patch(color="none", label=f"{mark} {status}") for status, mark in STATUS_MARKS.items()] \
        if sweep.confirmed else []
    labels = [h.get_label() for h in handles + marks]
    figure.legend(handles=handles + marks, loc="outside lower center", frameon=False,
                  ncols=_legend_columns(labels, figure.get_figwidth()))
    return figure


def figure_size_quality(sweep: Sweep, max_losses: tuple[float, ...] = (0.01, 0.10)) -> Figure:
    """Every done setting: size (log) vs relative quality, colour = tamper resistance R, one panel per
    temperature (the paper's "size versus quality of all parameter settings"). Undetected settings (∞) sit on a
    band at the top of each panel, drawn as hollow markers; dashed lines mark the quality-loss targets."""
    from matplotlib.colors import Normalize

    done = sweep.done.filter(pl.col("all.relative_quality").is_not_null() & pl.col("all.size").is_not_null())
    temperatures = sweep.temperatures
    figure, axes = _grid(len(temperatures), 4, 3.6, 3.4)
    styles = _family_styles(sweep.families)
    norm = Normalize(0.0, 1.0)
    finite = done.filter(pl.col("all.size").is_finite())["all.size"]
    ceiling = float(finite.max()) * 2.0 if len(finite) else 1000.0  # type: ignore[arg-type]
    mappable = None
    for ax, t in zip(axes, temperatures, strict=True):
        rows = done.filter(pl.col("model.temperature") == t)
        for family in sweep.families:
            sub = rows.filter(pl.col("family") == family)
            if not sub.height:
                continue
            size = sub["all.size"].to_numpy()
            quality = sub["all.relative_quality"].to_numpy()
            resistance = sub["all.tamper_resistance"].fill_null(0.0).to_numpy()
            detected = np.isfinite(size)
            mappable = ax.scatter(quality[detected], size[detected], c=resistance[detected], cmap="viridis_r",
                                  norm=norm, marker=styles[family]["marker"], s=26, edgecolors="black",
                                  linewidths=0.3)
            ax.scatter(quality[~detected], np.full((~detected).sum(), ceiling), marker=styles[family]["marker"],
                       s=22, facecolors="none", edgecolors="grey", linewidths=0.6)
        for loss in max_losses:
            ax.axvline(1 - loss, color="grey", ls="--", lw=0.8)
        ax.axhline(ceiling, color="grey", ls=":", lw=0.6)
        ax.set_yscale("log")
        # Ticks at 1-2-5 steps: a panel spanning less than a decade would otherwise show a single label.
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"T = {t:g} ({rows.height} settings)", fontsize=10)
        ax.set_xlabel("relative quality (watermarked / baseline)")
        ax.grid(alpha=0.3)
    if axes:
        axes[0].set_ylabel("watermark size (tokens, log)")
    if mappable is not None:
        figure.colorbar(mappable, ax=axes, label="tamper resistance R", shrink=0.85)
    handles = [axes[0].scatter([], [], marker=styles[f]["marker"], color="grey", label=family_label(f))
               for f in sweep.families] if axes else []
    figure.legend(handles=handles, loc="outside lower center", frameon=False,
                  ncols=_legend_columns([family_label(f) for f in sweep.families], figure.get_figwidth() * 0.85))
    return figure


def _no_attack(sweep: Sweep, config: str) -> float | None:
    row = sweep.results.filter(pl.col("config_id") == config)
    return row["all.detection_rate"][0] if row.height else None


def figure_tamper_hulls(sweep: Sweep) -> Figure:
    """Per family: the attacks on its representative setting at each temperature (the pick of the tightest
    constraint that has one) and the attacker's convex-hull frontier; the area under it is R / 2."""
    families, temperatures = sweep.families, sweep.temperatures
    chosen = representatives(sweep)
    figure, axes = _grid(len(families), 4, 3.5, 3.6)
    colors = matplotlib.colormaps["plasma"](np.linspace(0.05, 0.8, max(len(temperatures), 1)))
    for ax, family in zip(axes, families, strict=True):
        for t, color in zip(temperatures, colors, strict=True):
            config = chosen.get((t, family))
            if config is None:
                continue
            points = attack_points(sweep, config)
            if not points.height:
                continue
            frontier, resistance = hull(points, _no_attack(sweep, config))
            ax.plot(frontier[:, 0], frontier[:, 1], color=color, lw=1.6, label=f"T = {t:g}: R = {resistance:.2f}")
            counted = points.filter(pl.col("in_R"))
            ax.scatter(counted["quality_retained"], counted["watermarked"], color=color, s=14, alpha=0.8)
            excluded = points.filter(~pl.col("in_R"))
            ax.scatter(excluded["quality_retained"], excluded["watermarked"], color=color, marker="x", s=18)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.7, ls=":")
        ax.set(xlim=(-0.02, 1.04), ylim=(-0.02, 1.04), xlabel="quality retained $Q_A$", title=family_label(family))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", frameon=False)
        else:
            ax.text(0.5, 0.5, "no attack results", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.grid(alpha=0.3)
    if axes:
        axes[0].set_ylabel("still watermarked $W_A$")
    return figure


def figure_fpr(sweep: Sweep, alpha: float) -> Figure:
    """False-positive rate of every done setting on unwatermarked texts, per family (x) and temperature (colour):
    full text (circles) and any prefix (triangles), with the detector's alpha as a dashed line."""
    done = sweep.done
    families, temperatures = sweep.families, sweep.temperatures
    # About an inch per family: a label like "SynthID-Text (transformers)", wrapped, fits under its group.
    figure, axes = _grid(1, 1, max(7.5, 1.15 * len(families) + 1.8), 3.6)
    ax = axes[0]
    colors = matplotlib.colormaps["plasma"](np.linspace(0.05, 0.8, max(len(temperatures), 1)))
    rng = np.random.default_rng(0)  # jitter only: points of one family/temperature would overprint
    span = 0.8 / max(len(temperatures), 1)
    for i, family in enumerate(families):
        for j, (t, color) in enumerate(zip(temperatures, colors, strict=True)):
            rows = done.filter((pl.col("family") == family) & (pl.col("model.temperature") == t))
            x0 = i - 0.4 + span * (j + 0.5)
            for column, marker, offset in (("all.fpr", "o", -0.18), ("all.fpr_any_prefix", "^", 0.18)):
                values = rows[column].drop_nulls().to_numpy()
                x = x0 + offset * span + rng.uniform(-0.12, 0.12, len(values)) * span
                ax.scatter(x, values, marker=marker, s=14, color=color, alpha=0.75,
                           label=f"T = {t:g}" if i == 0 and marker == "o" else None)
    ax.axhline(alpha, color="black", ls="--", lw=0.8, label=f"alpha = {alpha:g}")
    ax.scatter([], [], marker="o", color="grey", label="full text")
    ax.scatter([], [], marker="^", color="grey", label="any prefix")
    ax.set_xticks(range(len(families)), [textwrap.fill(family_label(f), 14) for f in families], fontsize=8)
    ax.set_xlim(-0.5, len(families) - 0.5)
    ax.set_ylabel("false-positive rate")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return figure


def figure_single_hull(run: SingleRun) -> Figure:
    """One run: every attack (Q_A, W_A) and the attacker's frontier over those counted in R."""
    figure, (ax,) = _grid(1, 1, 5.0, 4.2)
    points = run.attacks.filter(pl.col("quality_retained").is_not_null() & pl.col("watermarked").is_not_null())
    frontier, resistance = hull(points, run.metrics.get("all", {}).get("detection_rate"))
    ax.fill_between(frontier[:, 0], frontier[:, 1], color="tab:blue", alpha=0.12)
    ax.plot(frontier[:, 0], frontier[:, 1], color="tab:blue", lw=1.6, label=f"hull frontier (R = {resistance:.2f})")
    for i, row in enumerate(points.iter_rows(named=True)):
        ax.scatter(row["quality_retained"], row["watermarked"], color=FAMILY_COLORS[i % len(FAMILY_COLORS)],
                   marker="o" if row["in_R"] else "x", s=36, label=row["attack"], zorder=3)
    ax.plot([0, 1], [0, 1], color="grey", lw=0.7, ls=":")
    ax.set(xlim=(-0.02, 1.04), ylim=(-0.02, 1.04), xlabel="quality retained $Q_A$", ylabel="still watermarked $W_A$")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    return figure


def figure_single_sizes(run: SingleRun) -> Figure:
    """One run: share of texts detected within n tokens, watermarked vs unwatermarked baseline."""
    figure, (ax,) = _grid(1, 1, 5.0, 3.6)
    for source, color in (("watermarked", "tab:blue"), ("baseline", "tab:grey")):
        curve = run.size_curves.get(source)
        if curve is not None:
            ax.step(curve["tokens"], curve["detected_share"], where="post", color=color, label=source)
    ax.axhline(0.5, color="black", lw=0.6, ls=":")
    ax.set(xlabel="tokens", ylabel="share detected within n tokens", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    return figure

