"""A sweep's tables as files: the Parquet tables, ``results.csv`` and the Markdown of the paper's table (with or
without confirmation), the randomness and delta tables (``mmw sweep collect``). :mod:`mmw.sweep.collect` and
:mod:`mmw.sweep.cells` compute the tables; this writes them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from mmw.io import write_text, write_with
from mmw.reporting.data import family_label, watermark_names
from mmw.reporting.formats import fmt_tokens
from mmw.watermark.samplers import LABELS
from mmw.sweep.claims import PAIRWISE, PAPER
from mmw.sweep.confirm import Confirmation
from mmw.sweep.definition import Sweep


def _plain(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        return f"{value:.{digits}g}"
    return str(value)


def table_markdown(table: pl.DataFrame, scale: str) -> str:
    """The paper's layout: constraint blocks x temperature rows x family columns, ``median (MAD)`` cells;
    ``none`` when nothing in the cell is feasible, ``∞`` when the pick's median size is undetected (as the paper
    prints it and as reports/index.html shows it), ``pick N (no re-eval)`` when the pick was not re-evaluated."""
    def cell(r: dict[str, Any]) -> str:
        if r["config_id"] is None:
            return "none"
        if r["k"] and r["size_median"] is not None and math.isinf(r["size_median"]):
            return f"∞ k={r['k']}"  # a MAD around an undetected median means nothing
        if r["k"]:
            return f"{_plain(r['size_median'])} ({_plain(r['size_mad'])}) k={r['k']}"
        return f"pick {_plain(r['pick_size'])} (no re-eval)"

    lines = [f"Exploratory, not confirmed: size of the ideal watermark under four constraints ({scale}), each cell "
             "picked on one run and re-run on the same prompts, so sizes and quality are optimistic (no held-out "
             "confirmation). Cells: median (MAD) of the pick's size over its re-evaluations with fresh seeds and "
             "keys; ∞: undetected in half or more of the texts; none: no evaluated setting meets the constraint.",
             "", *paper_rows(table, cell, "≥")]
    return "\n".join(lines) + "\n"


def frame_markdown(frame: pl.DataFrame, title: str) -> str:
    lines = [f"{title}", ""]
    if frame.height == 0:
        return "\n".join([*lines, "(no finished configs)"]) + "\n"
    lines += ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_plain(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines) + "\n"


def _estimate(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "?"
    return "∞" if math.isinf(value) else f"{value:.{digits}g}"


def _detected(row: dict[str, Any]) -> str:
    """`` detected 0.51 (≤ 0.70)``: the pooled detected share and its upper bound, where the cell has them."""
    share, high = row.get("detected_share"), row.get("detected_high")
    return "" if share is None or high is None else f" detected {share:.2f} (≤ {high:.2f})"


def cell_text(row: dict[str, Any], names: Mapping[str, str] | None = None) -> str:
    """One cell of table.md: the status first; a number only for a confirmed cell (named after its pick when the
    pick is a provider's setting, ``names``: config id -> name, e.g. "Gumbel-max (vLLM's setting)"); a cell a
    later round judged ends with that round and the cell's level in all, e.g. ``(round 3, level 0.075)``."""
    text = _cell_text(row, names)
    if row.get("round"):
        text += f" ({row['round']}, level {row['level']:.4g})"
    return text


def _cell_text(row: dict[str, Any], names: Mapping[str, str] | None = None) -> str:
    status = row["status"]
    if status == "confirmed":
        text = f"**{_estimate(row['size_median'])}** ({_estimate(row['size_mad'])}) q≥{_estimate(row['quality_low'])}"
        if row["min_tamper_resistance"]:
            text += f" R>{_estimate(row['resistance_low'])}"
        named = (names or {}).get(row.get("config_id") or "")
        shown = named is not None and named != (names or {}).get(row.get("family") or "")
        return text + f" k={row['k']}" + (f" {named}" if shown else "")
    if status == "not confirmed":
        return f"not confirmed ({row['reason']}){_detected(row)}"
    if status == "unresolved":
        interval = f" q [{_estimate(row['quality_low'])}, {_estimate(row['quality_high'])}]" if row["quality_low"] is not None \
            else ""
        return f"unresolved ({row['reason']}){interval}{_detected(row)}"
    if status == "pending":
        return f"pending ({row['tries']}/{row['max_tries']} tried)"
    return "none"


#: The paper's family columns, in its order.
FAMILIES = tuple(LABELS)


