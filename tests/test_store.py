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


class _CharTokenizer:
    def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
        return {"input_ids": [[ord(c) for c in text] for text in texts]}

    def batch_decode(self, tokens: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["".join(map(chr, row)) for row in tokens]


def test_the_vllm_engine_resumes_through_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """VllmGenerator.generate_table without vLLM: its requests replaced by a fake; a run killed after the first
    chunk resumes with the second chunk only and writes the uninterrupted run's bytes."""
    from mmw.engines.vllm_engine import VllmGenerator

    calls: list[list[int]] = []

    def fake_generate_ids(self, prompts, seeds, spec, temperature, max_new_tokens, n=1):  # type: ignore[no-untyped-def]
        if fail_on is not None and len(calls) == fail_on:
            raise KeyboardInterrupt
        calls.append(seeds)
        return [[{"tokens": list(p[:3]), "mean_entropy": 1.0, "mean_spike_entropy": 0.5}] for p in prompts]

    monkeypatch.setattr(VllmGenerator, "generate_ids", fake_generate_ids)
    engine = VllmGenerator.__new__(VllmGenerator)
    engine.tokenizer, engine.name, engine.dtype = _CharTokenizer(), "fake", "float32"
    prompts = pl.DataFrame({"prompt_id": [f"p{i}" for i in range(5)], "task": "story",
                            "prompt": [f"prompt {i}" for i in range(5)], "chat": [f"chat {i}" for i in range(5)]})
    out = tmp_path / "gen" / "watermarked.parquet"
    fail_on: int | None = 1
    with pytest.raises(KeyboardInterrupt):
        engine.generate_table(prompts, out, None, 1.0, 4, 0, "fp", chunk=3)
    assert len(calls) == 1 and not out.exists()
    fail_on = None
    calls.clear()
    resumed = engine.generate_table(prompts, out, None, 1.0, 4, 0, "fp", chunk=3)
    assert [len(c) for c in calls] == [2]  # only the unfinished chunk
    assert not out.with_name(out.name + ".parts").exists()
    engine.generate_table(prompts, tmp_path / "fresh.parquet", None, 1.0, 4, 0, "fp", chunk=3)
    assert out.read_bytes() == (tmp_path / "fresh.parquet").read_bytes()
    assert resumed["text"].to_list() == ["cha"] * 5
