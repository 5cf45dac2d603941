"""The paper's parameter selection over DVC experiments: which watermark, with which parameters, to deploy.

Paper, "Aggregate metric": among the evaluated parameter settings keep those whose quality loss is at most a
target (paper: 1 %, i.e. relative quality >= 0.99) and whose tamper resistance reaches a target (paper: 0.2), and
pick the one with the smallest watermark size. That choice is optimistic (it was made on the same runs that
measure it), so the pick is then re-evaluated with a fresh seed and a fresh key: that second size is the
aggregate metric.

Here every evaluated setting is one row of ``dvc exp show --json`` (the workspace, the baseline commit and each
experiment); its params come from ``params.yaml`` and its metrics from ``reports/metrics.json`` (the ``all``
group written by the ``aggregate`` stage). ``scheme.key`` is dropped as soon as the JSON is read: the key is
never part of a table, a report or a printed command.

Typical use (what ``mmw select`` does)::

    experiments = read_experiments(Path("."))
    selection = select(experiments.table, Constraints(max_quality_loss=0.01, min_tamper_resistance=0.2))
    print(selection.pick, rerun_command(experiments, selection.pick["rev"], fresh_seed(experiments.table)))
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import yaml

from mmw.errors import SpecError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PARAMS_FILE = "params.yaml"
METRICS_FILE = "reports/metrics.json"
#: Params that are never copied into a table, a report or a command (the watermark key).
HIDDEN_PARAMS = frozenset({"scheme.key"})
#: The metric group the selection reads (the pooled tasks); its columns are prefixed ``all.``.
METRIC_GROUP = "all"
SIZE, QUALITY, RESISTANCE, FPR_HIGH = ("all.size", "all.relative_quality", "all.tamper_resistance",
                                       "all.fpr_ci_high")
#: Row kinds, in the order used to break exact ties (a named experiment can be re-run by name, the workspace not).
KINDS = ("experiment", "baseline", "workspace")
#: ``dvc exp show`` executor states, as reported in the ``status`` column (``done`` = finished without error).
STATUS_OF_STATE = {"success": "done", "failed": "failed", "running": "running", "queued": "queued"}


@dataclass(frozen=True)
class Constraints:
    """Deployment targets. A setting is feasible when all hold and its watermark is detected (finite size).

    * ``max_quality_loss`` in ``[0, 1)``: relative quality must be at least ``1 - max_quality_loss``
      (paper: 0.01).
    * ``min_tamper_resistance`` in ``[0, 1]``: ``R >= min_tamper_resistance`` (paper: 0.2).
    * ``max_fpr`` in ``[0, 1]`` or None: the upper end of the empirical false-positive rate's 95 % interval
      must not exceed it (None = not checked).

    Bad values raise :class:`SpecError` naming the command-line option.
    """

    max_quality_loss: float = 0.01
    min_tamper_resistance: float = 0.2
    max_fpr: float | None = None

    def __post_init__(self) -> None:
        _check_range("--max-quality-loss", self.max_quality_loss, high_open=True,
                     allowed="a quality loss in [0, 1), e.g. 0.01 for at most 1 %")
        _check_range("--min-tamper-resistance", self.min_tamper_resistance, high_open=False,
                     allowed="a tamper resistance R in [0, 1], e.g. 0.2")
        if self.max_fpr is not None:
            _check_range("--max-fpr", self.max_fpr, high_open=False,
                         allowed="a false-positive rate in [0, 1], e.g. 0.05")

    @property
    def min_relative_quality(self) -> float:
        return 1.0 - self.max_quality_loss


def _check_range(option: str, value: Any, high_open: bool, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise SpecError(option, f"expected a number, got {value!r}", allowed)
    if value < 0 or value > 1 or (high_open and value == 1):
        raise SpecError(option, f"{value:g} is out of range", allowed)


@dataclass(frozen=True)
class Experiments:
    """What ``dvc exp show --json`` knows, without the key.

    ``table``: one row per workspace / baseline commit / experiment with columns ``name, rev, kind, status,
    error, seed, model.temperature, scheme.*`` (never ``scheme.key``) and ``all.*`` (the metrics of the pooled
    tasks; ``all.size`` is ``inf`` when the watermark was not detected, null when the row has no metrics).
    ``params``: ``rev -> {dotted.param: value}``, every ``params.yaml`` leaf but the hidden ones (list items are
    addressed by index, ``attacks.specs.0.p``), for building re-run commands.
    """

    table: pl.DataFrame
    params: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select`.

    ``table``: every input row plus ``feasible`` (bool), ``reason`` (why infeasible, ``"; "``-joined, null when
    feasible) and ``rank`` (1 = the pick, null when infeasible), sorted feasible-first by rank.
    ``feasible``: the feasible rows sorted by size (ties: higher relative quality, higher R, experiment before
    baseline before workspace, name). ``pick``: the first feasible row as a dict, or None.
    """

    table: pl.DataFrame
    feasible: pl.DataFrame
    pick: dict[str, Any] | None
    constraints: Constraints


