"""The experiments side by side in a terminal: the params that differ between runs and the headline metrics.

``dvc exp show`` prints every param and metric of every run; in an 80-column terminal that is a row of "…", and a
dict-valued param (``scheme.plugin_params``) prints as "-". This reads the same data (``dvc exp show --json``) and
prints, per run, its name, the headline metrics (median valid size, relative quality, tamper resistance R, full-text
FPR) and only the params whose values differ between the runs shown, dict-valued ones flattened to dotted keys, the
params column wrapped to the terminal's width::

    python -m mmw.reporting.exps                 # the workspace and its experiments
    python -m mmw.reporting.exps -A --width 100  # any `dvc exp show` option passes through (-A: every commit)

A param named ``key`` (the watermark key) is never printed.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmw.reporting.formats import fmt_number, fmt_percent, fmt_tokens

#: The headline metrics (``reports/metrics.json``'s pooled group): column title, metric, format.
HEADLINE = (("size", "all.size_valid", fmt_tokens), ("rel.Q", "all.relative_quality", lambda v: fmt_number(v, 3)),
            ("R", "all.tamper_resistance", lambda v: fmt_number(v, 2)), ("FPR", "all.fpr", fmt_percent))
#: Never printed: the watermark key, and params that only say where or how fast a run computed.
HIDDEN = ("key",)
NAME_WIDTH = 18


@dataclass(frozen=True)
class Run:
    """One row: ``name`` (the experiment's name, or the commit / workspace), its flattened params and metrics."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, Any]


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"scheme": {"plugin_params": {"depth": 30}}}`` -> ``{"scheme.plugin_params.depth": 30}``; a list of
    mappings keeps its JSON (``attacks.specs``)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _files(data: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The params (or metrics) of one row of ``dvc exp show --json``, every file's keys merged."""
    merged: dict[str, Any] = {}
    for content in (data.get(kind) or {}).values():
        merged.update(flatten((content or {}).get("data") or {}))
    return merged


def runs_of(shown: Sequence[Mapping[str, Any]]) -> list[Run]:
    """The rows of ``dvc exp show --json``: each commit (the workspace first) and its experiments."""
    runs: list[Run] = []

    def add(entry: Mapping[str, Any], fallback: str) -> None:
        data = entry.get("data") or {}
        rev = str(entry.get("rev") or data.get("rev") or fallback)
        name = entry.get("name") or data.get("name") or (rev if rev == "workspace" else rev[:7])
        params = {k: v for k, v in _files(data, "params").items() if k.rsplit(".", 1)[-1] not in HIDDEN}
        runs.append(Run(str(name), params, _files(data, "metrics")))

    for commit in shown:
        add(commit, "commit")
        for experiment in commit.get("experiments") or []:
            for rev in experiment.get("revs") or []:
                add(rev, str(experiment.get("name") or "experiment"))
    return runs


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def differing(runs: Sequence[Run]) -> list[str]:
    """The params whose values are not the same in every run (a param missing from a run counts as differing),
    in the order they first appear."""
    names = list(dict.fromkeys(name for run in runs for name in run.params))
    return [n for n in names if len({_value(run.params.get(n, "–")) for run in runs}) > 1]


def short_names(names: Sequence[str]) -> dict[str, str]:
    """Each dotted name by its shortest unambiguous tail (``scheme.delta`` -> ``delta``; two ``window`` params
    keep their sections)."""
    short: dict[str, str] = {}
    for name in names:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            tail = ".".join(parts[-depth:])
            if sum(n.split(".")[-depth:] == parts[-depth:] for n in names) == 1:
                short[name] = tail
                break
        else:
            short[name] = name
    return short


def table(runs: Sequence[Run], width: int = 80) -> str:
    """The runs as text no wider than ``width`` (at least 60): name, headline metrics, then the differing params
    as ``name=value`` pairs wrapped under their column."""
    width = max(width, 60)
    changed = differing(runs)
    short = short_names(changed)
    metric_widths = [max(len(title), 6) for title, _, _ in HEADLINE]
    head = f"{'experiment':<{NAME_WIDTH}}" + "".join(f" {t:>{w}}" for (t, _, _), w in zip(HEADLINE, metric_widths,
                                                                                          strict=True))
    params_width = width - len(head) - 2
    lines = [f"{head}  params that differ" if params_width >= 18 else head]
    for run in runs:
        name = run.name if len(run.name) <= NAME_WIDTH - 1 else run.name[:NAME_WIDTH - 2] + "…"
        cells = []
        for (_, metric, fmt), w in zip(HEADLINE, metric_widths, strict=True):
            value = run.metrics.get(metric)
            if isinstance(value, float) and math.isnan(value):
                value = None
            cells.append(f" {fmt(value) if value is not None else '–':>{w}}")
        row = f"{name:<{NAME_WIDTH}}" + "".join(cells)
        pairs = " ".join(f"{short[p]}={_value(run.params.get(p, '–'))}" for p in changed) or "(same params)"
        if params_width >= 18:
            wrapped = textwrap.wrap(pairs, params_width, break_on_hyphens=False) or [""]
            lines.append(f"{row}  {wrapped[0]}")
            lines += [" " * (len(head) + 2) + rest for rest in wrapped[1:]]
        else:  # too narrow for a column: the params on their own lines
            lines.append(row)
            lines += ["  " + rest for rest in textwrap.wrap(pairs, width - 2, break_on_hyphens=False)]
    if changed:
        lines.append("")
        lines += textwrap.wrap("params: " + ", ".join(f"{short[p]} = {p}" for p in changed if short[p] != p),
                               width, subsequent_indent="  ") if any(short[p] != p for p in changed) else []
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mmw.reporting.exps [--width N] [dvc exp show options]``; exit 2 with one line on a bad width or
    when ``dvc exp show`` fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    width = shutil.get_terminal_size((80, 24)).columns
    if "--width" in args:
        at = args.index("--width")
        try:
            width = int(args[at + 1])
            if width < 60:
                raise ValueError
        except (IndexError, ValueError):
            print("--width: allowed: an integer >= 60 (columns)", file=sys.stderr)
            return 2
        del args[at:at + 2]
    # The dvc of this environment, found without the environment being activated.
    beside = Path(sys.executable).with_name("dvc")
    dvc = str(beside) if beside.is_file() else shutil.which("dvc")
    if dvc is None:
        print("dvc: not installed in this environment (pip install dvc)", file=sys.stderr)
        return 2
    done = subprocess.run([dvc, "exp", "show", "--json", *args], capture_output=True, text=True)
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or ["failed"])[-1]
        print(f"dvc exp show: {message}", file=sys.stderr)
        return 2
    sys.stdout.write(table(runs_of(json.loads(done.stdout or "[]")), width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
