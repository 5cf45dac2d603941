"""Damaged input tables, through the command line: every stage checks each table it reads against the table's
declared schema (``mmw.io.TABLES``) before any model loads, and a missing, truncated, corrupt, non-Parquet, empty
(where rows are required) table or one with a missing or mistyped column ends the stage with exit code 2 and one
``error: <file>: <problem>, made by stage `<producer>`...`` line: never a traceback, never exit 0 with an empty
result. Also: what a killed writer leaves (temporary files) is removed by the next write.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from mmw.cli import app
from mmw.io import (
    DETECTIONS,
    GENERATIONS,
    JUDGE_REPORT,
    LOW_ENTROPY_INPUTS,
    PERTURBED,
    PROMPTS,
    RATINGS,
    TABLES,
    atomic_path,
    producer_of,
    remove_stale_temporaries,
    write_json,
    write_table,
)

ROOT = Path(__file__).resolve().parents[1]
GOOD_KEY = "tables-test-key-0123456789"

#: Every stage command with an input table, and the tables (and JSON files) it reads.
STAGE_INPUTS: list[tuple[list[str], list[Path]]] = [
    (["prompts"], [LOW_ENTROPY_INPUTS]),  # with a low-entropy task selected (see the fixture)
    (["generate", "baseline"], [PROMPTS]),
    (["generate", "watermarked"], [PROMPTS]),
    (["perturb"], [GENERATIONS["watermarked"]]),
    (["detect", "baseline"], [GENERATIONS["baseline"]]),
    (["detect", "watermarked"], [GENERATIONS["watermarked"], PERTURBED]),
    (["rate", "baseline"], [GENERATIONS["baseline"]]),
    (["rate", "watermarked"], [GENERATIONS["watermarked"], PERTURBED, JUDGE_REPORT]),
    (["aggregate"], [DETECTIONS["baseline"], DETECTIONS["watermarked"], RATINGS["baseline"], RATINGS["watermarked"],
                     PERTURBED, JUDGE_REPORT]),
    (["quality"], [GENERATIONS["baseline"], GENERATIONS["watermarked"]]),
]

_VALUES: dict[str, Any] = {"String": "x", "Int64": 3, "Float64": 0.5, "Boolean": True,
                           "List(Int64)": [1, 2, 3], "List(Float64)": [0.5]}


def valid_table(path: Path) -> pl.DataFrame:
    """One well-formed row of the table declared for ``path``."""
    schema = TABLES[path.as_posix()].schema
    return pl.DataFrame({name: [_VALUES[str(dtype)]] for name, dtype in schema.items()}, schema=schema)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:
    """Zero the data pages, keep the header and footer: the schema still reads, the values do not."""
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[4: len(data) - 8 - footer] = bytes(len(data) - 12 - footer)
    path.write_bytes(bytes(data))


def _first(path: Path) -> str:
    return next(iter(TABLES[path.as_posix()].schema))


#: Table damages: name -> (applies to the table at this path?, damage the file in place).
DAMAGES: dict[str, tuple[Callable[[Path], bool], Callable[[Path], None]]] = {
    "truncated": (lambda p: True, _truncate),
    "corrupt": (lambda p: True, _corrupt),
    "not-parquet": (lambda p: True, lambda p: p.write_text("prompt_id,task\na,b\n")),
    "empty-file": (lambda p: True, lambda p: p.write_bytes(b"")),
    "missing-column": (lambda p: True, lambda p: write_table(pl.read_parquet(p).drop(_first(p)), p)),
    "mistyped-column": (lambda p: True, lambda p: write_table(
        pl.read_parquet(p).with_columns(pl.lit(7, pl.Int32).alias(_first(p))), p)),
    "zero-rows": (lambda p: TABLES[p.as_posix()].rows_required, lambda p: write_table(pl.read_parquet(p).clear(), p)),
}
JSON_DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "missing-key": lambda p: p.write_text(json.dumps({"requested_mode": "auto"})),
}


def _stage_id(command: list[str]) -> str:
    return "-".join(command)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """params.yaml (with a key; a low-entropy task among the prompts' tasks), dvc.yaml, and a valid copy of every
    input table; loading any model fails the test (the checks must come first)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MMW_KEY", raising=False)
    monkeypatch.setenv("MMW_JUDGE_CACHE", str(tmp_path / "judge-cache"))
    board = yaml.safe_load((ROOT / "params.yaml").read_text())
    board["key"] = GOOD_KEY
    board["prompts"]["tasks"] = [*board["prompts"]["tasks"], "paraphrase"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(board))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    for name in TABLES:
        write_table(valid_table(Path(name)), Path(name))
    write_json({"requested_mode": "auto", "mode": "expected", "discriminates": True, "best_mode": "expected",
                "modes": {}}, JUDGE_REPORT)

    import mmw.engines.models
    import mmw.stages.generate

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was loaded before the input tables were checked")

    monkeypatch.setattr(mmw.engines.models, "load_model", no_model)
    monkeypatch.setattr(mmw.engines.models, "load_tokenizer", no_model)  # the detect/prompts stages' only load
    monkeypatch.setattr(mmw.stages.generate, "load_model", no_model)
    return tmp_path


def _expect_one_line(command: list[str], path: Path) -> str:
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    line = lines[0]
    stage, _ = producer_of(path)
    assert line.startswith(f"error: {path.as_posix()}: ") and f"made by stage `{stage}`" in line, line
    assert f"dvc repro {stage}" in line, line
    return line


CASES = [(command, path, damage) for command, paths in STAGE_INPUTS for path in paths
         for damage in (JSON_DAMAGES if path.suffix == ".json" else DAMAGES)
         if path.suffix == ".json" or DAMAGES[damage][0](path)]


@pytest.mark.parametrize("command,path,damage", CASES,
                         ids=[f"{_stage_id(c)}:{p.stem}-{p.parent.name}:{d}" for c, p, d in CASES])
def test_a_damaged_input_table_exits_2_naming_file_and_producer(workdir: Path, command: list[str], path: Path,
                                                                damage: str) -> None:
    if path.suffix == ".json":
        JSON_DAMAGES[damage](path)
    else:
        DAMAGES[damage][1](path)
    line = _expect_one_line(command, path)
    if damage == "zero-rows":
        assert "0 rows" in line
    if damage in ("missing-column", "mistyped-column"):
        assert f"column `{_first(path)}`" in line


@pytest.mark.parametrize("command,paths", STAGE_INPUTS, ids=[_stage_id(c) for c, _ in STAGE_INPUTS])
def test_a_missing_input_table_exits_2(workdir: Path, command: list[str], paths: list[Path]) -> None:
    for path in paths:
        saved = path.read_bytes()
        path.unlink()
        assert "missing input file" in _expect_one_line(command, path)
        path.write_bytes(saved)


def test_an_empty_perturbed_table_is_valid_input(workdir: Path) -> None:
    """No attacks configured is legitimate: 0 rows of perturbed texts pass the check (the stage goes on to its
    model, which this fixture forbids)."""
    write_table(valid_table(PERTURBED).clear(), PERTURBED)
    result = CliRunner().invoke(app, ["detect", "watermarked"])
    assert isinstance(result.exception, AssertionError) and "model was loaded" in str(result.exception)


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """A writer SIGKILLed between writing its temporary file and moving it into place leaves the temporary
    behind; the next write into that directory removes it (a live writer's temporary is left alone)."""
    target = tmp_path / "data" / "table.parquet"
    code = ("import os, signal, polars as pl; from mmw.io import atomic_path\n"
            f"with atomic_path({str(target)!r}) as tmp:\n"
            "    pl.DataFrame({'a': [1]}).write_parquet(tmp)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    assert done.returncode == -9
    left = list(target.parent.glob(".*.tmp"))
    assert len(left) == 1 and not target.exists()
    with atomic_path(target.parent / "live.parquet") as live:  # this process's own temporary: alive
        live.write_bytes(b"x")
        assert remove_stale_temporaries(target.parent) == []
    write_table(pl.DataFrame({"a": [2]}), target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["live.parquet", "table.parquet"]
    assert os.path.getsize(target) > 0