# ---------------------------------------------------------------------------------------------- reading


def dvc_executable() -> str:
    """The ``dvc`` installed next to this interpreter (the project's venv), else the one on ``PATH``."""
    beside = shutil.which("dvc", path=str(Path(sys.executable).parent))
    found = beside or shutil.which("dvc")
    if found is None:
        raise SpecError("dvc", "command not found next to this Python nor on PATH", "pip install 'mmw[pipeline]'")
    return found


def exp_show_json(repo: Path) -> list[dict[str, Any]]:
    """Run ``dvc exp show --json`` in ``repo`` and return its parsed output (a list of top-level entries)."""
    completed = subprocess.run([dvc_executable(), "exp", "show", "--json"], cwd=repo, capture_output=True,
                               text=True, check=False)
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SpecError("dvc exp show", f"failed in {repo}: {last_line}",
                        "a git repository with a DVC pipeline (run `dvc repro` first)")
    # DVC may print warnings before the JSON document; the document is the last line starting with "[".
    lines = completed.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("[")]
    if not starts:
        raise SpecError("dvc exp show", f"printed no JSON in {repo}", "DVC >= 3")
    return json.loads("\n".join(lines[starts[-1]:]))


def read_experiments(repo: Path) -> Experiments:
    """:func:`experiments_from_exp_show` of ``dvc exp show --json`` run in ``repo``."""
    return experiments_from_exp_show(exp_show_json(repo))


