"""Re-running a pick: the ``dvc exp run -S`` command that re-evaluates it with a fresh seed.

Nothing here reads DVC or decides feasibility (see :mod:`mmw.selection.reading` and
:mod:`mmw.selection.selecting`); the report and figure of a selection are :mod:`mmw.reporting.selection`'s.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

import polars as pl
import yaml

from mmw.selection.reading import HIDDEN_PARAMS, PARAMS_FILE, Experiments
from mmw.selection.reeval import REEVAL_PREFIX


def fresh_seed(table: pl.DataFrame) -> int:
    """A seed no row of ``table`` used: one more than the largest (0 when no row has a seed)."""
    seeds = table["seed"].drop_nulls() if "seed" in table.columns else pl.Series([], dtype=pl.Int64)
    return int(seeds.max()) + 1 if len(seeds) else 0  # type: ignore[arg-type]



_PLAIN = re.compile(r"[A-Za-z0-9_\-./]+")


def override_value(value: Any) -> str:
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


def rerun_command(experiments: Experiments, rev: str, seed: int, name: str | None = None) -> RerunCommand:
    """The de-biasing run for the row ``rev``: its scheme and temperature (always spelled out, so the command
    documents the setting), every other param that differs from the workspace's, and ``seed=<seed>``.

    With ``name`` (the pick's experiment name) the run is named ``reeval-<name>-s<seed>``: the prefix keeps it
    out of every later selection pool (a re-evaluation must never compete with what it re-evaluates)."""
    chosen = experiments.params[rev]
    workspace = experiments.params.get("workspace", chosen)
    overrides: dict[str, Any] = {"seed": seed}
    for key, value in chosen.items():
        if key in HIDDEN_PARAMS:  # Experiments.params never holds them; a hand-built mapping might
            continue
        if key != "seed" and (key.startswith("scheme.") or key == "model.temperature"
                              or key not in workspace or workspace[key] != value):
            overrides[key] = value
    named = f" -n {shlex.quote(f'{REEVAL_PREFIX}{name}-s{seed}')}" if name is not None else ""
    parts = [f"dvc exp run{named}"]
    for key, value in overrides.items():
        parts += ["-S", shlex.quote(f"{key}={override_value(value)}")]
    restore = "" if rev == "workspace" else f"git checkout {rev} -- {PARAMS_FILE} && "
    return RerunCommand(command=" ".join(parts), exact=set(chosen) == set(workspace),
                        fallback=f"{restore}dvc exp run{named} -S seed={seed}", seed=seed)
