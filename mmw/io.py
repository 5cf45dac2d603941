"""Atomic table and JSON writes, the pipeline's file layout and table schemas, and the resumable parts store.

A stage that dies half-way must not leave a file that looks complete: every write goes to a temporary file in
the destination directory and is moved into place with ``os.replace`` (atomic on POSIX within one
filesystem), so readers see either the old file or the whole new one. The temporary file's name carries the
writer's process id; one whose writer is gone (killed before it could clean up) is removed by the next write
into that directory.

Every table a stage reads is checked against its one declared schema (:data:`TABLES`) by :func:`read_table`
before any model loads: a missing, unreadable (truncated, corrupt), empty or wrongly shaped file is one
:class:`InputError` line naming the file and the stage that makes it (exit code 2).

Long stages resume through :class:`PartsStore`: the work is cut into units of rows planned over *all* rows
(never over the rows still to do), each finished unit is one atomic part file, and a rerun computes only the
units without a part, with the same composition as an uninterrupted run, so its output is byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
LOW_ENTROPY_INPUTS = Path("data/low_entropy/inputs.parquet")

#: The columns of each table passed between stages (docs/ARCHITECTURE.md), declared once: writers build their
#: frames with these schemas and :func:`read_table` checks them on the way in.
PROMPTS_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "prompt": pl.String, "chat": pl.String}
GENERATIONS_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "prompt": pl.String, "text": pl.String,
                      "tokens": pl.List(pl.Int64), "n_tokens": pl.Int64, "mean_entropy": pl.Float64,
                      "mean_spike_entropy": pl.Float64}
PERTURBED_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "attack": pl.String, "family": pl.String,
                    "in_R": pl.Boolean, "text": pl.String, "ok": pl.Boolean, "error": pl.String}
DETECTION_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "attack": pl.String,
                    "n_tokens": pl.Int64, "pvalue": pl.Float64, "detected": pl.Boolean, "size": pl.Int64,
                    "size_valid": pl.Int64, "size_anytime": pl.Int64, "audit_pvalues": pl.List(pl.Float64)}
RATING_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "attack": pl.String,
                 "rating": pl.Float64, "rating_greedy": pl.Float64, "rating_expected": pl.Float64}
LOW_ENTROPY_SCHEMA = {"source_id": pl.String, "text": pl.String}


@dataclass(frozen=True)
class Table:
    """A table's declared schema; ``rows_required``: an empty table means the stage that made it went wrong
    (false where empty is legitimate: no attacks configured, no low-entropy task selected)."""

    schema: dict[str, Any]
    rows_required: bool = True


TABLES: dict[str, Table] = {
    PROMPTS.as_posix(): Table(PROMPTS_SCHEMA),
    **{path.as_posix(): Table(GENERATIONS_SCHEMA) for path in GENERATIONS.values()},
    PERTURBED.as_posix(): Table(PERTURBED_SCHEMA, rows_required=False),
    **{path.as_posix(): Table(DETECTION_SCHEMA) for path in DETECTIONS.values()},
    **{path.as_posix(): Table(RATING_SCHEMA) for path in RATINGS.values()},
    LOW_ENTROPY_INPUTS.as_posix(): Table(LOW_ENTROPY_SCHEMA, rows_required=False),
}
#: Keys a JSON input must hold to be usable (what its readers index).
JSON_KEYS: dict[str, tuple[str, ...]] = {JUDGE_REPORT.as_posix(): ("mode", "discriminates")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files (``.<name>.<pid>.<random>.tmp``) in ``directory`` whose writing process no
    longer runs: what a writer killed between creating and moving its file leaves. Returns what was removed."""
    removed = []
    for tmp in Path(directory).glob(".*.tmp") if Path(directory).is_dir() else []:
        fields = tmp.name.rsplit(".", 3)
        if len(fields) == 4 and fields[1].isdigit() and not _alive(int(fields[1])):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``, on error delete it.

    Temporaries left in the directory by killed writers are removed first (:func:`remove_stale_temporaries`)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target.parent)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
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


class InputError(SpecError):
    """A stage's input file is missing or unusable: one line naming the file, what is wrong, and the stage that
    makes it (exit code 2, like every other "cannot start" error, before any heavy work)."""

    def __init__(self, path: str | os.PathLike[str], problem: str):
        made_by = producer_of(path)
        if made_by is None:
            super().__init__(str(path), f"{problem} (no stage of dvc.yaml makes it)")
        else:
            stage, cmd = made_by
            verb = "run" if problem == "missing input file" else "rerun"
            super().__init__(str(path), f"{problem}, made by stage `{stage}`: {verb} `dvc repro {stage}` "
                             f"(or `{cmd}`) first")


class MissingInputError(InputError):
    """A stage's input file does not exist."""

    def __init__(self, path: Path):
        super().__init__(path, "missing input file")


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


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("String", "str")


