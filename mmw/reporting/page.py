"""``reports/index.html``: one self-contained page (inline CSS and SVG, no script, no network) from a sweep or a run.

``build_report`` picks the source: the named sweep, else the sweep under ``reports/sweeps/`` written last, else
the single run in ``reports/metrics.json``. It also writes the CSV tables behind dvc.yaml's sweep plots
(``reports/figures/``), so ``dvc plots show/diff`` draws the same figures.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
import polars as pl

from mmw import provenance as numeric_path
from mmw.errors import SpecError
from mmw.io import write_text, write_with
from mmw.reporting import data, figures

TEMPLATES = Path(__file__).with_name("templates")
#: Where `mmw report` writes the CSVs that dvc.yaml's sweep plots read (one file per family: DVC colours by file).
FIGURE_TABLES = Path("reports/figures")


@dataclass(frozen=True)
class ReportInfo:
    """What ``build_report`` wrote: the page, its source (``sweep <name>`` or ``run``), size and time taken."""

    path: Path
    source: str
    bytes: int
    seconds: float
    plot_tables: list[Path]


def git_commit(repo: Path) -> str | None:
    """``<short hash>`` of HEAD, with `` + uncommitted changes`` when the work tree differs (None outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" + uncommitted changes" if dirty else "")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(tokens=data.fmt_tokens, num=data.fmt_number, pct=data.fmt_percent,
                       family=data.family_label)
    return env


def _svg(figure: Any, name: str) -> markupsafe.Markup:
    # matplotlib escapes every text it writes into the SVG, so the markup is safe to inline as is.
    return markupsafe.Markup(figures.to_svg(figure, name))


@dataclass(frozen=True)
class Headline:
    """The page's lead: under ``constraint`` (the paper's main one when the table has it, else its tightest), per
    temperature the smallest confirmed size in words, naming the watermark as a provider knows it, and what the
    claims table resolved about it. Only a confirmed table has one."""

    constraint: data.Constraint
    lines: list[tuple[float, str]]


def _orderings(claims: pl.DataFrame | None, temperature: float, constraint: data.Constraint, family: str,
               names: dict[str, str]) -> str:
    """``; significantly smaller than X and Y; not resolved against Z``: the pairwise claims rows of the leading
    cell at one temperature and constraint (:func:`mmw.sweep.claims.pairwise_orderings`)."""
    if claims is None or "scope" not in claims.columns:
        return ""
    r_min = constraint.min_tamper_resistance or 0.0
    rows = claims.filter((pl.col("scope") == "pairwise") & (pl.col("temperature") == temperature)
                         & ((pl.col("max_quality_loss") - constraint.max_quality_loss).abs() < 1e-9)
                         & ((pl.col("min_tamper_resistance").fill_null(0.0) - r_min).abs() < 1e-9))
    beaten = [names.get(r["than"], data.family_label(r["than"])) for r in rows.iter_rows(named=True)
              if r["smaller"] == family and r["verdict"] == "supported"]
    open_ = [names.get(other, data.family_label(other)) for r in rows.iter_rows(named=True)
             if r["verdict"] not in ("supported", "contradicted") and family in (r["smaller"], r["than"])
             for other in (r["than"] if r["smaller"] == family else r["smaller"],)]
    text = f"; significantly smaller than {', '.join(beaten)}" if beaten else ""
    return text + (f"; not resolved against {', '.join(open_)}" if open_ else "")


