"""``reports/index.html``: one self-contained page (inline CSS and SVG, no script, no network) from a sweep or a run.

``build_report`` picks the source: the named sweep, else the sweep under ``reports/sweeps/`` written last, else
the single run in ``reports/metrics.json``. It also writes the CSV tables behind dvc.yaml's sweep plots
(``reports/figures/``), so ``dvc plots show/diff`` draws the same figures.
"""

from __future__ import annotations

import datetime as dt
import json
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


def _headline(sweep: data.Sweep) -> list[tuple[float, str]]:
    """Per temperature, the smallest re-evaluated size under the paper's main constraint, in words."""
    main = data.Constraint(*data.MAIN_CONSTRAINT)
    if main not in sweep.constraints:
        return []
    lines = []
    picked = data.picks(sweep, main)
    confirmed_table = picked["status"].drop_nulls().len() > 0
    for t in sweep.temperatures:
        at = picked.filter(pl.col("temperature") == t)
        if confirmed_table:  # only confirmed cells are results; say how many are not
            answered = at.filter(pl.col("status") == "confirmed").sort("size_median")
            if answered.height:
                best = answered.row(0, named=True)
                lines.append((t, f"{data.family_label(best['family'])}: {data.fmt_tokens(best['size_median'])} "
                                 f"tokens, confirmed on held-out prompts (K = {best['k']})"))
            else:
                counts = ", ".join(f"{n} {s}" for s, n in at.group_by("status").len().sort("status").iter_rows())
                lines.append((t, f"no confirmed cell ({counts})"))
            continue
        measured = at.filter(pl.col("size_median").is_not_null() & pl.col("size_median").is_finite()
                             & (pl.col("k") > 0)).sort("size_median")
        optimistic = at.filter((pl.col("k").fill_null(0) == 0) & pl.col("pick_size").is_not_null()
                               & pl.col("pick_size").is_finite()).sort("pick_size")
        if measured.height:
            best = measured.row(0, named=True)
            lines.append((t, f"{data.family_label(best['family'])}: {data.fmt_tokens(best['size_median'])} tokens"
                             + (f" (MAD {best['size_mad']:.1f}, K = {best['k']})"
                                if best["k"] > 1 and best["size_mad"] is not None else "")))
        elif optimistic.height:
            best = optimistic.row(0, named=True)
            lines.append((t, f"{data.family_label(best['family'])}: {data.fmt_tokens(best['pick_size'])}* tokens "
                             "(selection-time size, not re-evaluated)"))
        elif at.filter(pl.col("config_id").is_not_null()).height:
            lines.append((t, "the picks are not detected in half the texts (∞)"))
        else:
            lines.append((t, "no setting meets the constraint"))
    return lines


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


def claims_shown(claims: pl.DataFrame | None) -> pl.DataFrame | None:
    """The claims table's columns a reader needs (:mod:`mmw.sweep.claims`)."""
    if claims is None:
        return None
    keep = ["claim", "temperature", "max_quality_loss", "min_tamper_resistance", "verdict", "comparisons",
            "median_smaller", "median_than", "gap_low", "gap_high", "size_kind", "n_prompts"]
    return claims.select([c for c in keep if c in claims.columns])


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
        kind="sweep", title=f"mmw benchmark report: sweep “{sweep.name}”", scale=data.sweep_scale(sweep),
        sweep=sweep, blocks=data.paper_table(sweep), headline=_headline(sweep), figures=sections,
        attack_tables=data.attack_tables(sweep), fpr=list(data.fpr_summary(sweep).iter_rows(named=True)),
        alpha=alpha, failed=list(failed.iter_rows(named=True)), judge=judge, judge_rows=_judge_rows(judge),
        judge_columns=judge_columns, judge_sweep=list(judge_sweep), keys=list(data.key_spread(sweep).iter_rows(
            named=True)), randomness=_plain(sweep.extras.get("randomness")), delta=_plain(sweep.extras.get("delta")),
        plan=_plain(sweep.extras.get("plan")), claims=_plain(claims_shown(sweep.extras.get("claims"))),
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
    """Write ``reports/index.html`` under ``root`` (and, for a sweep, ``reports/figures/*``).

    Raises:
        SpecError: an unknown sweep name (naming the ones present), or nothing to report.
    """
    start = time.perf_counter()
    reports = root / "reports"
    out = out or reports / "index.html"
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
        for name, table in sweep_plot_tables(sweep).items():
            path = root / FIGURE_TABLES / name
            write_with(path, table.write_csv)
            written.append(path)
    else:
        run = data.load_single_run(reports, params_path or root / "params.yaml")
        html = render_single(run, commit, generated)
        source = "run"
    write_text(html, out)
    return ReportInfo(out, source, out.stat().st_size, time.perf_counter() - start, written)
