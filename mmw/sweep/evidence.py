"""Per-prompt results of sweep runs: read from each experiment's own tables, pooled into confirmation evidence.

Every run of a sweep leaves its per-prompt tables in the DVC cache (``data/detections/*.parquet``,
``data/ratings/*.parquet``, ``data/perturbed.parquet``; schemas in :mod:`mmw.metrics`). :func:`prompt_rows`
reads them at an experiment's revision through ``dvc.api`` and joins them into one table of one row per
(prompt, source, attack)::

    prompt_id, task, source, attack, detected, size, size_valid[, size_anytime], rating, in_R, ok

Each finished run's rows go into its committed evidence file (:mod:`mmw.sweep.units`); collection stacks them
(with ``experiment``, ``config_id``, ``seed``, ``role``) into ``reports/sweeps/<name>/prompts.parquet``; :func:`evidence` turns one setting's confirmation rows into the arrays
of :class:`mmw.sweep.confirm.Evidence`. Metrics averages cannot be paired or pooled; these rows can (by prompt
against the same prompts' baseline, over runs and over prompt shards): :func:`pooled_metrics` pools a configuration's
shards into the metrics a run would report.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mmw.io import DETECTIONS, PERTURBED, RATINGS
from mmw.sweep.confirm import AttackEvidence, Evidence
from mmw.sweep.pipeline import cached_file, locked_outputs
from mmw.sweep.race_bounds import ratio_bounds, median_bounds, race_bounds, tuning_arrays

KEYS = ["prompt_id", "task", "source", "attack"]
DETECTION_COLUMNS = ("detected", "size", "size_valid", "size_anytime")
#: Column order of a per-prompt row (``size_anytime`` only where the detect stage writes it).
COLUMNS = [*KEYS, *DETECTION_COLUMNS, "rating", "in_R", "ok"]


def _read(repo: Path, path: Path, rev: str | None, locked: dict[str, str | None]) -> pl.DataFrame:
    """The table ``path`` of the run at ``rev``: straight from the local DVC cache by the md5 that the revision's
    dvc.lock records (``locked``: output path -> md5), else through DVC's API (the workspace, or a table only a
    remote holds). Each ``dvc.api.open`` builds the repository's index at that revision (the five tables of a run:
    3.47 s through it against 1.29 s here on a 2-core machine; bench/RESULTS.md, "Sweep evidence read from the DVC
    cache"); the cache file is what it would open."""
    cached = cached_file(repo, locked.get(str(path)))
    if cached is not None:
        return pl.read_parquet(cached)
    import dvc.api

    with dvc.api.open(str(path), repo=str(repo), rev=rev, mode="rb") as handle:
        return pl.read_parquet(io.BytesIO(handle.read()))


