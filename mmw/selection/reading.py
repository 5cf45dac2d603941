"""Reading DVC experiments through ``dvc.api``: one row per revision, its params and its metrics.

``dvc.api.exp_show`` lists the revisions (workspace, baseline commit, experiments) with their names and
executor states; the params and metrics of each come from ``dvc.api.params_show`` / ``dvc.api.metrics_show``
at that revision, which keep types exactly (``exp_show``'s flattened rows turn every falsy value, e.g.
``model.temperature: 0.0`` or ``seed: 0``, into None). The watermark key is dropped as soon as params are read:
it is never part of a table, a report or a printed command.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from mmw.errors import SpecError
from mmw.selection.selecting import FPR_HIGH, QUALITY, RESISTANCE, SIZE

PARAMS_FILE = "params.yaml"
METRICS_FILE = "reports/metrics.json"
#: Params that are never copied into a table, a report or a command (the watermark key, either layout).
HIDDEN_PARAMS = frozenset({"scheme.key", "key"})
#: The metric group the selection reads (the pooled tasks); its columns are prefixed ``all.``.
METRIC_GROUP = "all"
#: ``dvc exp show`` executor states -> the ``status`` column (``done`` = finished without error).
STATUS_OF_STATE = {"success": "done", "failed": "failed", "running": "running", "queued": "queued"}


@dataclass(frozen=True)
class Experiments:
    """What DVC knows about a repository's experiments, without the key.

    ``table``: one row per workspace / baseline commit / experiment with columns ``name, rev, kind, status,
    error``, every param as a dotted column (``seed``, ``model.temperature``, ``scheme.*``, ``attacks.specs`` as
    YAML text, ...; never the key) and ``all.*`` (the metrics of the pooled tasks; ``all.size`` is ``inf`` when
    stored as "inf", null when the row has no metrics). ``params``: ``rev -> {dotted.param: value}`` with list
    items addressed by index (``attacks.specs.0.p``), for re-run commands. ``attacks``: ``rev -> {attack name ->
    {metric: value}}`` from the ``attacks`` group of metrics.json.
    """

    table: pl.DataFrame
    params: dict[str, dict[str, Any]]
    attacks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


def flatten(value: Any, prefix: str = "", lists: bool = True) -> dict[str, Any]:
    """``{"a": {"b": [1, {"c": 2}]}} -> {"a.b.0": 1, "a.b.1.c": 2}`` (the dotted paths ``dvc exp run -S`` takes);
    with ``lists=False`` a list stays one value (``{"a.b": [1, {"c": 2}]}``)."""
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list) and lists:
        items = enumerate(value)
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, item in items:
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key), lists))
    return flat


def metric_value(value: Any) -> Any:
    """Older metrics.json files store +inf as the string "inf"; everything else is a number or null."""
    if isinstance(value, str) and value in ("inf", "-inf", "Infinity"):
        return float(value.replace("Infinity", "inf"))
    return value


def column(name: str, values: list[Any]) -> pl.Series:
    """One column with a dtype that fits every value: Int64, Float64, Boolean or String (others as YAML text)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pl.Series(name, values, dtype=pl.Boolean)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pl.Series(name, values, dtype=pl.Int64)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pl.Series(name, [None if v is None else float(v) for v in values], dtype=pl.Float64)
    return pl.Series(name, [None if v is None else v if isinstance(v, str) else
                            yaml.safe_dump(v, default_flow_style=True, width=1 << 16).strip() for v in values],
                     dtype=pl.String)


def _kind(row: Mapping[str, Any]) -> str:
    """exp_show's ``typ``: "baseline" for the workspace and the commits, "branch_commit" / "branch_base" for
    experiments (their place in the tree drawing)."""
    if row.get("rev") == "workspace":
        return "workspace"
    return "baseline" if row.get("typ") == "baseline" else "experiment"


def _read(function: Any, repo: Path, rev: str | None, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """``function(repo=..., rev=...)`` (a dvc.api reader) or ``(None, "no <what> (<error>)")``."""
    try:
        data = function(repo=str(repo), rev=rev)
    except Exception as err:  # dvc raises many types for a revision without the file; keep the reason
        return None, f"no {what} ({type(err).__name__})"
    return (data or None), (None if data else f"no {what}")


def _params_metrics(repo: Path, rev: str | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[str]]:
    """``(params, metrics, errors)`` of one revision (None: the workspace): params.yaml and metrics.json as
    mappings (None where unreadable, with the reason in ``errors``)."""
    import dvc.api

    params, params_error = _read(lambda **kw: dvc.api.params_show(PARAMS_FILE, **kw), repo, rev, PARAMS_FILE)
    metrics_all, metrics_error = _read(dvc.api.metrics_show, repo, rev, METRICS_FILE)
    if metrics_all is None and rev is not None:
        metrics_all, metrics_error = _committed_metrics(repo, rev)
    metrics = (metrics_all or {}).get(METRICS_FILE, metrics_all) if metrics_all else None
    return params, metrics, [e for e in (metrics_error, params_error) if e]


def read_revision(repo: Path, rev: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]],
                                                 list[str]]:
    """``(params, metrics, attacks, errors)`` of one commit, as :func:`read_experiments` reads each row: params
    flat (lists kept whole) without the key, the ``all.*`` metrics, ``attack name -> {metric: value}``."""
    params, metrics, errors = _params_metrics(repo, rev)
    return (*run_values(params, metrics), errors)


