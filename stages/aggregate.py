"""Stage ``aggregate``: metrics.json, plot data, summary.md and the tamper-resistance figure."""

from __future__ import annotations

import importlib
from pathlib import Path

import polars as pl

from mmw import provenance
from mmw.io import (
    DETECTIONS,
    JUDGE_REPORT,
    METRICS,
    PERTURBED,
    PLOTS_DIR,
    RATINGS,
    SUMMARY,
    read_json,
    read_table,
    write_json,
    write_table,
    write_text,
    write_with,
)
from mmw.params import load_params
from mmw.watermark.plugins import no_pivot_reason
from mmw.reporting.run import build_metrics, plot_tables
from mmw.reporting.summary import quality_markdown, summary_markdown, tamper_figure
from mmw.watermark.scheme import SchemeSpec
from mmw.stages.timing import timed

FIGURE = Path("reports/tamper_resistance.png")
#: Written by the ``quality`` stage; its section is appended to the summary.
QUALITY_REPORT = Path("reports/quality.json")


#: The report's drawing modules: matplotlib's import is ~0.8 s of the stage on a GPU host (bench/results/gpu.md).
DRAWING_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.backends.backend_svg",
                   "mmw.reporting.figures")


def schedule_ahead(params_path: Path) -> None:
    """In a process that runs several stages (``mmw.sweep.pipeline.schedule_ahead``): import the report's drawing
    modules while a generation stage decodes (``mmw.engines.ahead``); a module is the same whoever imports it."""
    from mmw.engines import ahead

    ahead.schedule(("import", *DRAWING_MODULES), lambda: [importlib.import_module(m) for m in DRAWING_MODULES], 0)


def run(params_path: Path) -> None:
    with timed("aggregate"):
        params = load_params(params_path, ("seed", "model", "scheme"), models={"scheme": SchemeSpec})
        detections = pl.concat([read_table(DETECTIONS["baseline"]), read_table(DETECTIONS["watermarked"])])
        ratings = pl.concat([read_table(RATINGS["baseline"]), read_table(RATINGS["watermarked"])])
        perturbed = read_table(PERTURBED)
        judge = read_json(JUDGE_REPORT)

        metrics, attacks = build_metrics(detections, ratings, perturbed, judge, params.scheme.alpha,
                                         anytime=params.scheme.exact_null)
        header = {"model": params.model.name, "scheme": params.scheme.describe(),
                  "alpha": f"{params.scheme.alpha:g}", "seed": str(params.seed),
                  "max new tokens": str(params.model.max_new_tokens), "temperature": f"{params.model.temperature:g}"}
        if params.scheme.is_plugin and not params.scheme.exact_null:
            header["size anytime"] = "not available: " + no_pivot_reason(params.scheme)
        for stem, table in plot_tables(detections, attacks).items():
            write_with(PLOTS_DIR / f"{stem}.csv", table.write_csv)
        figure = tamper_figure(attacks)
        write_with(FIGURE, lambda path: figure.savefig(path, format="png", dpi=120))
        write_table(attacks, PLOTS_DIR / "attacks_by_task.parquet")
        summary = summary_markdown(metrics, attacks, judge, header)
        if QUALITY_REPORT.is_file():
            summary += "\n" + quality_markdown(read_json(QUALITY_REPORT))
        records = provenance.read_all()
        summary += "\n" + provenance.markdown(records)
        write_json(records, provenance.COMMITTED)  # the records, committed with the metrics (a clone has them)
        write_text(summary, SUMMARY)
        write_json(metrics, METRICS)
