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
from mmw.samplers import LABELS

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
    temperature the smallest confirmed size in words. Only a confirmed table has one."""

    constraint: data.Constraint
    lines: list[tuple[float, str]]


def _headline(sweep: data.Sweep) -> Headline | None:
    """The lead of a confirmed table; None for an exploratory one (picked and re-run on its tuning prompts: its
    numbers are not results and never lead the page)."""
    if not sweep.confirmed or not sweep.constraints:
        return None
    main = data.Constraint(*data.MAIN_CONSTRAINT)
    constraint = main if main in sweep.constraints else sweep.constraints[0]
    picked = data.picks(sweep, constraint)
    lines = []
    for t in sweep.temperatures:
        at = picked.filter(pl.col("temperature") == t)
        if at.height == 0:
            continue
        answered = at.filter(pl.col("status") == "confirmed").sort("size_median")
        if answered.height:
            best = answered.row(0, named=True)
            lines.append((t, f"{data.family_label(best['family'])}: {data.fmt_tokens(best['size_median'])} "
                             f"tokens, confirmed on held-out prompts (K = {best['k']})"))
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


def claims_shown(claims: pl.DataFrame | None) -> pl.DataFrame | None:
    """The claims table (:mod:`mmw.sweep.claims`) in words: one row per claim, temperature and constraint."""
    if claims is None or claims.height == 0:
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
        "sizes": _svg(figures.figure_sizes(sweep), "sizes") if has_table else None,
        "size_quality": _svg(figures.figure_size_quality(sweep), "size-quality") if done.height else None,
        "hulls": _svg(figures.figure_tamper_hulls(sweep), "hulls") if sweep.attacks is not None else None,
        "fpr": _svg(figures.figure_fpr(sweep, alpha), "fpr") if done.height else None,
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
        alpha=alpha, failed=list(failed.iter_rows(named=True)), judge=judge, judge_rows=_judge_rows(judge),
        judge_columns=judge_columns, judge_sweep=list(judge_sweep), keys=list(data.key_spread(sweep).iter_rows(
            named=True)), randomness=_plain(randomness_shown(sweep.extras.get("randomness"))),
        delta=_plain(sweep.extras.get("delta")),
        plan=_plain(plan_shown(sweep.extras.get("plan"))), claims=_plain(claims_shown(sweep.extras.get("claims"))),
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


def sweep_plot_tables(sweep: data.Sweep) -> dict[str, pl.DataFrame]:
    """CSV tables behind dvc.yaml's sweep plots, keyed by path under ``reports/figures`` (one file per family,
    because DVC colours series by file). Infinite and missing sizes are left out (a plot axis has no ∞)."""
    tables: dict[str, pl.DataFrame] = {}
    main = data.Constraint(*data.MAIN_CONSTRAINT)
    chosen = data.picks(sweep, main)
    done = sweep.done.filter(pl.col("all.size").is_finite() & pl.col("all.relative_quality").is_not_null())
    for family in LABELS:
        tables[f"sizes/{family}.csv"] = (chosen.filter((pl.col("family") == family) & pl.col("size_median").is_finite())
                                         .select("temperature", "size_median", "size_mad").sort("temperature"))
        tables[f"size_quality/{family}.csv"] = done.filter(pl.col("family") == family).select(
            pl.col("all.relative_quality").alias("relative_quality"), pl.col("all.size").alias("size"),
            pl.col("all.tamper_resistance").alias("tamper_resistance"),
            pl.col("model.temperature").alias("temperature"), "config_id")
        tables[f"fpr/{family}.csv"] = sweep.done.filter(pl.col("family") == family).select(
            pl.col("model.temperature").alias("temperature"), pl.col("all.fpr").alias("fpr"),
            pl.col("all.fpr_any_prefix").alias("fpr_any_prefix"), "config_id")
    return tables


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
        judge_path = next((p for p in (directory / "judge.json", reports / "judge.json") if p.is_file()), None)
        judge = json.loads(judge_path.read_text()) if judge_path else None
        html = render_sweep(sweep, judge, commit, generated)
        source = f"sweep {sweep.name}"
        for name, table in (sweep_plot_tables(sweep) if plots else {}).items():
            path = root / FIGURE_TABLES / name
            write_with(path, table.write_csv)
            written.append(path)
    else:
        run = data.load_single_run(reports, params_path or root / "params.yaml")
        html = render_single(run, commit, generated)
        source = "run"
    write_text(html, out)
    return ReportInfo(out, source, out.stat().st_size, time.perf_counter() - start, written)