def run_values(params: dict[str, Any] | None, metrics: dict[str, Any] | None
          ) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """Params flat (lists kept whole) without the key; the ``all.*`` metrics; the per-attack metrics."""
    flat = {k: v for k, v in flatten(params or {}, lists=False).items() if k not in HIDDEN_PARAMS}
    group = (metrics or {}).get(METRIC_GROUP)
    values = {f"{METRIC_GROUP}.{k}": metric_value(v) for k, v in group.items()
              if not isinstance(v, dict | list)} if isinstance(group, dict) else {}
    attacks = (metrics or {}).get("attacks")
    by_attack = {str(a): dict(m) for a, m in attacks.items() if isinstance(m, dict)} if isinstance(attacks, dict) \
        else {}
    return flat, values, by_attack


def _committed_metrics(repo: Path, rev: str) -> tuple[dict[str, Any] | None, str | None]:
    """metrics.json as committed in ``rev``. DVC 3.67's ``metrics_show(rev=<experiment>)`` opens the file
    through the DVC filesystem, which fails for a ``cache: false`` output of an experiment commit although git
    holds it; the experiment's commit is the source of truth for such a file."""
    shown = subprocess.run(["git", "show", f"{rev}:{METRICS_FILE}"], cwd=repo, capture_output=True, text=True,
                           check=False)
    if shown.returncode != 0:
        return None, f"no {METRICS_FILE} in {rev[:7]}"
    try:
        return json.loads(shown.stdout), None
    except json.JSONDecodeError:
        return None, f"{METRICS_FILE} in {rev[:7]} is not JSON"


def read_experiments(repo: Path, pool_filter: Any = None) -> Experiments:
    """Every revision ``dvc.api.exp_show`` lists in ``repo`` (the workspace, ``HEAD`` and its experiments).

    ``pool_filter(name) -> bool`` (optional) keeps only the named experiments it accepts; the baseline rows
    are always kept, and the workspace row unless its params equal an experiment's (after ``dvc exp run`` the
    workspace repeats the last experiment, which may be one the filter rejects, e.g. a re-evaluation).
    Raises SpecError when DVC cannot read the repository or no row has metrics.
    """
    import dvc.api

    try:
        listed = dvc.api.exp_show(repo=str(repo))
    except Exception as err:
        raise SpecError("dvc exp show", f"failed in {repo}: {err}",
                        "a git repository with a DVC pipeline (run `dvc repro` first)") from None
    records: list[dict[str, Any]] = []
    params_by_rev: dict[str, dict[str, Any]] = {}
    attacks_by_rev: dict[str, dict[str, dict[str, Any]]] = {}
    experiment_params: list[dict[str, Any]] = []
    for row in listed:
        kind = _kind(row)
        name = "workspace" if kind == "workspace" else str(row.get("Experiment") or row.get("rev"))
        if kind == "experiment" and pool_filter is not None and not pool_filter(name):
            if "workspace" in params_by_rev:  # only needed to tell whether the workspace repeats this one
                hidden, _ = _read(lambda **kw: dvc.api.params_show(PARAMS_FILE, **kw), repo, str(row.get("rev")),
                                  PARAMS_FILE)
                experiment_params.append({k: v for k, v in flatten(hidden or {}).items() if k not in HIDDEN_PARAMS})
            continue
        state = str(row.get("State") or "success").lower()
        status = STATUS_OF_STATE.get(state, state)
        rev = "workspace" if kind == "workspace" else str(row.get("rev"))
        errors: list[str] = []
        params = metrics = None
        if status not in ("queued", "running"):
            params, metrics, read_errors = _params_metrics(repo, None if kind == "workspace" else rev)
            errors += read_errors
        if status == "failed":
            errors.insert(0, "the experiment failed")
        flat_lists = {k: v for k, v in flatten(params or {}).items() if k not in HIDDEN_PARAMS}
        params_by_rev[rev] = flat_lists
        if kind == "experiment":
            experiment_params.append(flat_lists)
        group = (metrics or {}).get(METRIC_GROUP)
        if metrics is not None and not isinstance(group, dict):
            errors.append(f"no '{METRIC_GROUP}' group in {METRICS_FILE}")
        record: dict[str, Any] = {"name": name, "rev": rev, "kind": kind, "status": status,
                                  "error": "; ".join(errors) if errors else None}
        flat, values, by_attack = run_values(params, metrics)
        record.update(flat)
        record.update(values)
        if isinstance((metrics or {}).get("attacks"), dict):
            attacks_by_rev[rev] = by_attack
        records.append(record)
    if pool_filter is not None and params_by_rev.get("workspace") in experiment_params:
        records = [r for r in records if r["kind"] != "workspace"]
    if not any(any(k.startswith(f"{METRIC_GROUP}.") for k in r) for r in records):
        raise SpecError("experiments", f"none of the {len(records)} revisions has {METRICS_FILE}",
                        "run `dvc repro` or `dvc exp run -S ...` first")
    return Experiments(table=to_table(records), params=params_by_rev, attacks=attacks_by_rev)


def to_table(records: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows of dotted columns -> a typed table: identity columns, params (sorted), then ``all.*`` metrics."""
    columns: list[str] = []
    for record in records:
        columns.extend(k for k in record if k not in columns)
    identity = [c for c in ("name", "rev", "kind", "status", "error") if c in columns]
    metric_columns = [c for c in columns if c.startswith(f"{METRIC_GROUP}.")]
    for required in (SIZE, QUALITY, RESISTANCE, FPR_HIGH):  # always present, so selection can rely on them
        if required not in metric_columns:
            metric_columns.append(required)
    params = sorted(c for c in columns if c not in identity and c not in metric_columns)
    ordered = [*identity, *params, *metric_columns]
    table = pl.DataFrame([column(c, [r.get(c) for r in records]) for c in ordered])
    for metric in (SIZE, QUALITY, RESISTANCE, FPR_HIGH):
        table = table.with_columns(pl.col(metric).cast(pl.Float64))
    return table

