"""What the report shows, computed from a sweep's tables or from one run's ``reports/metrics.json``.

A sweep directory ``reports/sweeps/<name>/`` holds (contract of the sweep, docs/REPORT.md):

- ``results.parquet``: one row per configuration: ``config_id``, ``status`` (done|failed|missing), the params as
  dotted columns (``model.temperature``, ``scheme.delta``, ...), ``family`` (the sampler), ``randomness_kind``,
  the metrics of the pooled group as ``all.<metric>`` columns, ``wall_s``.
- ``attacks.parquet``: one row per configuration and attack: ``config_id, attack, watermarked, quality_retained``.
- ``table.parquet``: the paper's table: per ``temperature, family, max_quality_loss, min_tamper_resistance`` the
  picked ``config_id`` and its re-evaluated size ``size_median, size_mad`` over ``k`` fresh seeds and keys, plus
  the pick's params.

Every column except ``config_id`` is optional here: a missing one reads as null, so a sweep that is still running
(or an older table) still renders, with "–" where a number is missing. Extra columns are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mmw import provenance

from mmw.watermark import plugins
from mmw.errors import SpecError
from mmw.metrics import tamper_frontier, tamper_resistance
from mmw.reporting.formats import finite, fmt_number, fmt_percent, fmt_tokens
from mmw.watermark.samplers import LABELS

#: results.parquet columns the report reads (dtype when absent: filled with nulls).
RESULT_COLUMNS: dict[str, pl.DataType] = {
    "status": pl.String(), "error": pl.String(), "family": pl.String(), "randomness_kind": pl.String(),
    "scheme.sampler": pl.String(), "model.temperature": pl.Float64(), "model.name": pl.String(),
    "model.max_new_tokens": pl.Int64(), "seed": pl.Int64(), "wall_s": pl.Float64(),
    "all.size": pl.Float64(), "all.size_valid": pl.Float64(), "all.relative_quality": pl.Float64(),
    "all.relative_quality_ci_low": pl.Float64(), "all.relative_quality_ci_high": pl.Float64(),
    "all.tamper_resistance": pl.Float64(), "all.fpr": pl.Float64(), "all.fpr_any_prefix": pl.Float64(),
    "all.generations": pl.Float64(), "all.mean_tokens": pl.Float64(), "all.detection_rate": pl.Float64(),
    "all.fpr_n": pl.Float64(),
}
TABLE_COLUMNS: dict[str, pl.DataType] = {
    "temperature": pl.Float64(), "family": pl.String(), "max_quality_loss": pl.Float64(),
    "min_tamper_resistance": pl.Float64(), "config_id": pl.String(), "size_median": pl.Float64(),
    "size_mad": pl.Float64(), "k": pl.Int64(), "pick_size": pl.Float64(),
    # Confirmed tables (held-out prompts): the cell's status and evidence; null in older tables.
    "status": pl.String(), "reason": pl.String(), "size_kind": pl.String(), "quality_low": pl.Float64(),
    "quality_high": pl.Float64(), "resistance_low": pl.Float64(), "resistance_high": pl.Float64(),
    "n_prompts": pl.Int64(), "level": pl.Float64(), "tries": pl.Int64(), "e_median": pl.Float64(),
}
#: Confirmed-table columns left out of a cell's hover text (the evidence is written out separately).
_EVIDENCE = {"quality", "resistance", "alpha", "max_tries", "k_planned", "n_attacked", "pending", "n_settings",
             "n_feasible"}
ATTACK_COLUMNS: dict[str, pl.DataType] = {
    "config_id": pl.String(), "attack": pl.String(), "watermarked": pl.Float64(),
    "quality_retained": pl.Float64(), "in_R": pl.Boolean(),
}
#: Optional tables a sweep may hold: the picks' re-evaluations (fresh seeds and keys), text-dependent vs fixed
#: randomness, the size-quality trade-off over delta, per-stage timings, the power planner's rows and the paper's
#: orderings judged on the confirmed cells (confirmed sweeps), the race's rounds (adaptive sweeps).
EXTRA_TABLES = ("reevaluations", "randomness", "delta", "timings", "plan", "claims", "race", "prompts")
#: The paper's headline constraint (Figure 1): quality loss <= 1 %, tamper resistance > 0.2.
MAIN_CONSTRAINT = (0.01, 0.2)


def family_label(family: str | None) -> str:
    """Display name of a sampler family (unknown ones: underscores to spaces, capitalized)."""
    if family is None:
        return "unknown"
    if family in LABELS:
        return LABELS[family]
    if family in plugins.installed():  # an outside watermark's family is its plugin
        return plugins.label(family)
    return family.replace("_", " ").capitalize()


#: Deployed watermarks that are mmw's own samplers at a provider's setting, as the provider ships them (sweeps/
#: deployed.yaml): (family, params that must match) -> name. An outside watermark's plugin names itself.
PROVIDER_SETTINGS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("exponential", {"scheme.window": 4, "scheme.score": "sum", "scheme.randomness": "window"},
     "Gumbel-max (vLLM's setting)"),
    ("reweight", {}, "DiPmark"),
)


def watermark_name(row: dict[str, Any]) -> str:
    """A configuration as a reader knows it (``row``: a results row with ``family`` and the params as dotted
    columns): a provider's setting by its name ("Gumbel-max (vLLM's setting)", "DiPmark"), an outside
    watermark by its plugin's label ("SynthID-Text (transformers)"), else the family's label."""
    family = row.get("family")
    for name_family, params, name in PROVIDER_SETTINGS:
        if family == name_family and all(row.get(k) == v for k, v in params.items()) \
                and not (row.get("scheme.skip_prob") or 0):
            return name
    return family_label(family)


def watermark_names(results: pl.DataFrame) -> dict[str, str]:
    """Config id -> :func:`watermark_name`, and family -> its label (for cells without a pick)."""
    names = {f: family_label(f) for f in results["family"].drop_nulls().unique().to_list()} \
        if "family" in results.columns else {}
    names.update({r["config_id"]: watermark_name(r) for r in results.iter_rows(named=True)})
    return names


def ordered_families(values: Iterable[str | None]) -> list[str]:
    """The families present, the paper's four first (in its order), then any others alphabetically."""
    present = {v for v in values if v is not None}
    return [f for f in LABELS if f in present] + sorted(present - set(LABELS))