def _revisions(entries: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """Yield ``(kind, revision, executor)`` for the workspace, each baseline commit and each of its experiments."""
    for entry in entries:
        yield ("workspace" if entry.get("rev") == "workspace" else "baseline"), entry, None
        for experiment in entry.get("experiments") or []:
            for revision in experiment.get("revs") or []:
                yield "experiment", revision, experiment.get("executor")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": [1, {"c": 2}]}} -> {"a.b.0": 1, "a.b.1.c": 2}`` (the dotted paths ``dvc exp run -S`` takes)."""
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in items:
        flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _file_data(section: dict[str, Any] | None, file: str) -> tuple[dict[str, Any] | None, str | None]:
    """The parsed content of ``file`` in a ``params``/``metrics`` section of exp show, or ``(None, error)``."""
    record = (section or {}).get(file)
    if record is None:
        return None, f"no {file}"
    if record.get("error"):
        return None, f"no {file} ({record['error'].get('type') or 'error'})"
    return record.get("data") or {}, None


def _metric_value(value: Any) -> Any:
    """metrics.json stores +inf as the string "inf" (mmw.io.write_json); everything else is a number or null."""
    if isinstance(value, str) and value in ("inf", "-inf"):
        return float(value)
    return value


def _column(name: str, values: list[Any]) -> pl.Series:
    """One column with a dtype that fits every value: Int64, Float64, Boolean or String (others as YAML text)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pl.Series(name, values, dtype=pl.Boolean)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pl.Series(name, values, dtype=pl.Int64)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pl.Series(name, [None if v is None else float(v) for v in values], dtype=pl.Float64)
    return pl.Series(name, [None if v is None else v if isinstance(v, str) else
                            yaml.safe_dump(v, default_flow_style=True).strip() for v in values], dtype=pl.String)


def experiments_from_exp_show(entries: list[dict[str, Any]]) -> Experiments:
    """Turn parsed ``dvc exp show --json`` output into an :class:`Experiments` table (see its docstring).

    Rows without ``reports/metrics.json`` (failed, queued or running experiments) stay in the table with null
    metrics and the reason in ``error``. Raises :class:`SpecError` when no row has metrics.
    """
    records: list[dict[str, Any]] = []
    params_by_rev: dict[str, dict[str, Any]] = {}
    for kind, revision, executor in _revisions(entries):
        rev = str(revision.get("rev"))
        data = revision.get("data") or {}
        params, params_error = _file_data(data.get("params"), PARAMS_FILE)
        metrics, metrics_error = _file_data(data.get("metrics"), METRICS_FILE)
        flat_params = {k: v for k, v in _flatten(params or {}).items() if k not in HIDDEN_PARAMS}
        params_by_rev[rev] = flat_params
        state = (executor or {}).get("state")
        failed = revision.get("error") or data.get("error")
        status = "failed" if failed else STATUS_OF_STATE.get(state or "success", state or "done")
        errors = [e for e in (metrics_error, params_error) if e]
        if failed:
            errors.insert(0, str(failed.get("msg") if isinstance(failed, dict) else failed))
        group = (metrics or {}).get(METRIC_GROUP)
        if metrics is not None and not isinstance(group, dict):
            errors.append(f"no '{METRIC_GROUP}' group in {METRICS_FILE}")
        name = "workspace" if kind == "workspace" else revision.get("name") or rev[:7]
        record: dict[str, Any] = {"name": name, "rev": rev, "kind": kind, "status": status,
                                  "error": "; ".join(errors) if errors else None,
                                  "seed": flat_params.get("seed"),
                                  "model.temperature": flat_params.get("model.temperature")}
        record.update({k: v for k, v in flat_params.items() if k.startswith("scheme.")})
        if isinstance(group, dict):
            record.update({f"{METRIC_GROUP}.{k}": _metric_value(v) for k, v in group.items()
                           if not isinstance(v, dict | list)})
        records.append(record)
    if not any(any(k.startswith(f"{METRIC_GROUP}.") for k in r) for r in records):
        raise SpecError("experiments", f"none of the {len(records)} revisions has {METRICS_FILE}",
                        "run `dvc repro` or `dvc exp run -S ...` first")
    columns: list[str] = []
    for record in records:
        columns.extend(k for k in record if k not in columns)
    scheme = sorted(c for c in columns if c.startswith("scheme."))
    metric_columns = [c for c in columns if c.startswith(f"{METRIC_GROUP}.")]
    for required in (SIZE, QUALITY, RESISTANCE, FPR_HIGH):  # always present, so selection can rely on them
        if required not in metric_columns:
            metric_columns.append(required)
    ordered = ["name", "rev", "kind", "status", "error", "seed", "model.temperature", *scheme, *metric_columns]
    table = pl.DataFrame([_column(c, [r.get(c) for r in records]) for c in ordered])
    for metric in (SIZE, QUALITY, RESISTANCE, FPR_HIGH):
        table = table.with_columns(pl.col(metric).cast(pl.Float64))
    return Experiments(table=table, params=params_by_rev)


# ---------------------------------------------------------------------------------------------- selecting


def _failures(constraints: Constraints) -> list[tuple[pl.Expr, pl.Expr]]:
    """``(failed, reason)`` expression pairs, one per condition a feasible row must meet."""
    q_min, r_min = constraints.min_relative_quality, constraints.min_tamper_resistance
    size, quality, resistance = pl.col(SIZE), pl.col(QUALITY), pl.col(RESISTANCE)
    checks = [
        (size.is_null(), pl.when(pl.col("error").is_not_null()).then(pl.format("no metrics: {}", pl.col("error")))
         .otherwise(pl.lit("size unknown"))),
        (size.is_not_null() & quality.is_null(), pl.lit("relative quality unknown (no ratings)")),
        (quality < q_min, pl.format(f"relative quality {{}} < {q_min:g} (loss > {constraints.max_quality_loss:g})",
                                    quality.round(4))),
        (size.is_not_null() & resistance.is_null(), pl.lit("tamper resistance unknown (no attack in R)")),
        (resistance < r_min, pl.format(f"R {{}} < {r_min:g}", resistance.round(4))),
        (size.is_infinite(), pl.lit("size inf (not detected in at least half of the generations)")),
    ]
    if constraints.max_fpr is not None:
        fpr_high = pl.col(FPR_HIGH)
        checks += [
            (size.is_not_null() & fpr_high.is_null(), pl.lit("FPR upper CI unknown (no baseline detections)")),
            (fpr_high > constraints.max_fpr,
             pl.format(f"FPR upper CI {{}} > {constraints.max_fpr:g}", fpr_high.round(4))),
        ]
    return checks


def select(table: pl.DataFrame, constraints: Constraints) -> Selection:
    """Apply ``constraints`` to an :func:`experiments_from_exp_show` table (needs ``name, kind`` and the
    ``all.size / all.relative_quality / all.tamper_resistance / all.fpr_ci_high`` columns; ``error`` optional).

    A row is feasible when it has metrics, ``relative_quality >= 1 - max_quality_loss``,
    ``tamper_resistance >= min_tamper_resistance``, a finite size and, with ``max_fpr``,
    ``fpr_ci_high <= max_fpr``; an unknown (null) metric fails its condition. The pick is the feasible row of
    smallest size (see :class:`Selection` for ties).
    """
    if table.height == 0:
        raise SpecError("experiments", "the table is empty", "run `dvc repro` or `dvc exp run -S ...` first")
    if "error" not in table.columns:
        table = table.with_columns(pl.lit(None, dtype=pl.String).alias("error"))
    checks = _failures(constraints)
    reasons = pl.concat_list([pl.when(failed.fill_null(False)).then(reason).otherwise(None)
                              for failed, reason in checks]).list.drop_nulls()
    kind_order = pl.col("kind").replace_strict(dict(zip(KINDS, range(len(KINDS)), strict=True)), default=len(KINDS),
                                               return_dtype=pl.Int64)
    judged = (table.with_columns(reasons.alias("_reasons"), kind_order.alias("_kind_order"))
              .with_columns((pl.col("_reasons").list.len() == 0).alias("feasible"),
                            pl.col("_reasons").list.join("; ").alias("reason"))
              .with_columns(pl.when(pl.col("feasible")).then(None).otherwise(pl.col("reason")).alias("reason")))
    order = [SIZE, QUALITY, RESISTANCE, "_kind_order", "name"]
    descending = [False, True, True, False, False]
    feasible = (judged.filter(pl.col("feasible")).sort(order, descending=descending, nulls_last=True)
                .with_row_index("rank", offset=1).with_columns(pl.col("rank").cast(pl.Int64)))
    infeasible = (judged.filter(~pl.col("feasible")).sort(order, descending=descending, nulls_last=True)
                  .with_columns(pl.lit(None, dtype=pl.Int64).alias("rank")))
    columns = ["rank", *table.columns, "feasible", "reason"]
    result = pl.concat([feasible.select(columns), infeasible.select(columns)])
    pick = feasible.select(columns).row(0, named=True) if feasible.height else None
    return Selection(table=result, feasible=feasible.select(columns), pick=pick, constraints=constraints)


# ---------------------------------------------------------------------------------------------- re-evaluating


def fresh_seed(table: pl.DataFrame) -> int:
    """A seed no row of ``table`` used: one more than the largest (0 when no row has a seed)."""
    seeds = table["seed"].drop_nulls() if "seed" in table.columns else pl.Series([], dtype=pl.Int64)
    return int(seeds.max()) + 1 if len(seeds) else 0  # type: ignore[arg-type]


_PLAIN = re.compile(r"[A-Za-z0-9_\-./]+")


def _override_value(value: Any) -> str:
    """``value`` as ``dvc exp run -S`` parses it back (Hydra override grammar): quoted only where needed."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    # A plain string stays plain unless YAML would read it as something else ("null", "1.5", "true").
    if _PLAIN.fullmatch(text) and yaml.safe_load(text) == text:
        return text
    return json.dumps(text)


@dataclass(frozen=True)
class RerunCommand:
    """How to re-evaluate a pick with a new ``seed``.

    ``command``: one ``dvc exp run -S ...`` relative to the workspace's params.yaml. It is ``exact`` when the
    pick's params.yaml has the same keys as the workspace's; otherwise (e.g. a list of another length, which
    ``-S`` cannot shorten) ``fallback`` is exact: restore the pick's params.yaml, then change only the seed.
    """

    command: str
    exact: bool
    fallback: str
    seed: int


def rerun_command(experiments: Experiments, rev: str, seed: int) -> RerunCommand:
    """The de-biasing run for the row ``rev``: its scheme and temperature (always spelled out, so the command
    documents the setting), every other param that differs from the workspace's, and ``seed=<seed>``."""
    chosen = experiments.params[rev]
    workspace = experiments.params.get("workspace", chosen)
    overrides: dict[str, Any] = {"seed": seed}
    for key, value in chosen.items():
        if key in HIDDEN_PARAMS:  # Experiments.params never holds them; a hand-built mapping might
            continue
        if key != "seed" and (key.startswith("scheme.") or key == "model.temperature"
                              or key not in workspace or workspace[key] != value):
            overrides[key] = value
    parts = ["dvc", "exp", "run"]
    for key, value in overrides.items():
        parts += ["-S", shlex.quote(f"{key}={_override_value(value)}")]
    restore = "" if rev == "workspace" else f"git checkout {rev} -- {PARAMS_FILE} && "
    return RerunCommand(command=" ".join(parts), exact=set(chosen) == set(workspace),
                        fallback=f"{restore}dvc exp run -S seed={seed}", seed=seed)


# ---------------------------------------------------------------------------------------------- reporting


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