def _headline(sweep: data.Sweep) -> Headline | None:
    """The lead of a confirmed table; None for an exploratory one (picked and re-run on its tuning prompts: its
    numbers are not results and never lead the page)."""
    if not sweep.confirmed or not sweep.constraints:
        return None
    main = data.Constraint(*data.MAIN_CONSTRAINT)
    constraint = main if main in sweep.constraints else sweep.constraints[0]
    picked = data.picks(sweep, constraint)
    names = data.watermark_names(sweep.results)
    family_names = {f: data.family_label(f) for f in sweep.families}
    lines = []
    for t in sweep.temperatures:
        at = picked.filter(pl.col("temperature") == t)
        if at.height == 0:
            continue
        answered = at.filter(pl.col("status") == "confirmed").sort("size_median")
        if answered.height:
            best = answered.row(0, named=True)
            name = names.get(best["config_id"]) or data.family_label(best["family"])
            lines.append((t, f"{name}: {data.fmt_tokens(best['size_median'])} tokens, confirmed on held-out "
                             f"prompts (K = {best['k']})"
                             + _orderings(sweep.extras.get("claims"), t, constraint, best["family"], family_names)))
        else:
            counts = ", ".join(f"{n} {s}" for s, n in at.group_by("status").len().sort("status").iter_rows())
            lines.append((t, f"no confirmed cell ({counts})"))
    return Headline(constraint, lines)