def paper_rows(table: pl.DataFrame, cell: Callable[[dict[str, Any]], str], r_sign: str,
               names: Mapping[str, str] | None = None) -> list[str]:
    """The paper's layout as Markdown rows: constraint blocks x temperature rows x family columns, each cell
    ``cell(row)`` of its table row ("–" when the table has none); ``r_sign`` prints the R constraint; ``names``
    heads the columns (family -> name; default the family)."""
    # Outside watermarks (plugins) present in the table follow the paper's four families.
    families = FAMILIES + tuple(sorted(set(table["family"].drop_nulls().to_list()) - set(FAMILIES))) \
        if table.height else FAMILIES
    heads = [(names or {}).get(f, f) for f in families]
    lines = ["| constraint | T | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(families)]
    if table.height == 0:
        return lines
    for (loss, r_min), block in table.group_by(["max_quality_loss", "min_tamper_resistance"], maintain_order=True):
        label = f"{loss:.0%} quality, " + (f"R {r_sign} {r_min:g}" if r_min else "no R")
        for temperature in sorted(block["temperature"].unique().to_list()):
            cells = []
            for family in families:
                row = block.filter((pl.col("temperature") == temperature) & (pl.col("family") == family))
                cells.append(cell(row.row(0, named=True)) if row.height else "–")
            lines.append(f"| {label} | {temperature:g} | " + " | ".join(cells) + " |")
    return lines


def confirmed_markdown(table: pl.DataFrame, confirmation: Confirmation, tuning: int | None, scale: str,
                       names: Mapping[str, str] | None = None) -> str:
    """The paper's layout with statuses: confirmed cells show the median (MAD) size over the confirmation runs
    and the one-sided bounds that confirmed them; every other cell says why it is not an answer. ``tuning``: the
    tuning prompts per task; ``names``: watermark names by family and config id
    (:func:`mmw.reporting.data.watermark_names`)."""
    kinds = ", ".join(sorted(table["size_kind"].drop_nulls().unique().to_list())) if table.height else "-"
    lines = [f"Size of the ideal watermark under four constraints ({scale}), confirmed on held-out prompts "
             f"({confirmation.prompts} per task from position {confirmation.offset}; tuning {tuning} per task). "
             f"Confirmed cells: median (MAD) size ({kinds}) over the confirmation runs, with the one-sided bounds at "
             f"level {confirmation.level:g} per cell (split over up to {confirmation.max_tries} tries). Unresolved: an "
             "interval straddles the constraint — not a result. Undetected: an upper bound on the share of texts "
             "detected (over the prompts, at the try's level) lies below 1/2, so the median size is ∞; detection: "
             "that bound straddles 1/2.", "",
             *later_rounds(confirmation), *paper_rows(table, lambda row: cell_text(row, names), ">", names)]
    counts = table.group_by("status").len().sort("status").iter_rows() if table.height else []
    lines += ["", "Cells: " + ", ".join(f"{status} {n}" for status, n in counts)]
    return "\n".join(lines) + "\n"


def later_rounds(confirmation: Confirmation) -> list[str]:
    """The header lines of ``confirm.extend``: per later round its prompts, runs and level, and the level a cell
    judged in it carries in all (the union bound over its tries)."""
    lines = []
    for extension in confirmation.extend:
        per_t = sorted({(c.temperature, c.prompts, c.k) for c in extension.cells})
        shown = ", ".join(f"{p} per task at T = {t:g} (K = {k})" for t, p, k in per_t)
        lines.append(f"{extension.name.capitalize()} (declared before its data): each open cell it names re-tests "
                     f"its candidate once on fresh prompts from position {extension.offset} ({shown}; seeds from "
                     f"{extension.first_seed}, fresh keys) at level {extension.level:g}; a cell it judged errs with "
                     f"probability at most the sum of its rounds' levels (column `level`, "
                     f"{confirmation.level:g} + {extension.level:g} = {confirmation.level + extension.level:.4g}).")
    return [*lines, ""] if lines else []


def constraint_label(row: Mapping[str, Any]) -> str:
    """A table row's constraint in a few characters: ``10% q, R > 0.2`` or ``10% q, no R``."""
    r_min = row["min_tamper_resistance"]
    return f"{row['max_quality_loss']:.0%} q, " + (f"R > {r_min:g}" if r_min else "no R")


def plan_markdown(plan: pl.DataFrame, level: float, k: int) -> str:
    """The planner's table (:mod:`mmw.sweep.plan`) for table.md / the terminal."""
    lines = [f"Prompts needed to resolve each unresolved cell at level {level:g} (from the measured per-prompt "
             "spread at the runs per prompt K that costs least; ∞: the estimate sits on the constraint; floor: the "
             "fewest prompts any valid test needs at that margin) and the cost of K confirmation runs at that scale.",
             ""]
    if plan.height == 0:
        return "\n".join([*lines, "(no unresolved cell)"]) + "\n"
    lines += ["| constraint | T | family | now | estimate (heading) | quality needs | R needs | floor | runs K "
              "| per task | CPU h (here) | H100 h |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def show(value: float | None, digits: int = 0) -> str:
        if value is None:
            return "–"
        return "∞" if math.isinf(value) else f"{value:,.{digits}f}"

    for r in plan.iter_rows(named=True):
        label = constraint_label(r)
        estimate = "–" if r["quality"] is None else f"q {r['quality']:.3f} ({r['quality_toward']})"
        if r["resistance"] is not None:
            estimate += f", R {r['resistance']:.2f} ({r['r_toward']})"
        lines.append(f"| {label} | {r['temperature']:g} | {r['family']} | {r['n_prompts']} | {estimate} | "
                     f"{show(r['quality_prompts'])} | {show(r['r_prompts'])} | {show(r.get('floor_prompts'))} | "
                     f"{show(r.get('k'))} | {r.get('note') or show(r['prompts_per_task'])} | "
                     f"{show(None if r['cpu_s'] is None else r['cpu_s'] / 3600, 1)} | {show(r['h100_hours'], 2)} |")
    return "\n".join(lines) + "\n"


def claims_markdown(claims: pl.DataFrame) -> str:
    """The paper's orderings, then every pair of the table's columns with a confirmed side, judged on confirmed
    cells (:mod:`mmw.sweep.claims`), for table.md."""
    lines = ["The paper's orderings of size, judged on confirmed cells only: per comparison, a two-sided paired "
             "bootstrap interval over the confirmation prompts for the gap of median sizes (undetected = ∞); a "
             "confirmed cell beats one that is confidently out (a bound, not a point estimate, puts it out); a "
             "pending or unresolved cell leaves the claim open. Each row errs with probability at most its level; "
             "rows are not corrected for each other.", ""]
    if claims.height == 0:
        return "\n".join([*lines, "(no cell of this sweep bears on them)"]) + "\n"
    scope = claims["scope"] if "scope" in claims.columns else pl.Series([PAPER] * claims.height)
    paper, pairwise = claims.filter(scope != PAIRWISE), claims.filter(scope == PAIRWISE)
    lines += _claims_rows(paper) if paper.height else ["(no cell of this sweep bears on them)"]
    if pairwise.height:
        lines += ["", "Which watermark to deploy: every pair of the table's columns at a temperature and constraint "
                  "where one cell is confirmed, judged by the same rules (named smaller side first).", "",
                  *_claims_rows(pairwise)]
    return "\n".join(lines) + "\n"


def _claims_rows(claims: pl.DataFrame) -> list[str]:
    lines = ["| claim | T | constraint | verdict | comparisons | medians (smaller, than) | gap interval | "
             "size | prompts |", "|---|---|---|---|---|---|---|---|---|"]

    def size(value: float | None) -> str:  # a gap can be -inf (the claimed side detected, the other not)
        return "−∞" if value is not None and value == -math.inf else fmt_tokens(value)

    for r in claims.iter_rows(named=True):
        label = constraint_label(r)
        medians = "–" if r["median_smaller"] is None else f"{size(r['median_smaller'])}, {size(r['median_than'])}"
        gap = "–" if r["gap_low"] is None else f"[{size(r['gap_low'])}, {size(r['gap_high'])}]"
        lines.append(f"| {r['claim']} | {r['temperature']:g} | {label} | **{r['verdict']}** | {r['comparisons']} | "
                     f"{medians} | {gap} | {(r['size_kind'] or '–').removeprefix('all.')} | "
                     f"{r['n_prompts'] if r['n_prompts'] is not None else '–'} |")
    return lines


def race_markdown(summary: pl.DataFrame, costs: Mapping[str, Any]) -> str:
    """The race's decisions for table.md: per round, the units that ran, kept and dropped (by reason: quality or R
    confidently infeasible, size confidently above the cell's leaders), the cells that stopped (futile / budget);
    then the tuning time spent against the uniform grid's (``costs``: :func:`mmw.sweep.cost.measured_costs`)."""
    lines = ["", "The race: configurations dropped round by round (quality / R: confidently infeasible; size: "
             "confidently larger than the cell's leaders), at the cumulative prompts per task shown.", ""]
    if summary.height == 0:
        return "\n".join([*lines, "(no round has run)"]) + "\n"
    lines += ["| round | prompts per task | units | kept | dropped | quality | R | size | cells stopped |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in summary.iter_rows(named=True):
        lines.append(f"| {r['round']} | {r['prompts_per_task']} | {r['units']} | {r['kept']} | {r['dropped']} | "
                     f"{r['dropped_quality']} | {r['dropped_R']} | {r['dropped_size']} | {r['cells_stopped'] or '–'} |")
    spent, uniform = costs.get("race_tuning_s"), costs.get("uniform_tuning_s")
    lines.append("")
    if uniform:
        model = (f": {costs['unit_fixed_s']:g} s a unit + {costs['unit_per_prompt_s']:g} s a prompt"
                 if "unit_fixed_s" in costs else "")
        lines.append(f"Tuning time: the race {spent / 3600:,.2f} h over {costs['race_units']} units (measured); the "
                     f"uniform grid {uniform / 3600:,.2f} h ({costs['uniform_estimate']}{model}); ratio "
                     f"{costs['cost_ratio']:.3f}. Confirmation runs are the same in both.")
    else:
        lines.append(f"Tuning time: {costs.get('race_units', 0)} race units, no measured wall time.")
    return "\n".join(lines) + "\n"


def split_record(sweep: Sweep) -> dict[str, Any]:
    """``split.json``: where a confirmed sweep's tuning and confirmation prompts are, and its level."""
    confirmation = sweep.confirmation
    assert confirmation is not None
    return {"tuning_offset": sweep.tuning_offset, "tuning_prompts_per_task": sweep.tuning,
            "confirm_offset": confirmation.offset, "confirm_prompts_per_task": confirmation.prompts,
            "level": confirmation.level, "max_tries": confirmation.max_tries,
            "quality_losses": list(confirmation.quality_losses)}


def write_sweep_tables(out_dir: Path, frames: Mapping[str, pl.DataFrame], sweep: Sweep, scale: str,
                       plan_text: str = "") -> None:
    """Write every frame of ``frames`` as ``<name>.parquet``, ``results.csv``, ``table.md`` (confirmed when the
    sweep confirms, followed by ``plan_text``; else the exploratory picks), ``split.json``, ``randomness.md`` and
    ``delta.md`` to ``out_dir``. ``frames`` holds at least results, table, randomness and delta."""
    confirmation = sweep.confirmation
    results, table, randomness, delta = (frames[name] for name in ("results", "table", "randomness", "delta"))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        write_with(out_dir / f"{name}.parquet", frame.write_parquet)
    flat = results.select([c for c in results.columns if results[c].dtype != pl.Null] or results.columns)
    write_with(out_dir / "results.csv", flat.write_csv)
    if confirmation is not None:
        claims_text = "\n" + claims_markdown(frames["claims"]) if "claims" in frames else ""
        names = {f: family_label(f) for f in FAMILIES} | (watermark_names(results) if "family" in results.columns
                                                            else {})
        write_text(confirmed_markdown(table, confirmation, sweep.tuning, scale, names) + "\n" + plan_text
                   + claims_text,
                   out_dir / "table.md")
        write_text(json.dumps(split_record(sweep), indent=2) + "\n", out_dir / "split.json")
    else:
        write_text(table_markdown(table, scale), out_dir / "table.md")
    # With held-out prompts the randomness cells are confirmed like the paper's; the delta table stays a
    # description of the tuning runs' point estimates, and says so.
    held_out = confirmation is not None
    source = f"{scale}; tuning runs' point estimates, not confirmed" if held_out else scale
    shown = randomness.with_columns(pl.when(pl.col("status") == "confirmed").then(pl.col(c)).otherwise(None)
                                    for c in ("size_median", "size_mad")) if held_out else randomness
    write_text(frame_markdown(shown, f"Text-dependent vs fixed randomness: smallest size at quality loss "
                              f"<= 10 % ({scale}; window 0 excluded"
                              + ("; confirmed on held-out prompts: a size only where status is confirmed)"
                                 if held_out else ")")), out_dir / "randomness.md")
    write_text(frame_markdown(delta, f"Size-quality trade-off over delta, distribution shift ({source})"),
               out_dir / "delta.md")