def read_table(path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pl.DataFrame:
    """Read a Parquet table written by :func:`write_table`, checked against its declared schema (:data:`TABLES`).

    ``columns``: the declared columns the reader uses (default: all of them); each must be present with its
    declared type. A missing file raises :class:`MissingInputError`; an unreadable (truncated, corrupt) file, a
    missing or mistyped column, or no rows where the table must have some raise :class:`InputError`.
    """
    _require(path)
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError, pl.exceptions.PanicException) as err:
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise InputError(path, f"unreadable Parquet file (truncated or corrupt: {first})") from None
    declared = TABLES.get(Path(path).as_posix())
    if declared is None:
        return frame
    for name in declared.schema if columns is None else columns:
        want = declared.schema[name]
        if name not in frame.schema:
            raise InputError(path, f"column `{name}` ({_dtype_name(want)}) is missing; the table has "
                             + ", ".join(frame.columns))
        if frame.schema[name] != want and not (frame[name].dtype == pl.Null):
            raise InputError(path, f"column `{name}` has type {_dtype_name(frame.schema[name])}, "
                                   f"expected {_dtype_name(want)}")
    if declared.rows_required and frame.height == 0:
        raise InputError(path, "the table has 0 rows")
    return frame


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
    """Read a JSON file; a missing file raises :class:`MissingInputError`, one that is not JSON (or lacks a key
    its readers need, :data:`JSON_KEYS`) :class:`InputError`."""
    _require(path)
    try:
        data = json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(path, f"not a JSON file (truncated or corrupt: {str(err)[:120]})") from None
    needed = JSON_KEYS.get(Path(path).as_posix(), ())
    missing = [key for key in needed if not isinstance(data, dict) or key not in data]
    if missing:
        raise InputError(path, f"key `{missing[0]}` is missing")
    return data


def write_text(text: str, path: str | os.PathLike[str]) -> None:
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Let ``writer`` fill a temporary path (e.g. ``matplotlib.savefig``), then move it onto ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)


def row_key(*fields: str) -> str:
    """Identity of one stored row: the sha256 of its fields (the run's fingerprint first, then the row's own
    inputs), so rows made under other settings are never taken for this run's."""
    return hashlib.sha256("\x00".join(fields).encode()).hexdigest()


def plan_units(order: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive units of ``size`` row indices taken from ``order``: plan them over every row of the run (not
    over the rows still to do), so a resumed run cuts the same units as an uninterrupted one."""
    return [list(order[start:start + size]) for start in range(0, len(order), size)]


class PartsStore:
    """Finished units of a resumable stage: ``<directory>/<unit id>.parquet``, one atomic file per unit.

    A unit is a list of rows (identified by :func:`row_key`); its id hashes its keys in order, so a unit is done
    only when exactly that unit was stored: a rerun never mixes rows computed in other units (a batch of another
    composition, another batch size, other settings). Opening the store removes what a killed writer left
    (temporary files); a part that cannot be read is recomputed. ``row_key`` is a column of each part.
    ``directory`` None: nothing is stored (a run that need not resume).
    """

    def __init__(self, directory: str | os.PathLike[str] | None, schema: dict[str, Any], label: str = "units"):
        self.directory = Path(directory) if directory is not None else None
        self.schema = {**schema, "row_key": pl.String}
        self.label = label
        #: Units and rows of the last :meth:`run`: computed in it, and read back from parts on disk.
        self.computed_units = self.computed_rows = self.reused_units = self.reused_rows = 0
        if self.directory is not None:
            remove_stale_temporaries(self.directory)

    @staticmethod
    def unit_id(keys: Sequence[str]) -> str:
        return hashlib.sha256("\x00".join(keys).encode()).hexdigest()[:32]

    def _path(self, keys: Sequence[str]) -> Path | None:
        return self.directory / f"{self.unit_id(keys)}.parquet" if self.directory is not None else None

    def _load(self, keys: Sequence[str]) -> pl.DataFrame | None:
        path = self._path(keys)
        if path is None or not path.is_file():
            return None
        try:
            part = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError, pl.exceptions.PanicException):
            return None
        if part.schema != pl.Schema(self.schema) or part["row_key"].to_list() != list(keys):
            return None
        return part

    def run(self, keys: Sequence[str], units: Sequence[Sequence[int]],
            compute: Callable[[list[int]], pl.DataFrame],
            on_unit_done: Callable[[int], None] | None = None) -> pl.DataFrame:
        """The rows of every unit (indices into ``keys``), in ``keys`` order, with a column ``row_key``.

        A unit with a stored part is read back; any other is computed (``compute(unit)`` returns its rows in unit
        order, in this store's schema without ``row_key``), stored atomically, then ``on_unit_done(rows computed
        so far in this call)`` runs. Says on stderr how much was resumed, when anything was."""
        self.computed_units = self.computed_rows = self.reused_units = self.reused_rows = 0
        stored = [self._load([keys[i] for i in unit]) for unit in units]
        self.reused_units = sum(part is not None for part in stored)
        self.reused_rows = sum(part.height for part in stored if part is not None)
        if self.reused_units:
            print(f"resuming from {self.directory}: {self.reused_rows} rows ({self.reused_units} {self.label}) "
                  f"stored, {len(keys) - self.reused_rows} rows ({len(units) - self.reused_units} {self.label}) "
                  "to compute", file=sys.stderr, flush=True)
        frames = []
        for unit, part in zip(units, stored, strict=True):
            if part is None:
                unit_keys = [keys[i] for i in unit]
                rows = compute(list(unit))
                part = rows.with_columns(pl.Series("row_key", unit_keys, dtype=pl.String)).select(
                    [pl.col(name).cast(dtype) for name, dtype in self.schema.items()])
                path = self._path(unit_keys)
                if path is not None:
                    write_table(part, path)
                self.computed_units += 1
                self.computed_rows += part.height
                if on_unit_done is not None:
                    on_unit_done(self.computed_rows)
            frames.append(part)
        finished = pl.concat(frames) if frames else pl.DataFrame(schema=self.schema)
        order = pl.DataFrame({"row_key": list(keys)}, schema={"row_key": pl.String})
        return order.join(finished.unique("row_key", keep="first", maintain_order=True), on="row_key",
                          how="left", maintain_order="left")

    def clear(self) -> None:
        """Remove the store (once the stage's table holds every row)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