def join_rows(detections: pl.DataFrame, ratings: pl.DataFrame, perturbed: pl.DataFrame) -> pl.DataFrame:
    """One row per (prompt, source, attack) of one run: detections and ratings side by side (either may be
    missing: null), the attack's ``in_R`` and ``ok`` from the perturbation table (null for unattacked sources)."""
    def keyed(frame: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
        present = [c for c in columns if c in frame.columns]
        return frame.with_columns(pl.col("attack").cast(pl.String).fill_null("")).select([*KEYS, *present])

    rows = keyed(detections, DETECTION_COLUMNS).join(keyed(ratings, ["rating"]), on=KEYS, how="full",
                                                     coalesce=True)
    attacks = perturbed.select("prompt_id", pl.col("attack").cast(pl.String), "in_R", "ok")
    rows = rows.join(attacks, on=["prompt_id", "attack"], how="left")
    for column in ("size", "size_valid"):
        if column not in rows.columns:
            rows = rows.with_columns(pl.lit(None, dtype=pl.Float64).alias(column))
    rows = rows.with_columns(pl.col(c).cast(pl.Float64) for c in ("size", "size_valid", "rating")
                             ).with_columns(pl.col("rating").fill_nan(None))
    return rows.select([c for c in COLUMNS if c in rows.columns]).sort(KEYS)


def run_rows(read: Callable[[Path], pl.DataFrame]) -> pl.DataFrame:
    """The per-prompt rows (:func:`join_rows`) of one run whose tables ``read(path)`` returns (``path``: the
    pipeline's relative path of a table)."""
    detections = pl.concat([read(DETECTIONS[s]) for s in ("baseline", "watermarked")], how="diagonal_relaxed")
    ratings = pl.concat([read(RATINGS[s]) for s in ("baseline", "watermarked")], how="diagonal_relaxed")
    return join_rows(detections, ratings, read(PERTURBED))


def prompt_rows(repo: Path, rev: str | None) -> pl.DataFrame | None:
    """The per-prompt rows of the run at ``rev`` (:func:`join_rows`), or None when its tables are not in this
    repository's DVC cache (a sweep collected on another machine)."""
    try:
        locked = {} if rev is None else {path: digest for outs in locked_outputs(repo, rev).values()
                                         for path, digest in outs.items()}
        return run_rows(lambda path: _read(repo, path, rev, locked))
    except Exception:  # noqa: BLE001 - dvc raises many kinds (missing cache, missing rev): all mean "not here"
        return None


def _grid(rows: pl.DataFrame, runs: list[str], prompts: list[str], value: pl.Expr, **extra: list[str]) -> np.ndarray:
    """``value`` of ``rows`` on the full grid runs x extra axes x prompts (NaN where absent), that shape."""
    axes = {"experiment": runs, **extra, "prompt_id": prompts}
    full = None
    for name, values in axes.items():
        frame = pl.DataFrame({name: values}, schema={name: pl.String})
        full = frame if full is None else full.join(frame, how="cross")
    picked = rows.select([*axes, value.cast(pl.Float64).alias("_v")]).unique(subset=list(axes), keep="first")
    filled = full.join(picked, on=list(axes), how="left")
    return filled["_v"].fill_null(np.nan).to_numpy().reshape([len(v) for v in axes.values()])


def evidence(rows: pl.DataFrame, sizes: Sequence[float | None]) -> Evidence:
    """Confirmation evidence of one setting from its runs' per-prompt rows (column ``experiment`` tells the runs
    apart, in the order of ``sizes``' runs: sorted experiment names) and each run's size.

    Quality: the baseline and watermarked ratings of every prompt of any run. R: the attacks counted in R, on the
    prompts that were attacked; a failed attack (``ok`` false) is missing, as in :func:`mmw.metrics.attack_points`.
    """
    runs = sorted(rows["experiment"].unique().to_list())
    prompts = sorted(rows.filter(pl.col("source") == "watermarked")["prompt_id"].unique().to_list())
    rating = pl.col("rating")
    watermarked = _grid(rows.filter(pl.col("source") == "watermarked"), runs, prompts, rating)
    baseline = _grid(rows.filter(pl.col("source") == "baseline"), runs, prompts, rating)
    attacked_rows = rows.filter((pl.col("source") == "attack") & pl.col("in_R").fill_null(False))
    attacks = None
    if attacked_rows.height:
        names = sorted(attacked_rows["attack"].unique().to_list())
        attacked = sorted(attacked_rows["prompt_id"].unique().to_list())
        ok = attacked_rows.filter(pl.col("ok").fill_null(False))
        attacks = AttackEvidence(
            detected=_grid(ok, runs, attacked, pl.col("detected"), attack=names),
            rating_attacked=_grid(ok, runs, attacked, rating, attack=names),
            rating_reference=_grid(rows.filter(pl.col("source") == "watermarked"), runs, attacked, rating),
            no_attack=_grid(rows.filter(pl.col("source") == "retokenized"), runs, attacked, pl.col("detected")))
    values = np.array([np.inf if s is None else float(s) for s in sizes], dtype=float)
    return Evidence(watermarked=watermarked, baseline=baseline, sizes=values, attacks=attacks)


# -- a configuration's shards pooled into its metrics ---------------------------------------------------------------

def finite_number(value: Any) -> float | None:
    """A finite float, or None for NaN (infinity is kept: an undetected size); what metrics and logs hold."""
    value = float(value)
    return value if math.isfinite(value) else (None if math.isnan(value) else value)


#: Per-prompt size columns and the metric each pools into (a median over the pooled prompts; inf: undetected).
POOLED_SIZES = {"size_valid": "all.size_valid", "size": "all.size", "size_anytime": "all.size_anytime"}


def pooled_metrics(rows: pl.DataFrame) -> tuple[dict[str, float | None], dict[str, dict[str, float | None]]]:
    """``(metrics, attacks)`` of one configuration from its shards' pooled per-prompt rows (one row per prompt:
    a prompt seen twice counts once): ``all.relative_quality`` (ratio of the paired sums), ``all.tamper_resistance``
    (the hull of :func:`mmw.sweep.confirm.hull_resistance` at the pooled ``Q_A``, ``W_A``, ``W_0``), the median of
    each size column present (inf: undetected in half or more), ``all.n_prompts``; per attack counted in R:
    ``watermarked`` (detection rate) and ``quality_retained``. The same estimates the race's bounds are centred
    on (:func:`race_bounds`)."""
    attacked = rows.filter((pl.col("source") == "attack") & pl.col("in_R").fill_null(False))
    attacks = sorted(attacked["attack"].unique().to_list())
    marked = rows.filter(pl.col("source") == "watermarked")
    metrics: dict[str, float | None] = {}
    tuning = None
    for column, metric in POOLED_SIZES.items():
        if column not in marked.columns or (column == "size_anytime" and marked[column].null_count() == marked.height):
            continue
        tuning = tuning_arrays(rows, attacks, column)
        metrics[metric] = finite_number(median_bounds(tuning.sizes[0], 0.5)[0])
    tuning = tuning or tuning_arrays(rows, attacks)
    bounds = race_bounds(tuning, 0.05)
    metrics.update({"all.relative_quality": finite_number(bounds.quality[0]),
                    "all.tamper_resistance": finite_number(bounds.resistance[0]),
                    "all.n_prompts": float(bounds.prompts[0])})
    per_attack: dict[str, dict[str, float | None]] = {}
    evidence = tuning.attacked
    for index, name in enumerate(attacks):
        detected = evidence.detected[0, index]
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = float(np.nanmean(detected)) if (~np.isnan(detected)).any() else math.nan
            retained = ratio_bounds(evidence.rating_attacked[0, index], evidence.rating_reference[0], 0.05)[0]
        per_attack[name] = {"watermarked": finite_number(rate), "quality_retained": finite_number(retained), "size": None}
    return metrics, per_attack
