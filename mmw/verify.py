"""Does a re-run reproduce the committed numbers? Per metric: exactly, within the committed run's uncertainty, or not.

A re-run on the same numeric path (:mod:`mmw.provenance`: instruction sets, dtypes, devices, threads, library
versions) must give the same bytes, so any change there is a finding. On another path float32 kernels round
differently, a sampled token can flip and everything downstream moves; the question is then whether it moves by
more than the committed run's own uncertainty says a re-run of the experiment may. Each metric gets a tolerance
from the committed metrics themselves (:func:`tolerance`, one rule per kind of metric; docs/DVC.md lists them):

* ``ci``: a metric reported with an interval (``X_ci_low``/``X_ci_high``) must fall inside the committed interval;
  the interval's bounds themselves may move by its half-width.
* ``share``: a proportion of ``n`` texts may move by 2 standard errors, ``2 sqrt(p(1-p)/n)`` with ``p`` taken as
  ``(k+1)/(n+2)`` (so that 0/n and n/n still admit one text's flip).
* ``rating``: a mean judge rating (or quality retained) moves with the relative uncertainty of its group's relative
  quality (the interval's half-width over its value); an attack, which has no interval, takes the whole run's,
  scaled by ``sqrt(n_all / n)``.
* ``spread``: a mean or median of positive per-text quantities (tokens, sizes, perplexities) may move by
  ``2 c |x| / sqrt(n)``: their spread taken as at most their level (coefficient of variation <= 1), ``c`` = 1 for a
  mean, 1.2533 for a median.
* ``hull``: tamper resistance (twice the area under the attacks' hull) may move by twice the largest moves its
  points may make, ``2 (max share tolerance + max quality-retained tolerance)``.
* ``events``: a count of rare events (failed attacks, re-tokenization flips, missing ratings) may move by
  ``2 sqrt(k + 1)``.
* ``exact``: design counts, names, flags and missing values (null) must be equal.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer
import yaml

from mmw import provenance

#: The files a run is verified by, relative to the repository root.
METRICS_FILE = "reports/metrics.json"
QUALITY_FILE = "reports/quality.json"
LOCK_FILE = "dvc.lock"

#: Verdicts, from best to worst; only the last two fail the check.
EXACT, WITHIN, CHANGED, DIFFERS, MISSING = "exact", "within", "changed", "differs", "missing"
FAILING = (DIFFERS, MISSING)

Reader = Callable[[str], str | None]

_MEDIANS = ("size", "size_valid", "size_anytime")
_MEANS = ("mean_tokens",)
_RATINGS = ("quality_baseline", "quality_watermarked", "quality_retained")
_EVENTS = ("retokenization_flips", "ratings_missing", "n_failed")
_DESIGN_COUNTS = ("generations", "n", "fpr_keys", "n_baseline", "n_watermarked", "num_buckets")
#: A sample median's standard error over the mean's, for a normal sample: sqrt(pi / 2) = 1.2533.
_MEDIAN_SE = math.sqrt(math.pi / 2)


@dataclass(frozen=True)
class Row:
    """One compared value: ``name`` (a path through the JSON, '/'-joined), the committed and the re-run value,
    the tolerance and the rule it came from, and the verdict."""

    name: str
    committed: Any
    run: Any
    tolerance: float | None
    rule: str
    verdict: str


def git_reader(rev: str, repo: Path = Path(".")) -> Reader:
    """Read files as committed at ``rev`` (None where the file is not in that commit)."""
    def read(path: str) -> str | None:
        done = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None
    return read


def dir_reader(root: Path) -> Reader:
    """Read files under ``root`` (None where missing)."""
    def read(path: str) -> str | None:
        file = root / path
        return file.read_text() if file.is_file() else None
    return read


def _leaves(data: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, value) of every non-dict value; lists are values."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*prefix, str(key)))
    else:
        yield prefix, data


def _get(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _share_tolerance(p: float, n: float) -> float:
    smoothed = (p * n + 1) / (n + 2)
    return 2 * math.sqrt(smoothed * (1 - smoothed) / n)


def _group_n(metrics: dict[str, Any], group: tuple[str, ...]) -> float | None:
    """The number of texts behind the metrics of ``group`` (a metrics.json group, an attack, a quality group)."""
    node = _get(metrics, group) or {}
    for key in ("generations", "n", "relative_quality_n", "n_watermarked", "n_baseline", "fpr_n"):
        if isinstance(node.get(key), int | float) and node[key]:
            return float(node[key])
    return None


def _relative_half_width(metrics: dict[str, Any], group: tuple[str, ...]) -> tuple[float, float] | None:
    """(half-width / value, n) of the relative quality interval of ``group``, else of the whole run, else None."""
    node = _get(metrics, group) or {}
    every = node if "relative_quality_ci_low" in node else metrics.get("all") or {}
    value, low, high, n = (every.get(k) for k in ("relative_quality", "relative_quality_ci_low",
                                                  "relative_quality_ci_high", "relative_quality_n"))
    if None in (value, low, high, n) or not value:
        return None
    return (high - low) / 2 / abs(value), float(n)


def tolerance(metrics: dict[str, Any], path: tuple[str, ...]) -> tuple[float | None, str]:
    """(tolerance, rule) of the committed value at ``path`` in ``metrics`` (module docstring); tolerance None
    means it must be equal."""
    value = _get(metrics, path)
    name, group = path[-1], path[:-1]
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None, "exact"
    parent = _get(metrics, group) or {}
    for suffix in ("_ci_low", "_ci_high"):
        if name.endswith(suffix) and f"{name.removesuffix(suffix)}_ci_high" in parent:
            base = name.removesuffix(suffix)
            return (parent[f"{base}_ci_high"] - parent[f"{base}_ci_low"]) / 2, "ci"
    if f"{name}_ci_low" in parent and f"{name}_ci_high" in parent:
        return None, "ci"  # checked against the interval itself (compare_values)
    if name in _DESIGN_COUNTS or name.endswith("_n"):
        return None, "exact"
    if name in _EVENTS:
        return 2 * math.sqrt(value + 1), "events"
    n = _group_n(metrics, group)
    if name == "tamper_resistance":
        return _hull_tolerance(metrics), "hull"
    if name in _RATINGS:
        relative = _relative_half_width(metrics, group)
        if relative is None or n is None:
            return None, "exact"
        half, n_all = relative
        return half * math.sqrt(n_all / n) * abs(value), "rating"
    if n is None:
        return None, "exact"
    if name in _MEDIANS or name in _MEANS or name.startswith("perplexity"):
        return 2 * (_MEDIAN_SE if name in _MEDIANS else 1.0) * abs(value) / math.sqrt(n), "spread"
    if 0 <= value <= 1:
        return _share_tolerance(value, n), "share"
    return None, "exact"


def _hull_tolerance(metrics: dict[str, Any]) -> float | None:
    attacks = metrics.get("attacks") or {}
    shares, retained = [], []
    for name in attacks:
        for key, into in (("watermarked", shares), ("quality_retained", retained)):
            tol, _ = tolerance(metrics, ("attacks", name, key))
            if tol is not None:
                into.append(tol)
    if not shares:
        return None
    return 2 * (max(shares) + (max(retained) if retained else 0.0))


def compare_values(metrics: dict[str, Any], path: tuple[str, ...], run_value: Any) -> Row:
    """The row of one committed metric (``metrics`` at ``path``) against its re-run value."""
    committed = _get(metrics, path)
    tol, rule = tolerance(metrics, path)
    name = "/".join(path)
    if committed == run_value and type(committed) is type(run_value):
        return Row(name, committed, run_value, tol, rule, EXACT)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (committed, run_value))
    if not numbers:
        return Row(name, committed, run_value, tol, rule, DIFFERS)
    if committed == run_value:
        return Row(name, committed, run_value, tol, rule, EXACT)
    if rule == "ci" and tol is None:
        parent = _get(metrics, path[:-1])
        low, high = parent[f"{path[-1]}_ci_low"], parent[f"{path[-1]}_ci_high"]
        return Row(name, committed, run_value, (high - low) / 2, rule,
                   WITHIN if low <= run_value <= high else DIFFERS)
    within = tol is not None and abs(run_value - committed) <= tol
    return Row(name, committed, run_value, tol, rule, WITHIN if within else DIFFERS)


def _has(data: dict[str, Any], path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def compare_metrics(committed: dict[str, Any], run: dict[str, Any], prefix: str = "") -> list[Row]:
    """Rows for every committed metric (missing from the run: ``missing``) and every metric new in the run."""
    rows = []
    for path, _ in _leaves(committed):
        run_value = _get(run, path)
        if not _has(run, path):
            rows.append(Row(prefix + "/".join(path), _get(committed, path), None, None, "exact", MISSING))
        else:
            row = compare_values(committed, path, run_value)
            rows.append(Row(prefix + row.name, row.committed, row.run, row.tolerance, row.rule, row.verdict))
    known = {path for path, _ in _leaves(committed)}
    rows += [Row(prefix + "/".join(path), None, value, None, "new", CHANGED)
             for path, value in _leaves(run) if path not in known]
    return rows


def lock_outputs(lock_text: str | None) -> dict[str, str]:
    """Output path -> md5 of every stage output in a dvc.lock text ({} when absent)."""
    if not lock_text:
        return {}
    stages = (yaml.safe_load(lock_text) or {}).get("stages", {})
    return {out["path"]: out.get("md5", "") for stage in stages.values() for out in stage.get("outs", [])}


def compare_outputs(committed: dict[str, str], run: dict[str, str], same_path: bool) -> list[Row]:
    """Rows for the committed outputs' md5s: equal is ``exact``; different is a finding (``differs``) on the same
    numeric path and ``changed`` (expected) on another."""
    rows = []
    for path, md5 in sorted(committed.items()):
        if path.startswith(str(provenance.PROVENANCE_DIR)):
            continue  # the numeric path is compared field by field
        new = run.get(path)
        verdict = MISSING if new is None else EXACT if new == md5 else DIFFERS if same_path else CHANGED
        rows.append(Row(f"{LOCK_FILE}: {path}", md5, new, None, "md5", verdict))
    return rows


def _records(read: Reader) -> dict[str, dict[str, Any]]:
    """The per-stage records (DVC-cached), else the committed all-stages file (a clone without the DVC cache)."""
    texts = {stage: read(f"{provenance.PROVENANCE_DIR}/{stage}.json") for stage in provenance.STAGES}
    return provenance.from_texts(texts, read(str(provenance.COMMITTED)))


@dataclass
class Report:
    """The whole check: metric and output rows, the numeric-path differences, and whether the paths are known to be
    the same (both sides recorded, no difference)."""

    rows: list[Row]
    path_differences: list[tuple[str, str, str | None, str | None]]
    same_path: bool
    path_known: bool

    @property
    def failed(self) -> bool:
        return any(row.verdict in FAILING for row in self.rows)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.verdict] = counts.get(row.verdict, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {"same_numeric_path": self.same_path if self.path_known else None, "failed": self.failed,
                "counts": self.counts(), "path_differences": [list(d) for d in self.path_differences],
                "rows": [asdict(row) for row in self.rows]}


def verify(committed: Reader, run: Reader) -> Report:
    """Compare a run (``run``) with the committed one: metrics.json, quality.json, dvc.lock and the numeric path."""
    ref_records, run_records = _records(committed), _records(run)
    path_known = bool(ref_records) and bool(run_records)
    differences = provenance.differences(ref_records, run_records) if path_known else []
    same_path = path_known and not differences
    rows: list[Row] = []
    for file, prefix in ((METRICS_FILE, ""), (QUALITY_FILE, "quality/")):
        ref_text, run_text = committed(file), run(file)
        if ref_text is None:
            continue
        if run_text is None:
            rows.append(Row(file, "present", None, None, "exact", MISSING))
            continue
        rows += compare_metrics(json.loads(ref_text), json.loads(run_text), prefix)
    rows += compare_outputs(lock_outputs(committed(LOCK_FILE)), lock_outputs(run(LOCK_FILE)), same_path)
    if same_path:  # on the same numeric path nothing may move: a "within" is a finding too
        rows = [Row(r.name, r.committed, r.run, r.tolerance, r.rule, DIFFERS) if r.verdict == WITHIN else r
                for r in rows]
    return Report(rows, differences, same_path, path_known)


def _fmt(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}(\.dir)?", value):
        return value[:12]  # an md5: its head tells two apart
        return f"{value:.6g}"
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 34 else text[:31] + "..."


def render(report: Report) -> str:
    """The plain-text table printed by ``mmw verify``."""
    if not report.path_known:
        path = "numeric path: unknown (no provenance records on one side) -- md5 changes are not judged"
    elif report.same_path:
        path = "numeric path: the same as the committed run's -- every value must be exact"
    else:
        path = "numeric path: differs from the committed run's:\n" + "\n".join(
            f"  {stage}: {field}: {old} -> {new}" for stage, field, old, new in report.path_differences)
    width = max([len(row.name) for row in report.rows] + [6])
    lines = [path, "", f"{'metric':<{width}}  {'committed':>12}  {'this run':>12}  {'tolerance':>10}  {'rule':<6}  "
                       "verdict"]
    for row in report.rows:
        tol = "" if row.tolerance is None else f"{row.tolerance:.3g}"
        lines.append(f"{row.name:<{width}}  {_fmt(row.committed):>12}  {_fmt(row.run):>12}  {tol:>10}  "
                     f"{row.rule:<6}  {row.verdict}")
    lines += ["", "  ".join(f"{verdict}: {n}" for verdict, n in sorted(report.counts().items())),
              "result: " + ("DIFFERS (a finding)" if report.failed else "reproduced")]
    return "\n".join(lines)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def command(
    against: str = typer.Option("HEAD", help="the git revision holding the committed numbers"),
    reference: Path | None = typer.Option(None, help="a directory holding them instead (reports/metrics.json, "
                                                     "reports/quality.json, dvc.lock, reports/provenance/)"),
    run: Path = typer.Option(Path("."), help="the re-run's repository root"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the rows here (JSON)"),
) -> None:
    """Compare a re-run (after `dvc repro`) with the committed numbers: per metric exact, within the committed
    run's uncertainty, or differs; exit code 1 when anything differs or is missing."""
    committed = dir_reader(reference) if reference is not None else git_reader(against, run)
    if committed(METRICS_FILE) is None:
        typer.echo(f"error: no {METRICS_FILE} in {reference or against}", err=True)
        raise typer.Exit(2)
    report = verify(committed, dir_reader(run))
    typer.echo(render(report))
    if json_out is not None:
        json_out.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    raise typer.Exit(1 if report.failed else 0)
