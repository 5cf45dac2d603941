"""The perturb stage resumes like generation: finished chunks survive an interrupt, a rerun attacks only the rest,
and stored rows are reused only under the same attack parameters, seed and input text (never mixed)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml

from mmw.attacks.base import Attack
from mmw.io import GENERATIONS, PERTURBED, read_table, write_table
from mmw.stages import perturb

ROOT = Path(__file__).resolve().parents[1]
N_TEXTS = 20  # 3 chunks of CHUNK = 8 per attack
SPECS = [{"name": "swap", "p": 0.3}, {"name": "lowercase"}]


def setup_dir(directory: Path, specs: list[dict], seed: int = 0) -> Path:
    board = yaml.safe_load((ROOT / "params.yaml").read_text())
    board["seed"] = seed
    board["attacks"] = {"fraction": 1.0, "specs": specs}
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(board))
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    texts = [f"Text number {i} has Several Words in it and then some more words {i}." for i in range(N_TEXTS)]
    write_table(pl.DataFrame({"prompt_id": [f"story-{i:03d}" for i in range(N_TEXTS)], "task": "story",
                              "prompt": "p", "text": texts}), GENERATIONS["watermarked"])
    return tmp_path


@pytest.fixture
def attacked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(attack name, input text) of every text an attack actually processed."""
    calls: list[tuple[str, str]] = []
    real = Attack.apply_batch

    def counting(self, texts, seeds):
        calls.extend((self.name, t) for t in texts)
        return real(self, texts, seeds)

    monkeypatch.setattr(Attack, "apply_batch", counting)
    return calls


def interrupt_after(rows: int):
    def hook(stored: int) -> None:
        if stored >= rows:
            raise KeyboardInterrupt(f"simulated interruption after {stored} rows")
    return hook


def test_interrupted_perturb_resumes_without_redoing_finished_rows(workdir, attacked, tmp_path_factory,
                                                                   monkeypatch):
    params = setup_dir(workdir, SPECS)
    with pytest.raises(KeyboardInterrupt):
        perturb.run(params, on_chunk_done=interrupt_after(perturb.CHUNK + 1))  # two chunks stored
    assert not PERTURBED.exists()
    assert len(list(perturb.parts_dir().glob("*.parquet"))) == 2
    first = list(attacked)
    assert len(first) == 2 * perturb.CHUNK
    attacked.clear()
    perturb.run(params)
    assert len(attacked) == 2 * N_TEXTS - len(first) and not set(first) & set(attacked)  # only the rest ran
    assert not perturb.parts_dir().exists()
    resumed = read_table(PERTURBED)
    assert resumed.columns == list(perturb.PERTURBED_SCHEMA) and resumed.height == 2 * N_TEXTS

    fresh = tmp_path_factory.mktemp("fresh")
    monkeypatch.chdir(fresh)
    write_table(read_table(workdir / GENERATIONS["watermarked"]), GENERATIONS["watermarked"])
    perturb.run(setup_dir(fresh, SPECS))
    assert read_table(PERTURBED).equals(resumed)  # same rows, same order as an uninterrupted run


@pytest.mark.parametrize("change", ["param", "seed", "text"])
def test_stored_rows_of_other_params_seed_or_text_are_never_reused(workdir, attacked, change):
    params = setup_dir(workdir, SPECS)
    with pytest.raises(KeyboardInterrupt):
        perturb.run(params, on_chunk_done=interrupt_after(1))
    assert len(list(perturb.parts_dir().glob("*.parquet"))) == 1
    attacked.clear()
    if change == "param":
        setup_dir(workdir, [{"name": "swap", "p": 0.6}, {"name": "lowercase"}])
    elif change == "seed":
        setup_dir(workdir, SPECS, seed=1)
    else:
        table = pl.read_parquet(GENERATIONS["watermarked"])
        write_table(table.with_columns(pl.col("text") + " Edited."), GENERATIONS["watermarked"])
    perturb.run(params)
    assert len(attacked) == 2 * N_TEXTS  # nothing stored under the old settings was reused
    swap = read_table(PERTURBED).filter(pl.col("family") == "swap")
    assert swap.height == N_TEXTS and swap["ok"].all()


def test_row_key_covers_attack_params_seed_prompt_and_text():
    from mmw.attacks import build_attack

    swap, other = build_attack({"name": "swap", "p": 0.3}), build_attack({"name": "swap", "p": 0.31})
    base = perturb.row_key(perturb.attack_fingerprint(swap, 0), "story-000", "a text")
    assert base != perturb.row_key(perturb.attack_fingerprint(other, 0), "story-000", "a text")
    assert base != perturb.row_key(perturb.attack_fingerprint(swap, 1), "story-000", "a text")
    assert base != perturb.row_key(perturb.attack_fingerprint(swap, 0), "story-001", "a text")
    assert base != perturb.row_key(perturb.attack_fingerprint(swap, 0), "story-000", "a text.")
    assert base == perturb.row_key(perturb.attack_fingerprint(build_attack({"name": "swap", "p": 0.3}), 0),
                                   "story-000", "a text")
