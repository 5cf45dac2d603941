"""The resumable parts store (mmw.io.PartsStore): units planned over every row, one atomic part per unit, a
resumed run byte-identical to an uninterrupted one, no finished unit computed twice, nothing of another run's
units or of a killed writer reused."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from mmw.io import PartsStore, plan_units, row_key, write_table

SCHEMA = {"row": pl.Int64, "batch_mates": pl.String}
N = 7


def keys(run: str = "fp") -> list[str]:
    return [row_key(run, str(i)) for i in range(N)]


class Compute:
    """A unit's rows depend on the whole unit (like a left-padded batch): ``batch_mates`` lists its members."""

    def __init__(self) -> None:
        self.units: list[list[int]] = []

    def __call__(self, unit: list[int]) -> pl.DataFrame:
        self.units.append(unit)
        return pl.DataFrame({"row": unit, "batch_mates": [",".join(map(str, unit))] * len(unit)}, schema=SCHEMA)


def stop_after(units: int):
    def hook(rows_done: int) -> None:
        if rows_done >= units * 3:
            raise KeyboardInterrupt
    return hook


def test_a_resumed_run_computes_only_unfinished_units_and_writes_the_same_bytes(tmp_path: Path) -> None:
    units = plan_units(sorted(range(N), key=lambda i: -i), 3)  # e.g. longest first: [[6,5,4],[3,2,1],[0]]
    compute = Compute()
    with pytest.raises(KeyboardInterrupt):
        PartsStore(tmp_path / "parts", SCHEMA).run(keys(), units, compute, stop_after(1))
    assert compute.units == [[6, 5, 4]] and len(list((tmp_path / "parts").glob("*.parquet"))) == 1

    compute.units.clear()
    store = PartsStore(tmp_path / "parts", SCHEMA)
    resumed = store.run(keys(), units, compute)
    assert compute.units == [[3, 2, 1], [0]]  # the finished unit is read back, never computed again
    assert (store.reused_units, store.reused_rows, store.computed_units, store.computed_rows) == (1, 3, 2, 4)
    assert resumed["row"].to_list() == list(range(N))  # in keys order

    fresh = PartsStore(None, SCHEMA).run(keys(), units, Compute())
    write_table(resumed, tmp_path / "resumed.parquet")
    write_table(fresh, tmp_path / "fresh.parquet")
    assert (tmp_path / "resumed.parquet").read_bytes() == (tmp_path / "fresh.parquet").read_bytes()


def test_units_of_another_composition_or_run_are_not_reused(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    PartsStore(parts, SCHEMA).run(keys(), plan_units(range(N), 2), Compute())  # batch size 2
    compute = Compute()
    table = PartsStore(parts, SCHEMA).run(keys(), plan_units(range(N), 3), compute)  # batch size 3
    # [6] is the same unit under both sizes: only it is reused
    assert compute.units == [[0, 1, 2], [3, 4, 5]] and table["batch_mates"].to_list()[:4] == ["0,1,2"] * 3 + ["3,4,5"]
    compute.units.clear()
    PartsStore(parts, SCHEMA).run(keys("other settings"), plan_units(range(N), 3), compute)
    assert len(compute.units) == 3


def test_an_unreadable_part_is_computed_again(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    PartsStore(parts, SCHEMA).run(keys(), plan_units(range(N), 3), Compute())
    damaged = sorted(parts.glob("*.parquet"))[0]
    damaged.write_bytes(damaged.read_bytes()[:20])
    compute = Compute()
    table = PartsStore(parts, SCHEMA).run(keys(), plan_units(range(N), 3), compute)
    assert len(compute.units) == 1 and table["row"].to_list() == list(range(N))


def test_opening_the_store_removes_a_dead_writers_temporary_file(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)  # a pid that no longer runs
    dead = parts / f".abc.parquet.{child}.x1y2.tmp"
    live = parts / f".def.parquet.{os.getpid()}.x1y2.tmp"
    dead.write_bytes(b"half a part")
    live.write_bytes(b"being written")
    PartsStore(parts, SCHEMA)
    assert not dead.exists() and live.exists()
