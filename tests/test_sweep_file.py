"""A sweep definition file is validated by the params' mechanism (mmw.validation): every mistake is one SpecError
naming the file, the key's path inside it and the allowed values, before any config is expanded or queued; the
selection constraints and the adaptive section answer the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pipeline_repo import REPO
from typer.testing import CliRunner

from mmw.cli import app
from mmw.errors import SpecError
from mmw.selection import Constraints
from mmw.sweep.definition import QUALITY_LOSSES, SweepFile, expand, read_definition

BOARD = yaml.safe_load((REPO / "params.yaml").read_text())
GRID = {"name": "g0", "scheme.sampler": "distribution_shift", "scheme.score": "sum", "scheme.randomness": "window",
        "scheme.window": 1, "scheme.delta": 2.5}


def _write(tmp_path: Path, raw: Any) -> Path:
    (tmp_path / "sweeps").mkdir(exist_ok=True)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(BOARD))
    (tmp_path / "sweeps" / "bad.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path


@pytest.mark.parametrize(("raw", "key", "allowed"), [
    ([GRID], "", "description, base, temperatures, grids, reevaluate, confirm, adaptive"),
    ({"grids": [GRID], "grid": []}, "grid", "description, base, temperatures, grids, reevaluate, confirm, adaptive"),
    ({"grids": []}, "grids", "a non-empty list of grid entries"),
    ({"grids": [GRID, "ds"]}, "grids[1]", "mappings of dotted params"),
    ({"grids": [GRID], "description": 3}, "description", "one line of text"),
    ({"grids": [GRID], "reevaluate": {"k": 2, "seeds": 3}}, "reevaluate.seeds", "k, first_seed"),
    ({"grids": [GRID], "reevaluate": {"k": True}}, "reevaluate.k", "an integer >= 1"),
    ({"grids": [GRID], "reevaluate": {"first_seed": -1}}, "reevaluate.first_seed", "an integer >= 0"),
    ({"grids": [GRID], "confirm": 6}, "confirm", "prompts: an integer >= 1 (per task)"),
    ({"grids": [GRID], "confirm": {"prompts": "6"}}, "confirm.prompts", "an integer >= 1"),
    ({"grids": [GRID], "confirm": {"prompts": 6, "offset": -2}}, "confirm.offset", "an integer >= 0"),
    ({"grids": [GRID], "confirm": {"prompts": 6, "level": 0.5}}, "confirm.level", "(0, 0.5)"),
    ({"grids": [GRID], "confirm": {"prompts": 6, "max_tries": 0}}, "confirm.max_tries", "an integer >= 1"),
    ({"grids": [GRID], "confirm": {"prompts": 6, "quality_losses": [0.1, 0.1]}}, "confirm.quality_losses",
     "a non-empty subset of [0.01, 0.1]"),
    ({"grids": [GRID], "confirm": {"prompts": 6, "quality_losses": [0.2]}}, "confirm.quality_losses[0]",
     "a non-empty subset of [0.01, 0.1]"),
    ({"grids": [{**GRID, "scheme.window": []}]}, "grids[0] (g0): scheme.window", None),
    ({"grids": [{**GRID, "model.temperature": 0.7}]}, "grids[0] (g0): model.temperature", None),
    # The race's schedule (8 tuning prompts per task, 3 tasks, confirmation max_tries 2).
    *[({"grids": [GRID], "confirm": {"prompts": 6}, "adaptive": adaptive}, key, allowed) for adaptive, key, allowed in [
        ({"shards": [2, 8], "level": 0}, "adaptive.level", "(0, 1)"),
        ({"shards": [2, 8], "level": 1.5}, "adaptive.level", "(0, 1)"),
        ({"shards": [8, 4]}, "adaptive.shards", "increasing"),
        ({"shards": [2, 12]}, "adaptive.shards", "<= 8"),  # would reach the confirmation prompts
        ({"shards": [1, 8]}, "adaptive.shards", "at least 2 per task"),  # 3 prompts: too few for a bound
        ({"shards": [8]}, "adaptive.shards", "at least two"),  # one round is the uniform grid
        ({"shards": [2, 8], "budget_s": 10}, "adaptive.budget_s", "at least"),  # less than round 1
        ({"shards": [2, 8], "budget_s": -5}, "adaptive.budget_s", "> 0"),
        ({"shards": [2, 8], "keep": 3}, "adaptive.keep", "confirm.max_tries"),
        ({"shards": [2, 8], "rounds": 3}, "adaptive.rounds", "shards, level, budget_s, keep"),
        ([2, 8], "adaptive", None),
    ]],
    ({"grids": [GRID], "adaptive": {"shards": [2, 8]}}, "adaptive", "confirm"),  # no confirmation stage
])
def test_a_bad_sweep_file_names_the_key_in_the_file_and_the_allowed_values(tmp_path: Path, raw: Any, key: str,
                                                                          allowed: str | None) -> None:
    repo = _write(tmp_path, raw)
    path = repo / "sweeps" / "bad.yaml"
    with pytest.raises(SpecError) as caught:
        expand("bad", BOARD, repo / "sweeps")
    assert caught.value.key == (f"{path}: {key}" if key else str(path)), str(caught.value)
    assert "\n" not in str(caught.value)
    if allowed is not None:
        assert allowed in (caught.value.allowed or ""), str(caught.value)
    result = CliRunner().invoke(app, ["sweep", "run", "bad", "--repo", str(repo)])
    assert result.exit_code == 2 and f"error: {path}" in result.output
    assert not (repo / ".dvc").exists()  # refused before anything ran


def test_without_a_board_only_the_shape_is_checked(tmp_path: Path) -> None:
    repo = _write(tmp_path, {"grids": [{**GRID, "scheme.windoww": 2}], "reevaluate": None, "base": None})
    path, definition = read_definition("bad", None, repo / "sweeps")
    assert definition.base == {} and definition.reevaluate.k == 5 and definition.reevaluate.seeds[0] == 1000
    assert definition.confirm is None and definition.confirmation(BOARD) is None
    with pytest.raises(SpecError, match=r"grids\[0\] \(g0\): scheme.windoww: not a param of params.yaml"):
        read_definition("bad", BOARD, repo / "sweeps")


def test_every_field_says_what_it_accepts_and_the_losses_are_the_papers() -> None:
    assert all(field.json_schema_extra for field in SweepFile.model_fields.values())
    assert QUALITY_LOSSES == (0.01, 0.1)


def test_the_committed_sweeps_read_and_confirm_as_declared() -> None:
    for name in ("paper", "paper-race", "small", "smoke", "small-race"):
        _, definition = read_definition(name, BOARD, REPO / "sweeps")
        assert definition.grids and definition.reevaluate.k >= 1
    _, confirmed = read_definition("small-confirmed", BOARD, REPO / "sweeps")
    confirmation = confirmed.confirmation(BOARD)
    tuning_offset, tuning = confirmed.tuning(BOARD)
    assert confirmation is not None and confirmation.quality_losses and confirmation.offset >= tuning_offset + tuning


def test_a_definition_extends_another_without_copying_its_grid(tmp_path: Path) -> None:
    """paper-race is the paper grid (same 1,152 scheme settings, the paper's base merged under its own) with a
    tuning split, confirmation and a race; an unknown parent and a cycle are refused naming `extends`."""
    paper = expand("paper", BOARD, REPO / "sweeps", validate=False)
    raced = expand("paper-race", BOARD, REPO / "sweeps", validate=False)
    assert len(raced.configs) == len(paper.configs) == 1152

    def settings(sweep: Any) -> list[dict]:
        return [{k: v for k, v in c.overrides.items() if k.startswith(("scheme.", "model."))} for c in sweep.configs]
    assert settings(raced) == settings(paper)
    _, definition = read_definition("paper-race", BOARD, REPO / "sweeps")
    assert definition.base["model.max_new_tokens"] == 1024 and definition.base["prompts.per_task"] == 64
    assert definition.adaptive.shards == [4, 16, 64] and definition.pack == 0
    confirmation = definition.confirmation(BOARD)
    assert confirmation is not None and (confirmation.offset, confirmation.prompts) == (64, 32)
    assert definition.tuning(BOARD)[1] == 64

    (tmp_path / "a.yaml").write_text("extends: b\ngrids: [{scheme.sampler: binary}]\n")
    (tmp_path / "b.yaml").write_text("extends: a\ngrids: [{scheme.sampler: binary}]\n")
    (tmp_path / "c.yaml").write_text("extends: nonesuch\ngrids: [{scheme.sampler: binary}]\n")
    with pytest.raises(SpecError) as err:
        read_definition("a", None, tmp_path)
    assert err.value.key.endswith("extends") and "a -> b -> a" in err.value.problem
    with pytest.raises(SpecError) as err:
        read_definition("c", None, tmp_path)
    assert err.value.key == f"{tmp_path / 'c.yaml'}: extends" and "nonesuch" in err.value.problem


@pytest.mark.parametrize(("kwargs", "option"), [
    ({"max_quality_loss": True}, "--max-quality-loss"),
    ({"min_tamper_resistance": "0.2"}, "--min-tamper-resistance"),
    ({"max_fpr": float("inf")}, "--max-fpr"),
])
def test_constraints_refuse_what_is_not_a_number_naming_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(SpecError) as caught:
        Constraints(**kwargs)
    assert caught.value.key == option and "allowed:" in str(caught.value)


def test_constraints_keep_their_values_and_compare_by_value() -> None:
    c = Constraints(0.1, 0, None)
    assert (c.max_quality_loss, c.min_tamper_resistance, c.max_fpr) == (0.1, 0.0, None)
    assert c == Constraints(max_quality_loss=0.1, min_tamper_resistance=0.0) and hash(c) == hash(Constraints(0.1, 0.0))
    assert c.min_relative_quality == pytest.approx(0.9)