def _with_columns(frame: pl.DataFrame, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    """``frame`` with every column of ``columns`` present (absent ones as typed nulls; present ones cast)."""
    exprs = []
    for name, dtype in columns.items():
        if name in frame.columns:
            exprs.append(pl.col(name).cast(dtype, strict=False))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return frame.with_columns(exprs)


# --- the paper's constraints -------------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Constraint:
    """One of the paper's deployment targets: quality loss at most ``max_quality_loss`` and tamper resistance
    above ``min_tamper_resistance`` (None or <= 0: no tamper-resistance target)."""

    max_quality_loss: float
    min_tamper_resistance: float | None

    @property
    def label(self) -> str:
        quality = f"quality loss ≤ {100 * self.max_quality_loss:g}%"
        resistance = ("no tamper-resistance target" if not self.min_tamper_resistance
                      else f"R > {self.min_tamper_resistance:g}")
        return f"{quality}, {resistance}"

    def sort_key(self) -> tuple[float, float]:
        """The paper's order: tighter quality first, then with the R target before without."""
        return (self.max_quality_loss, -(self.min_tamper_resistance or 0.0))


def _constraint_expr(constraint: Constraint) -> pl.Expr:
    quality = (pl.col("max_quality_loss") - constraint.max_quality_loss).abs() < 1e-9
    if not constraint.min_tamper_resistance:
        return quality & (pl.col("min_tamper_resistance").is_null() | (pl.col("min_tamper_resistance") <= 0))
    return quality & ((pl.col("min_tamper_resistance") - constraint.min_tamper_resistance).abs() < 1e-9)


# --- the sweep ---------------------------------------------------------------------------------------------------

@dataclass
class Sweep:
    """A sweep's tables, with every column the report reads present (see the module docstring)."""

    name: str
    directory: Path
    results: pl.DataFrame
    attacks: pl.DataFrame | None
    table: pl.DataFrame | None
    meta: dict[str, Any] = field(default_factory=dict)
    #: Optional tables of the sweep (name -> frame): reevaluations, randomness, delta, timings.
    extras: dict[str, pl.DataFrame] = field(default_factory=dict)

    @property
    def done(self) -> pl.DataFrame:
        return self.results.filter(pl.col("status") == "done")

    @property
    def families(self) -> list[str]:
        values = self.results["family"].to_list()
        if self.table is not None:
            values += self.table["family"].to_list()
        return ordered_families(values)

    @property
    def temperatures(self) -> list[float]:
        values = set(self.results["model.temperature"].drop_nulls().to_list())
        if self.table is not None:
            values |= set(self.table["temperature"].drop_nulls().to_list())
        return sorted(values)

    @property
    def confirmed(self) -> bool:
        """Whether the table's cells were confirmed on held-out prompts (each carries a status); a table without
        statuses was picked and re-run on its tuning prompts: exploratory, not a result."""
        return self.table is not None and self.table["status"].drop_nulls().len() > 0

    @property
    def constraints(self) -> list[Constraint]:
        if self.table is None:
            return []
        found = {Constraint(float(q), None if r is None or r <= 0 else float(r))
                 for q, r in self.table.select("max_quality_loss", "min_tamper_resistance").unique().iter_rows()
                 if q is not None}
        return sorted(found, key=Constraint.sort_key)


def _undetected_as_inf(results: pl.DataFrame) -> pl.DataFrame:
    """metrics.json stores an undetected size as null next to ``<size>_undetected_share`` (>= 1/2: the median is
    +inf); the report shows ∞ there and keeps null (–) for a missing number."""
    exprs = []
    for size in ("all.size", "all.size_valid"):
        share = f"{size}_undetected_share"
        if share in results.columns:
            exprs.append(pl.when(pl.col(size).is_null() & (pl.col(share) >= 0.5)).then(float("inf"))
                         .otherwise(pl.col(size)).alias(size))
    return results.with_columns(exprs) if exprs else results


def load_sweep(directory: Path) -> Sweep:
    """Read ``directory`` (``reports/sweeps/<name>``); SpecError naming the file when results are absent."""
    results_path = directory / "results.parquet"
    if not results_path.is_file():
        raise SpecError("sweep", f"no results table at {results_path} (run `mmw sweep collect` first)")
    results = pl.read_parquet(results_path)
    if "config_id" not in results.columns:
        raise SpecError("sweep", f"{results_path} has no config_id column", "the sweep results contract")
    results = _undetected_as_inf(
        _with_columns(results.with_columns(pl.col("config_id").cast(pl.String)), RESULT_COLUMNS))
    # family = sampler by contract; an older table may only have the param.
    results = results.with_columns(pl.col("family").fill_null(pl.col("scheme.sampler")),
                                   pl.col("status").fill_null("done"))
    attacks = table = None
    if (directory / "attacks.parquet").is_file():
        attacks = _with_columns(pl.read_parquet(directory / "attacks.parquet"), ATTACK_COLUMNS)
        # Paraphrases are excluded from R (paper, "Tamper resistance"); a table without in_R is read by name.
        attacks = attacks.with_columns(
            pl.col("in_R").fill_null(~pl.col("attack").str.starts_with("paraphrase")))
    if (directory / "table.parquet").is_file():
        table = _with_columns(pl.read_parquet(directory / "table.parquet"), TABLE_COLUMNS)
    meta: dict[str, Any] = {}
    for path in sorted(directory.glob("*.json")):
        if path.name == "judge.json":  # shown in its own section
            continue
        try:
            content = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(content, dict):
            meta.update({k: v for k, v in content.items() if isinstance(v, str | int | float | bool)})
    extras = {name: pl.read_parquet(directory / f"{name}.parquet") for name in EXTRA_TABLES
              if (directory / f"{name}.parquet").is_file()}
    return Sweep(directory.name, directory, results, attacks, table, meta, extras)


def confirmed_cells(directory: Path) -> int | None:
    """How many cells of ``directory``'s table.parquet were confirmed on held-out prompts; None when the table
    carries no confirmation statuses (an exploratory table, or none)."""
    path = directory / "table.parquet"
    if not path.is_file() or "status" not in pl.read_parquet_schema(path):
        return None
    status = pl.read_parquet(path, columns=["status"])["status"].drop_nulls()
    return int((status == "confirmed").sum()) if status.len() else None


def has_confirmed_table(directory: Path) -> bool:
    """Whether ``directory``'s table.parquet carries confirmation statuses (see :attr:`Sweep.confirmed`)."""
    return confirmed_cells(directory) is not None


def latest_sweep(root: Path) -> Path | None:
    """The sweep directory under ``root`` to show first (None when there is none): a confirmed sweep before an
    exploratory one, then the one with the most confirmed cells (an answer before a table of unresolved cells),
    then by name. Decided from the tables alone: file times are not recorded history (a clone or checkout resets
    them), so the same tables always lead with the same sweep."""
    candidates = sorted(p.parent for p in root.glob("*/results.parquet"))

    def rank(directory: Path) -> tuple[bool, int]:
        confirmed = confirmed_cells(directory)
        return confirmed is not None, confirmed or 0

    # max keeps the first of equals: with names sorted, ties go to the alphabetically first sweep.
    return max(candidates, key=rank, default=None)


# --- the paper's table -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One cell of the paper's table: ``text`` like ``53 (1.5)``, ``k`` re-evaluations, ``title`` the pick."""

    text: str
    k: int | None
    title: str
    kind: str  # value | inf | infeasible | unreevaluated | missing
    #: The pick as a provider knows it, where that differs from its column (e.g. "Gumbel-max (vLLM's setting)"
    #: in the exponential column); shown under a confirmed size.
    name: str = ""


#: table.parquet columns that are not the pick's params.
_TABLE_CORE = set(TABLE_COLUMNS) | _EVIDENCE


def _bound(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def _status_cell(row: dict[str, Any], title: str) -> Cell | None:
    """A confirmed table's cell that is not an answer (not confirmed / unresolved / pending), or None for a
    confirmed cell or an older table (no status)."""
    status = row.get("status")
    if status is None or status == "confirmed":
        return None
    interval = (f"; relative quality [{_bound(row.get('quality_low'))}, {_bound(row.get('quality_high'))}], "
                f"R [{_bound(row.get('resistance_low'))}, {_bound(row.get('resistance_high'))}] "
                f"on {row.get('n_prompts')} held-out prompts" if row.get("quality_low") is not None else "")
    if status == "no feasible setting":
        return Cell("none", None, "no evaluated setting meets this constraint", "infeasible")
    text = {"not confirmed": f"✗ {row.get('reason') or ''}".strip(), "unresolved": "unresolved",
            "pending": "pending"}.get(status, status)
    return Cell(text, row.get("k"), f"{title}: {status} ({row.get('reason') or 'awaiting runs'}){interval}",
                "unresolved" if status == "unresolved" else "unconfirmed")


def _cell(row: dict[str, Any] | None) -> Cell:
    if row is None:
        return Cell("–", None, "not in the table", "missing")
    if row["config_id"] is None and row.get("status") in (None, "no feasible setting"):
        return Cell("none", None, "no evaluated setting meets this constraint", "infeasible")
    params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                       if k not in _TABLE_CORE and v is not None)
    title = f"config {row['config_id']}" + (f": {params}" if params else "")
    unanswered = _status_cell(row, title)
    if unanswered is not None:
        return unanswered
    if row.get("status") == "confirmed":
        title += (f"; confirmed at level {_bound(row.get('level'))} on {row.get('n_prompts')} held-out prompts: "
                  f"relative quality ≥ {_bound(row.get('quality_low'))}"
                  + (f", R > {_bound(row.get('resistance_low'))}" if row.get("resistance_low") is not None else "")
                  + f"; size kind {row.get('size_kind')}")
    median, mad, k = finite(row["size_median"]), finite(row["size_mad"]), row["k"]
    if not k and row["pick_size"] is not None:  # picked but not (yet) re-evaluated: the optimistic size
        return Cell(f"{fmt_tokens(row['pick_size'])}*", None,
                    title + " (selection-time size, not re-evaluated)", "unreevaluated")
    if median is not None and math.isinf(median):
        return Cell("∞", k, title + " (not detected in half or more of the texts)", "inf")
    # The MAD with one decimal, as the paper prints it ("55 (0.5)", "178.5 (6.0)"); none from one evaluation.
    spread = f" ({mad:.1f})" if mad is not None and math.isfinite(mad) and (k or 0) > 1 else ""
    return Cell(fmt_tokens(median) + spread, k, title, "value" if median is not None else "missing")


@dataclass(frozen=True)
class TableBlock:
    """One constraint's block of the paper's table: per temperature, one cell per family."""

    constraint: Constraint
    rows: list[tuple[float, list[Cell]]]


def paper_table(sweep: Sweep) -> list[TableBlock]:
    """The appendix table "Size of ideal watermark under four tested constraints", from table.parquet."""
    if sweep.table is None:
        return []
    names = watermark_names(sweep.results)
    blocks = []
    for constraint in sweep.constraints:
        rows = sweep.table.filter(_constraint_expr(constraint))
        by_key = {(r["temperature"], r["family"]): r for r in rows.iter_rows(named=True)}
        blocks.append(TableBlock(constraint, [
            (t, [_named(_cell(by_key.get((t, f))), by_key.get((t, f)), names) for f in sweep.families])
            for t in sweep.temperatures if any((t, f) in by_key for f in sweep.families)]))
    return blocks


def _named(cell: Cell, row: dict[str, Any] | None, names: dict[str, str]) -> Cell:
    """``cell`` naming its confirmed pick when the pick's name is not its column's."""
    if row is None or cell.kind != "value" or row.get("config_id") is None:
        return cell
    name = names.get(row["config_id"], "")
    return dataclasses.replace(cell, name=name) if name and name != family_label(row["family"]) else cell


def picks(sweep: Sweep, constraint: Constraint) -> pl.DataFrame:
    """table.parquet rows of one constraint: ``temperature, family, config_id, size_median, size_mad, k,
    pick_size``."""
    if sweep.table is None:
        return pl.DataFrame(schema={n: TABLE_COLUMNS[n] for n in
                                    ("temperature", "family", "config_id", "size_median", "size_mad", "k",
                                     "pick_size", "status")})
    rows = sweep.table.filter(_constraint_expr(constraint)).select(
        "temperature", "family", "config_id", "size_median", "size_mad", "k", "pick_size", "status")
    if rows["status"].drop_nulls().len():  # a confirmed table: only confirmed cells have a size to show
        rows = rows.with_columns(pl.when(pl.col("status") == "confirmed").then(pl.col(c)).otherwise(None).alias(c)
                                 for c in ("size_median", "size_mad", "pick_size"))
    return rows


def representatives(sweep: Sweep) -> dict[tuple[float, str], str]:
    """(temperature, family) -> the configuration shown for tamper resistance: the pick under the tightest
    constraint that has one (the paper's order), else the done configuration of that cell with the highest R."""
    chosen: dict[tuple[float, str], str] = {}
    for constraint in sweep.constraints:
        for row in picks(sweep, constraint).drop_nulls("config_id").iter_rows(named=True):
            chosen.setdefault((row["temperature"], row["family"]), row["config_id"])
    best = (sweep.done.drop_nulls("all.tamper_resistance").sort("all.tamper_resistance", descending=True)
            .unique(subset=["model.temperature", "family"], keep="first", maintain_order=True))
    for row in best.iter_rows(named=True):
        chosen.setdefault((row["model.temperature"], row["family"]), row["config_id"])
    return chosen


# --- tamper resistance and attacks -------------------------------------------------------------------------------

def attack_points(sweep: Sweep, config_id: str) -> pl.DataFrame:
    """Attack rows ``attack, in_R, quality_retained, watermarked`` of one configuration (plottable ones)."""
    if sweep.attacks is None:
        return pl.DataFrame(schema={"attack": pl.String, "in_R": pl.Boolean, "quality_retained": pl.Float64,
                                    "watermarked": pl.Float64})
    return (sweep.attacks.filter((pl.col("config_id") == config_id) & pl.col("quality_retained").is_not_null()
                                 & pl.col("watermarked").is_not_null())
            .select("attack", "in_R", "quality_retained", "watermarked").sort("attack"))


def hull(points: pl.DataFrame, no_attack: float | None) -> tuple[np.ndarray, float]:
    """The attacker's frontier ``(m, 2)`` over the points counted in R, and R (2 x the area under it).

    ``no_attack``: the detection rate without attack ``W_0`` (None: 1, the paper's idealisation).
    """
    counted = points.filter(pl.col("in_R")).select(
        pl.col("quality_retained").clip(0, 1), pl.col("watermarked").clip(0, 1)).to_numpy()
    w0 = 1.0 if no_attack is None or math.isnan(no_attack) else min(max(no_attack, 0.0), 1.0)
    return tamper_frontier(counted, no_attack=w0), tamper_resistance(counted, no_attack=w0)


@dataclass(frozen=True)
class AttackTable:
    """Per temperature: rows = attacks, columns = families; each cell (W_A, Q_A) of the representative config."""

    temperature: float
    families: list[str]
    configs: list[str | None]
    attacks: list[str]
    cells: dict[tuple[str, str], tuple[float | None, float | None]]
    resistance: list[float | None]


def attack_tables(sweep: Sweep) -> list[AttackTable]:
    if sweep.attacks is None:
        return []
    chosen = representatives(sweep)
    r_of = dict(zip(sweep.results["config_id"].to_list(), sweep.results["all.tamper_resistance"].to_list(),
                    strict=True))
    tables = []
    for t in sweep.temperatures:
        configs = [chosen.get((t, f)) for f in sweep.families]
        cells: dict[tuple[str, str], tuple[float | None, float | None]] = {}
        for family, config in zip(sweep.families, configs, strict=True):
            if config is None:
                continue
            for row in attack_points(sweep, config).iter_rows(named=True):
                cells[(row["attack"], family)] = (row["watermarked"], row["quality_retained"])
        names = sorted({a for a, _ in cells})
        if names:
            tables.append(AttackTable(t, sweep.families, configs, names, cells,
                                      [r_of.get(c) if c else None for c in configs]))
    return tables


# --- false positives, scale, provenance --------------------------------------------------------------------------

def fpr_summary(sweep: Sweep) -> pl.DataFrame:
    """Per family and temperature over the done configurations (each its own scheme setting; re-evaluations
    with fresh keys are configurations too): median, min and max of the full-text and any-prefix FPR."""
    stats = []
    for column, name in (("all.fpr", "fpr"), ("all.fpr_any_prefix", "fpr_any_prefix")):
        stats += [pl.col(column).median().alias(f"{name}_median"), pl.col(column).min().alias(f"{name}_min"),
                  pl.col(column).max().alias(f"{name}_max")]
    return (sweep.done.group_by("family", "model.temperature")
            .agg(pl.len().alias("configs"), pl.col("all.fpr_n").median().alias("texts"), *stats)
            .sort("model.temperature", pl.col("family").replace_strict(
                {f: i for i, f in enumerate(sweep.families)}, default=len(sweep.families))))


def fpr_missing(sweep: Sweep) -> str | None:
    """Why the sweep has no false-positive rates to show (None when some done setting has one)."""
    if sweep.done.height == 0:
        return "no setting of this sweep has finished yet"
    if sweep.done["all.fpr"].drop_nulls().len() or sweep.done["all.fpr_any_prefix"].drop_nulls().len():
        return None
    return (f"this sweep's runs recorded no false-positive rate (results.parquet of {sweep.name} has no "
            "all.fpr / all.fpr_any_prefix values: its runs predate the FPR metrics or did not detect their baseline "
            "texts); rerun `mmw sweep collect` after runs that measure them")


def sweep_judge(sweep: Sweep) -> list[dict[str, Any]]:
    """The judge the sweep's runs used (``rate.*`` params) and what it rated, per temperature: the mean rating
    of the baseline and watermarked texts over the sweep's per-prompt rows (tuning and confirmation), and the
    share of texts without a rating. Empty when the sweep recorded neither."""
    params = [c for c in ("rate.judge", "rate.mode", "rate.backend", "rate.dtype", "rate.device")
              if c in sweep.done.columns]
    prompts = sweep.extras.get("prompts")
    if prompts is None or not {"config_id", "source", "rating"} <= set(prompts.columns):
        return []
    texts = prompts.filter(pl.col("source").is_in(["baseline", "watermarked"])).join(
        sweep.done.select("config_id", "model.temperature", *params), on="config_id", how="inner")
    if texts.height == 0:
        return []
    rows = (texts.group_by("model.temperature", *params)
            .agg(pl.col("rating").filter(pl.col("source") == "baseline").mean().alias("baseline"),
                 pl.col("rating").filter(pl.col("source") == "watermarked").mean().alias("watermarked"),
                 pl.col("rating").is_null().mean().alias("unrated"), pl.len().alias("texts"))
            .sort("model.temperature"))
    return rows.rename({c: c.removeprefix("rate.") for c in params}).to_dicts()


def key_spread(sweep: Sweep) -> pl.DataFrame:
    """Per picked configuration, its re-evaluations with fresh seeds and keys (reevaluations.parquet): how many
    finished, and the median, min and max of the full-text FPR and of the size across those keys."""
    reevaluations = sweep.extras.get("reevaluations")
    if reevaluations is None or "config_id" not in reevaluations.columns:
        return pl.DataFrame()
    frame = _with_columns(reevaluations, {"status": pl.String(), "all.fpr": pl.Float64(),
                                          "all.size": pl.Float64()}).with_columns(pl.col("status").fill_null("done"))
    # As in the re-evaluated median (mmw.selection.reeval): a finished run without a size was not detected.
    frame = frame.with_columns(pl.col("all.size").fill_null(float("inf")))
    labels = sweep.results.select("config_id", "family", "model.temperature")
    return (frame.filter(pl.col("status") == "done").group_by("config_id")
            .agg(pl.len().alias("keys"), pl.col("all.fpr").median().alias("fpr_median"),
                 pl.col("all.fpr").min().alias("fpr_min"), pl.col("all.fpr").max().alias("fpr_max"),
                 pl.col("all.size").median().alias("size_median"), pl.col("all.size").min().alias("size_min"),
                 pl.col("all.size").max().alias("size_max"))
            .join(labels, on="config_id", how="left").sort("model.temperature", "family", "config_id"))


def stage_totals(sweep: Sweep) -> list[tuple[str, float, int]]:
    """(stage, summed wall seconds, runs) over the sweep's experiments (timings.parquet), largest first."""
    timings = sweep.extras.get("timings")
    if timings is None or not {"stage", "wall_s"} <= set(timings.columns):
        return []
    totals = timings.group_by("stage").agg(pl.col("wall_s").sum(), pl.len().alias("runs")).sort(
        "wall_s", descending=True)
    return [(r["stage"], float(r["wall_s"] or 0.0), int(r["runs"])) for r in totals.iter_rows(named=True)]


def _single(frame: pl.DataFrame, column: str) -> str | None:
    """The distinct values of a column, joined (None when the column is all null)."""
    values = frame[column].drop_nulls().unique().sort().to_list()
    if not values:
        return None
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def sweep_scale(sweep: Sweep) -> str:
    """'<generations> generations × ≤<tokens> tokens (mean <m>), <model>' from the results (what is known)."""
    done = sweep.done
    parts = []
    generations = _single(done, "all.generations")
    tokens = _single(done, "model.max_new_tokens")
    if generations:
        parts.append(f"{generations} prompts")
    if tokens:
        parts.append(f"≤ {tokens} new tokens")
    mean_tokens = done["all.mean_tokens"].drop_nulls()
    if len(mean_tokens):
        parts.append(f"(mean {mean_tokens.mean():.0f} tokens)")
    model = _single(done, "model.name")
    scale = " × ".join(parts[:2]) + (f" {parts[2]}" if len(parts) > 2 else "") if parts else "scale unknown"
    return f"{scale}, model {model}" if model else scale


def confirmation_scale(sweep: Sweep) -> str | None:
    """'<n> held-out prompts (<p> per task) × K = <k> runs with fresh keys and seeds': what a confirmed table's cells
    rest on (None for an exploratory table)."""
    if not sweep.confirmed or sweep.table is None:
        return None
    judged = sweep.table.filter(pl.col("n_prompts").is_not_null())
    if judged.height == 0:
        per_task = sweep.meta.get("confirm_prompts_per_task")
        return f"{per_task} held-out prompts per task, no confirmation runs yet" if per_task else None
    fewest, most = int(judged["n_prompts"].min()), int(judged["n_prompts"].max())
    ks = judged["k"].drop_nulls()
    k = int(ks.max()) if len(ks) else 0
    per_task = sweep.meta.get("confirm_prompts_per_task")
    if fewest == most:
        return (f"{most} held-out prompts" + (f" ({per_task} per task)" if per_task else "")
                + f" × K = {k} runs with fresh keys and seeds")
    # Later rounds (confirm.extend) judge some cells on more prompts at another K: give the range, not a mix.
    runs = f"K = {int(ks.min())}-{k}" if len(ks) and int(ks.min()) != k else f"K = {k}"
    return (f"{fewest}-{most} held-out prompts a cell" + (f" ({per_task} per task in the first rounds, more in "
            "later ones)" if per_task else "") + f" × {runs} runs with fresh keys and seeds")


def sweep_provenance(sweep: Sweep, commit: str | None, generated: str) -> list[tuple[str, str]]:
    counts = {s: sweep.results.filter(pl.col("status") == s).height for s in ("done", "failed", "missing")}
    wall = sweep.results["wall_s"].drop_nulls()
    rows = [("sweep", sweep.name), ("model", _single(sweep.done, "model.name") or "–"),
            ("scale", sweep_scale(sweep)),
            ("configurations", f"{sweep.results.height} ({counts['done']} done, {counts['failed']} failed, "
                               f"{counts['missing']} missing)"),
            ("temperatures", ", ".join(f"{t:g}" for t in sweep.temperatures) or "–"),
            ("seeds", _single(sweep.results, "seed") or "–"),
            ("compute wall time", f"{wall.sum() / 3600:.2f} h summed over configurations "
                                  f"(median {wall.median():.0f} s each)" if len(wall) else "–"),
            ("commit", commit or "–"), ("report generated", generated)]
    rows += [(k, str(v)) for k, v in sweep.meta.items() if "key" not in k.lower()]
    return rows


# --- one run (reports/metrics.json) ------------------------------------------------------------------------------

@dataclass
class SingleRun:
    """One pipeline run: ``reports/metrics.json`` and what lies next to it."""

    metrics: dict[str, Any]
    judge: dict[str, Any] | None
    params: dict[str, Any] | None
    timings: list[dict[str, Any]]
    attacks: pl.DataFrame  # attack, in_R, quality_retained, watermarked (pooled over tasks)
    size_curves: dict[str, pl.DataFrame]  # baseline/watermarked -> tokens, detected_share
    numeric_path: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> record (mmw.provenance)

    @property
    def groups(self) -> list[str]:
        return [g for g, v in self.metrics.items() if g not in ("attacks", "judge") and isinstance(v, dict)]


def _json_number(value: Any) -> Any:
    """metrics.json of older runs wrote infinity as the string "inf"."""
    if value == "inf":
        return math.inf
    return value


def load_single_run(reports: Path, params_path: Path) -> SingleRun:
    """Read ``reports/metrics.json`` (SpecError when absent), judge.json, timings, plots and params.yaml."""
    import yaml

    metrics_path = reports / "metrics.json"
    if not metrics_path.is_file():
        raise SpecError("report", f"nothing to report: no sweep under {reports / 'sweeps'} and no {metrics_path} "
                        "(run `dvc repro` or `mmw sweep run NAME`)")
    metrics = json.loads(metrics_path.read_text(), object_hook=lambda d: {k: _json_number(v) for k, v in d.items()})
    for name, group in metrics.items():
        if not isinstance(group, dict):
            continue
        for size in ("size", "size_valid", "size_anytime"):  # null + undetected share >= 1/2: the median is +inf
            if group.get(size) is None and (group.get(f"{size}_undetected_share") or 0) >= 0.5:
                group[size] = math.inf
        if name == "attacks":
            for attack in group.values():  # E_A is +inf when at most half of the attacked texts are detected
                if isinstance(attack, dict) and attack.get("size") is None and \
                        attack.get("watermarked") is not None and attack["watermarked"] <= 0.5:
                    attack["size"] = math.inf
    judge = json.loads((reports / "judge.json").read_text()) if (reports / "judge.json").is_file() else None
    params = yaml.safe_load(params_path.read_text()) if params_path.is_file() else None
    if params and isinstance(params.get("scheme"), dict):
        params["scheme"].pop("key", None)  # the key never appears in a report
    params = {k: v for k, v in (params or {}).items() if k != "key"} or None
    timings = [json.loads(p.read_text()) for p in sorted((reports / "timings").glob("*.json"))]
    plots = reports / "plots"
    attacks_csv = plots / "attacks.csv"
    if attacks_csv.is_file():
        attacks = pl.read_csv(attacks_csv)
    else:
        attacks = pl.DataFrame([{"attack": name, **values} for name, values in metrics.get("attacks", {}).items()
                                if isinstance(values, dict)])
    attacks = _with_columns(attacks, {k: v for k, v in ATTACK_COLUMNS.items() if k != "config_id"})
    attacks = attacks.with_columns(pl.col("in_R").fill_null(~pl.col("attack").str.starts_with("paraphrase")))
    curves = {source: pl.read_csv(plots / f"size_{source}.csv") for source in ("baseline", "watermarked")
              if (plots / f"size_{source}.csv").is_file()}
    return SingleRun(metrics, judge, params, timings, attacks, curves, provenance.read_all(reports / "provenance"))


def single_scale(run: SingleRun) -> str:
    """'<n> generations × ≤ <max_new_tokens> new tokens (mean <m>), model <name>, T = <t>'."""
    overall = run.metrics.get("all", {})
    model = (run.params or {}).get("model", {}) or {}
    parts = [f"{overall.get('generations', '?')} generations"]
    if model.get("max_new_tokens"):
        parts[0] += f" × ≤ {model['max_new_tokens']} new tokens"
    if overall.get("mean_tokens") is not None:
        parts.append(f"mean {overall['mean_tokens']:.0f} tokens")
    if model.get("name"):
        parts.append(f"model {model['name']}")
    if model.get("temperature") is not None:
        parts.append(f"T = {model['temperature']:g}")
    return ", ".join(parts)
