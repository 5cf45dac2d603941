"""Atomic table and JSON writes, and the pipeline's file layout.

A stage that dies half-way must not leave a file that looks complete: every write goes to a temporary file in
the destination directory and is moved into place with ``os.replace`` (atomic on POSIX within one
filesystem), so readers see either the old file or the whole new one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from mmw.errors import SpecError

#: Where each stage reads and writes (relative to the repository root, which DVC runs stages in).
#: One-way fingerprint of the watermark key (stage ``key``): a DVC dependency that is not the key.
KEY_FINGERPRINT = Path("data/key.fingerprint")
PROMPTS = Path("data/prompts.parquet")
GENERATIONS = {"baseline": Path("data/generations/baseline.parquet"),
               "watermarked": Path("data/generations/watermarked.parquet")}
PERTURBED = Path("data/perturbed.parquet")
#: Detections and ratings are split by what they depend on (see dvc.yaml): baseline texts are never
#: re-rated when only the watermark changes. Both files of a pair share the schema of docs/ARCHITECTURE.md.
DETECTIONS = {"baseline": Path("data/detections/baseline.parquet"),
              "watermarked": Path("data/detections/watermarked.parquet")}
RATINGS = {"baseline": Path("data/ratings/baseline.parquet"),
           "watermarked": Path("data/ratings/watermarked.parquet")}
JUDGE_REPORT = Path("reports/judge.json")
TIMINGS_DIR = Path("reports/timings")
METRICS = Path("reports/metrics.json")
SUMMARY = Path("reports/summary.md")
PLOTS_DIR = Path("reports/plots")


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``, on error delete it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_table(frame: pl.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``frame`` as Parquet atomically."""
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp)


class MissingInputError(SpecError):
    """A stage's input file does not exist: one line naming the file and the stage that makes it (exit code 2,
    like every other "cannot start" error, before any heavy work)."""

    def __init__(self, path: Path):
        made_by = producer_of(path)
        if made_by is None:
            super().__init__(str(path), "missing input file (no stage of dvc.yaml makes it)")
        else:
            stage, cmd = made_by
            super().__init__(str(path), f"missing input file, made by stage `{stage}`: run `dvc repro {stage}` "
                             f"(or `{cmd}`) first")


def producer_of(path: str | os.PathLike[str], dvc_yaml: str | os.PathLike[str] = "dvc.yaml") -> tuple[str, str] | None:
    """(stage name, cmd) of the dvc.yaml stage whose ``outs`` contain ``path`` (a file, or one under an output
    directory); None when no stage makes it or there is no dvc.yaml here."""
    import yaml

    try:
        stages = yaml.safe_load(Path(dvc_yaml).read_text()).get("stages", {})
    except (OSError, AttributeError, yaml.YAMLError):
        return None
    target = Path(path).as_posix()
    for name, stage in stages.items():
        for out in (stage or {}).get("outs", []) or []:
            out_path = next(iter(out)) if isinstance(out, dict) else str(out)
            if target == out_path or target.startswith(out_path.rstrip("/") + "/"):
                return name, str(stage.get("cmd", ""))
    return None


def _require(path: str | os.PathLike[str]) -> None:
    if not Path(path).exists():
        raise MissingInputError(Path(path))


def read_table(path: str | os.PathLike[str]) -> pl.DataFrame:
    """Read a Parquet table written by :func:`write_table`; a missing file raises :class:`MissingInputError`."""
    _require(path)
    return pl.read_parquet(path)


def _json_safe(value: Any) -> Any:
    """JSON has no infinity/NaN: +inf (an undetected watermark size) becomes the string "inf", NaN null."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_json(data: Any, path: str | os.PathLike[str]) -> None:
    """Write ``data`` as indented JSON atomically (infinities as "inf", NaN as null)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(_json_safe(data), indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing file raises :class:`MissingInputError`."""
    _require(path)
    return json.loads(Path(path).read_text())


def write_text(text: str, path: str | os.PathLike[str]) -> None:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Let ``writer`` fill a temporary path (e.g. ``matplotlib.savefig``), then move it onto ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