def _judge_rows(judge: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not judge:
        return []
    return [{"mode": mode, **stats} for mode, stats in (judge.get("modes") or {}).items() if isinstance(stats, dict)]


def _plain(frame: pl.DataFrame | None) -> dict[str, list] | None:
    """A table as header + rows of display strings (floats to 4 significant digits, ∞, – for null)."""
    if frame is None or frame.height == 0:
        return None
    rows = [[data.fmt_number(v, 4) if isinstance(v, float) else ("–" if v is None else str(v)) for v in row]
            for row in frame.iter_rows()]
    return {"columns": frame.columns, "rows": rows}


def _constraint_words(row: dict[str, Any]) -> str:
    loss, r_min = row.get("max_quality_loss"), row.get("min_tamper_resistance")
    return "–" if loss is None else data.Constraint(float(loss), r_min if r_min else None).label


def _size(value: float | None) -> str:
    """A size or a gap of sizes in tokens (a gap can be −∞: the claimed side detected, the other not)."""
    return "−∞" if value is not None and value == -math.inf else data.fmt_tokens(value)


def _scope(claims: pl.DataFrame | None, pairwise: bool) -> pl.DataFrame | None:
    """The paper's orderings (``pairwise`` False) or the pairwise rows of the claims table; an older table without
    a scope holds only the paper's."""
    if claims is None or claims.height == 0:
        return None
    is_pair = (pl.col("scope") == "pairwise") if "scope" in claims.columns else pl.lit(False)
    rows = claims.filter(is_pair if pairwise else ~is_pair)
    return rows if rows.height else None


def deploy_shown(claims: pl.DataFrame | None) -> pl.DataFrame | None:
    """The pairwise rows of the claims table, compact: per temperature and constraint, which watermark is
    smaller than which, the verdict and the gap interval (the paper's orderings are :func:`claims_shown`)."""
    pairs = _scope(claims, pairwise=True)
    if pairs is None:
        return None
    rows = []
    for r in pairs.iter_rows(named=True):
        low, high = r.get("gap_low"), r.get("gap_high")
        rows.append({
            "T": data.fmt_number(r.get("temperature"), 3), "Constraint": _constraint_words(r),
            "Claim": r["claim"], "Verdict": r.get("verdict") or "–",
            "Why": (r.get("comparisons") or "–").split(": ", 1)[-1],
            "Gap, 95 % interval (tokens)": "–" if low is None and high is None else f"[{_size(low)}, {_size(high)}]"})
    return pl.DataFrame(rows)


def claims_shown(claims: pl.DataFrame | None) -> pl.DataFrame | None:
    """The paper's orderings of the claims table (:mod:`mmw.sweep.claims`) in words: one row per claim,
    temperature and constraint."""
    claims = _scope(claims, pairwise=False)
    if claims is None:
        return None
    rows = []
    for r in claims.iter_rows(named=True):
        smaller, than = r.get("median_smaller"), r.get("median_than")
        low, high = r.get("gap_low"), r.get("gap_high")
        kind = (r.get("size_kind") or "").removeprefix("all.").replace("_", " ")
        rows.append({
            "Claim": r["claim"], "T": data.fmt_number(r.get("temperature"), 3), "Verdict": r.get("verdict") or "–",
            "Constraint": _constraint_words(r), "Comparisons": (r.get("comparisons") or "–").replace("_", " "),
            "Median sizes, claimed vs other (tokens)": "–" if smaller is None else
            f"{_size(smaller)} vs {_size(than)}" + (f" ({kind})" if kind else ""),
            "Gap, 95 % interval": "–" if low is None and high is None else f"[{_size(low)}, {_size(high)}]",
            "Prompts": "–" if r.get("n_prompts") is None else str(r["n_prompts"])})
    return pl.DataFrame(rows)


def randomness_shown(randomness: pl.DataFrame | None) -> pl.DataFrame | None:
    """The text-dependent vs fixed randomness table; a confirmed one in words, with a size only where its cell
    was confirmed (an exploratory one as collected)."""
    if randomness is None or randomness.height == 0 or "status" not in randomness.columns:
        return randomness
    rows = []
    for r in randomness.iter_rows(named=True):
        confirmed = r["status"] == "confirmed"
        status = r["status"] + (f" ({r['reason']})" if r.get("reason") and not confirmed else "")
        low, high = r.get("quality_low"), r.get("quality_high")
        rows.append({
            "T": data.fmt_number(r.get("temperature"), 3), "Randomness": r.get("randomness_kind") or "–",
            "Status": status,
            "Median size (MAD), tokens": "–" if not confirmed else
            f"{data.fmt_tokens(r.get('size_median'))} ({data.fmt_tokens(r.get('size_mad'))})",
            "Relative quality, one-sided bounds": "–" if low is None else
            f"{data.fmt_number(r.get('quality'), 3)} [{data.fmt_number(low, 3)}, {data.fmt_number(high, 3)}]",
            "Runs × prompts": "–" if r.get("n_prompts") is None else f"{r.get('k')} × {r['n_prompts']}"})
    return pl.DataFrame(rows)


def plan_shown(plan: pl.DataFrame | None) -> pl.DataFrame | None:
    """The planner's table (:mod:`mmw.sweep.plan`) in words: what each unresolved cell needs and costs."""
    if plan is None or plan.height == 0:
        return None

    def count(value: float | None, digits: int = 0) -> str:
        if value is None:
            return "–"
        return "∞" if math.isinf(value) else f"{value:,.{digits}f}"

    rows = []
    for r in plan.iter_rows(named=True):
        estimate = "–" if r.get("quality") is None else f"quality {r['quality']:.3f} ({r.get('quality_toward')})"
        if r.get("resistance") is not None:
            estimate += f", R {r['resistance']:.2f} ({r.get('r_toward')})"
        rows.append({
            "Constraint": _constraint_words(r), "T": data.fmt_number(r.get("temperature"), 3),
            "Family": data.family_label(r.get("family")),
            "Prompts now": count(r.get("n_prompts")), "Estimate (heading)": estimate,
            "Prompts for quality": count(r.get("quality_prompts")), "Prompts for R": count(r.get("r_prompts")),
            "Per task": count(r.get("prompts_per_task")),
            "CPU hours (here)": count(None if r.get("cpu_s") is None else r["cpu_s"] / 3600, 1),
            "H100 hours": count(r.get("h100_hours"), 2)})
    return pl.DataFrame(rows)


def render_sweep(sweep: data.Sweep, judge: dict[str, Any] | None, commit: str | None, generated: str) -> str:
    """The page for a sweep (see docs/REPORT.md for what each section shows)."""
    alpha_values = sweep.results["scheme.alpha"].drop_nulls() if "scheme.alpha" in sweep.results.columns else []
    alpha = float(alpha_values[0]) if len(alpha_values) else 0.02
    has_table = bool(sweep.constraints)
    done = sweep.done
    sections = {
        "sizes": _svg(figures.figure_sizes(sweep), "sizes") if has_table and figures.has_sizes(sweep) else None,
        "size_quality": _svg(figures.figure_size_quality(sweep), "size-quality") if done.height else None,
        "hulls": _svg(figures.figure_tamper_hulls(sweep), "hulls") if sweep.attacks is not None else None,
        "fpr": _svg(figures.figure_fpr(sweep, alpha), "fpr") if data.fpr_missing(sweep) is None else None,
    }
    failed = sweep.results.filter(pl.col("status") == "failed").select("config_id", "error").head(50)
    judge_columns = [c for c in sweep.results.columns if c.startswith("judge.")]
    judge_sweep = (sweep.results.group_by("model.temperature").agg(
        [pl.col(c).cast(pl.String).unique().sort().str.join(", ").alias(c) for c in judge_columns])
        .sort("model.temperature").iter_rows(named=True)) if judge_columns else []
    return _environment().get_template("report.html.j2").render(
        kind="sweep", title=f"mmw benchmark report: sweep “{sweep.name}”"
        + ("" if sweep.confirmed else " (exploratory, not confirmed)"), scale=data.sweep_scale(sweep),
        confirmation_scale=data.confirmation_scale(sweep),
        sweep=sweep, blocks=data.paper_table(sweep), headline=_headline(sweep), figures=sections,
        attack_tables=data.attack_tables(sweep), fpr=list(data.fpr_summary(sweep).iter_rows(named=True)),
        fpr_missing=data.fpr_missing(sweep), sweep_judge=data.sweep_judge(sweep),
        alpha=alpha, failed=list(failed.iter_rows(named=True)), judge=judge, judge_rows=_judge_rows(judge),
        judge_columns=judge_columns, judge_sweep=list(judge_sweep), keys=list(data.key_spread(sweep).iter_rows(
            named=True)), randomness=_plain(randomness_shown(sweep.extras.get("randomness"))),
        delta=_plain(sweep.extras.get("delta")),
        plan=_plain(plan_shown(sweep.extras.get("plan"))), claims=_plain(claims_shown(sweep.extras.get("claims"))),
        deploy=_plain(deploy_shown(sweep.extras.get("claims"))),
        race=_plain(sweep.extras.get("race")), stages=data.stage_totals(sweep),
        provenance=data.sweep_provenance(sweep, commit, generated))


def render_single(run: data.SingleRun, commit: str | None, generated: str) -> str:
    """The page for one pipeline run (``reports/metrics.json``)."""
    params = run.params or {}
    scheme = {k: v for k, v in (params.get("scheme") or {}).items() if v is not None}
    wall = sum(float(t.get("wall_s", 0.0)) for t in run.timings)
    provenance = [("model", str((params.get("model") or {}).get("name", "–"))), ("scale", data.single_scale(run)),
                  ("scheme", ", ".join(f"{k}={v}" for k, v in scheme.items()) or "–"),
                  ("seed", str(params.get("seed", "–"))),
                  ("wall time", f"{wall:.0f} s over {len(run.timings)} stages (last run of each)" if run.timings
                   else "–"),
                  ("commit", commit or "–"), ("report generated", generated),
                  *numeric_path.rows(run.numeric_path)]
    attacks = run.metrics.get("attacks", {})
    return _environment().get_template("report.html.j2").render(
        kind="run", title="mmw benchmark report: one run", scale=data.single_scale(run), run=run,
        groups=[(g, run.metrics[g]) for g in run.groups], attacks=attacks,
        figures={"hull": _svg(figures.figure_single_hull(run), "hull") if run.attacks.height else None,
                 "sizes": _svg(figures.figure_single_sizes(run), "size-curves") if run.size_curves else None},
        judge=run.judge, judge_rows=_judge_rows(run.judge), timings=run.timings, provenance=provenance,
        alpha=float(scheme.get("alpha", 0.02)))


def figure_constraint(sweep: data.Sweep) -> data.Constraint:
    """The constraint Figure 1's plot shows: the paper's main one when the table has it, else its tightest (as the
    page's headline)."""
    main = data.Constraint(*data.MAIN_CONSTRAINT)
    return main if main in sweep.constraints or not sweep.constraints else sweep.constraints[0]


def sweep_plot_tables(sweep: data.Sweep, alpha: float = 0.02) -> dict[str, pl.DataFrame]:
    """CSV tables behind the sweep's dvc plots, keyed by path under ``reports/figures`` (one file per family of
    the sweep, because DVC colours series by file), plus ``fpr/alpha.csv``: the detector's alpha at each
    temperature, the level every FPR is judged against (it also gives the FPR plots a y range when every rate is
    0). Infinite and missing sizes are left out (a plot axis has no ∞)."""
    tables: dict[str, pl.DataFrame] = {}
    chosen = data.picks(sweep, figure_constraint(sweep))
    done = sweep.done.filter(pl.col("all.size").is_finite() & pl.col("all.relative_quality").is_not_null())
    for family in sweep.families:
        tables[f"sizes/{family}.csv"] = (chosen.filter((pl.col("family") == family) & pl.col("size_median").is_finite())
                                         .select("temperature", "size_median", "size_mad").sort("temperature"))
        tables[f"size_quality/{family}.csv"] = done.filter(pl.col("family") == family).select(
            pl.col("all.relative_quality").alias("relative_quality"), pl.col("all.size").alias("size"),
            pl.col("all.tamper_resistance").alias("tamper_resistance"),
            pl.col("model.temperature").alias("temperature"), "config_id")
        measured = pl.col("all.fpr").is_not_null() | pl.col("all.fpr_any_prefix").is_not_null()
        tables[f"fpr/{family}.csv"] = sweep.done.filter((pl.col("family") == family) & measured).select(
            pl.col("model.temperature").alias("temperature"), pl.col("all.fpr").alias("fpr"),
            pl.col("all.fpr_any_prefix").alias("fpr_any_prefix"), "config_id")
    temperatures = pl.DataFrame({"temperature": sweep.temperatures}, schema={"temperature": pl.Float64})
    tables["fpr/alpha.csv"] = temperatures.with_columns(pl.lit(alpha).alias("fpr"),
                                                        pl.lit(alpha).alias("fpr_any_prefix"))
    return tables


def plot_definitions(sweep: data.Sweep, tables: dict[str, pl.DataFrame]) -> str:
    """``reports/figures/dvc.yaml``: the sweep's figures for ``dvc plots show``/``diff``, one series per family
    file that has rows (a file without rows would draw an empty series)."""
    import yaml

    constraint = figure_constraint(sweep)

    def series(folder: str, column: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
        names = [f"{folder}/{f}.csv" for f in sweep.families] + [f"{folder}/{e}" for e in extra]
        return {name: column for name in names if tables.get(name) is not None and tables[name].height}

    def plot(title: str, x: str, y: dict[str, str], x_label: str, y_label: str) -> dict[str, Any]:
        return {title: {"template": "scatter", "x": x, "y": y, "x_label": x_label, "y_label": y_label}}

    # No apostrophe in a title: DVC's page embeds each plot's spec in a quoted script string, and one left the plot
    # blank (seen with "detector's").
    plots = [
        plot(f"Watermark size per temperature, {constraint.label} (Figure 1; median over the confirmation runs)",
             "temperature", series("sizes", "size_median"), "sampling temperature", "watermark size (tokens)"),
        plot("Size versus relative quality of every setting", "relative_quality", series("size_quality", "size"),
             "relative quality (watermarked / baseline)", "watermark size (tokens)"),
        plot("Tamper resistance versus relative quality of every setting", "relative_quality",
             series("size_quality", "tamper_resistance"), "relative quality (watermarked / baseline)",
             "tamper resistance R"),
        plot("False-positive rate on unwatermarked texts (full text) per temperature; alpha.csv: the detector alpha",
             "temperature", series("fpr", "fpr", ("alpha.csv",)), "sampling temperature", "false-positive rate"),
        plot("False-positive rate at any prefix per temperature; alpha.csv: the detector alpha", "temperature",
             series("fpr", "fpr_any_prefix", ("alpha.csv",)), "sampling temperature",
             "false-positive rate (any prefix)"),
    ]
    plots = [p for p in plots if next(iter(p.values()))["y"]]
    header = (f"# Written by `mmw report` for sweep {sweep.name} (reports/sweeps/{sweep.name}/): its figures for\n"
              "# `dvc plots show` / `dvc plots diff` (rendered offline through .dvc/config's plots.html_template).\n"
              "# One CSV per family because DVC colours series by file; undetected sizes (∞) are left out (a plot\n"
              "# axis has no infinity; reports/index.html marks them).\n")
    return header + yaml.safe_dump({"plots": plots}, sort_keys=False, allow_unicode=True, width=120)


def write_plot_tables(folder: Path, sweep: data.Sweep) -> list[Path]:
    """Write the sweep's plot tables and their ``dvc.yaml`` under ``folder`` (``reports/figures``); CSVs of
    families the sweep does not have are removed (they would be another sweep's)."""
    alpha_values = sweep.results["scheme.alpha"].drop_nulls() if "scheme.alpha" in sweep.results.columns else []
    tables = sweep_plot_tables(sweep, float(alpha_values[0]) if len(alpha_values) else 0.02)
    written = []
    for name, table in tables.items():
        write_with(folder / name, table.write_csv)
        written.append(folder / name)
    for stale in sorted(folder.glob("*/*.csv")):
        if stale.relative_to(folder).as_posix() not in tables:
            stale.unlink()
    write_text(plot_definitions(sweep, tables), folder / "dvc.yaml")
    return [*written, folder / "dvc.yaml"]


def build_report(root: Path, sweep_name: str | None = None, out: Path | None = None,
                 params_path: Path | None = None) -> ReportInfo:
    """Write ``reports/index.html`` under ``root`` (and, for a sweep, ``reports/figures/*``, the tables behind
    dvc.yaml's plots); with ``out`` elsewhere, only the page at ``out`` (another sweep's page must not replace the
    plotted sweep's tables).

    Raises:
        SpecError: an unknown sweep name (naming the ones present), or nothing to report.
    """
    start = time.perf_counter()
    reports = root / "reports"
    out = out or reports / "index.html"
    plots = Path(out).resolve() == (reports / "index.html").resolve()
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = git_commit(root)
    sweeps = reports / "sweeps"
    if sweep_name is not None:
        directory = sweeps / sweep_name
        if not (directory / "results.parquet").is_file():
            present = sorted(p.parent.name for p in sweeps.glob("*/results.parquet"))
            raise SpecError("--sweep", f"no results for sweep {sweep_name!r} under {sweeps}",
                            present or "none yet (run `mmw sweep NAME` and `mmw sweep collect`)")
    else:
        directory = data.latest_sweep(sweeps)
    written: list[Path] = []
    if directory is not None:
        sweep = data.load_sweep(directory)
        # The sweep's own judge check only: reports/judge.json is the workspace run's, another judge and scale.
        judge_path = directory / "judge.json"
        judge = json.loads(judge_path.read_text()) if judge_path.is_file() else None
        html = render_sweep(sweep, judge, commit, generated)
        source = f"sweep {sweep.name}"
        if plots:
            written = write_plot_tables(root / FIGURE_TABLES, sweep)
    else:
        run = data.load_single_run(reports, params_path or root / "params.yaml")
        html = render_single(run, commit, generated)
        source = "run"
    write_text(html, out)
    return ReportInfo(out, source, out.stat().st_size, time.perf_counter() - start, written)
