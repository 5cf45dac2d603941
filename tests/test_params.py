"""Params: one validation dialect (pydantic, errors "<key>: <problem>; allowed: ..."), sections a stage declares,
the key outside ``scheme:``, and the launcher that lets DVC's stage commands find ``mmw`` without a venv."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmw.attacks import build_attacks
from mmw.board import check_board
from mmw.errors import SpecError
from mmw.params import DETECT_DEVICES, ModelParams, parse_params
from mmw.watermark.scheme import SchemeSpec
from mmw.validation import Section, allowed, validate

REPO = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash") or "/bin/bash"


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    return yaml.safe_load((REPO / "params.yaml").read_text())


class _Demo(Section):
    count: int = allowed("an integer >= 1", ge=1)
    share: float = allowed("a number in [0, 1]", ge=0.0, le=1.0)


@pytest.mark.parametrize(("data", "message"), [
    ({"count": 0, "share": 0.5}, "demo.count: 0 is out of range; allowed: an integer >= 1"),
    ({"count": True, "share": 0.5}, "demo.count: expected an integer >= 1, got True; allowed: an integer >= 1"),
    ({"count": 2, "share": "0.5"}, "demo.share: expected a number in [0, 1], got '0.5'; allowed: a number in [0, 1]"),
    ({"count": 2, "share": float("nan")}, "demo.share: nan is out of range; allowed: a number in [0, 1]"),
    ({"count": 2}, "demo.share: missing; allowed: a number in [0, 1]"),
    ({"count": 2, "share": 0.5, "shares": 1}, "demo.shares: unknown key; allowed: count, share"),
    ([1, 2], "demo: expected a mapping, got list; allowed: count, share"),
])
def test_pydantic_errors_read_key_problem_allowed(data: Any, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate(_Demo, data, "demo")
    assert str(caught.value) == message


def test_a_typo_reports_the_unknown_key_not_the_missing_one() -> None:
    with pytest.raises(SpecError, match=r"^demo\.cuont: unknown key"):
        validate(_Demo, {"cuont": 2, "share": 0.5}, "demo")


def test_whole_floats_count_as_integers_but_fractions_do_not(board: dict[str, Any]) -> None:
    model = dict(board["model"], batch_size=4.0)
    assert validate(ModelParams, model, "model").batch_size == 4
    with pytest.raises(SpecError, match=r"^model\.batch_size: expected an integer >= 1, got 4\.5"):
        validate(ModelParams, dict(model, batch_size=4.5), "model")


def test_scheme_and_attack_params_use_the_same_dialect() -> None:
    base = dict(sampler="distribution_shift", randomness="window", window=1, score="sum")
    with pytest.raises(SpecError) as scheme_error:
        SchemeSpec.from_params(dict(base, delta="2"))
    assert str(scheme_error.value) == "scheme.delta: expected a number > 0, got '2'; allowed: a number > 0"
    with pytest.raises(SpecError) as attack_error:
        build_attacks([{"name": "swap", "p": "0.2"}])
    assert str(attack_error.value) == ("attacks.specs[0].p: expected a number in [0.0, 1.0], got '0.2'; "
                                       "allowed: a number in [0.0, 1.0]")


def test_duplicate_attacks_are_rejected_where_they_are_built() -> None:
    with pytest.raises(SpecError, match=r"^attacks\.specs\[1\]: duplicate of attacks\.specs\[0\]"):
        build_attacks([{"name": "typo", "p": 0.1}, {"name": "typo", "p": 0.1}])


def test_a_stage_reads_only_the_sections_it_declared(board: dict[str, Any]) -> None:
    params = parse_params(board, ("seed", "model"))
    assert params.seed == board["seed"] and params.model.name == board["model"]["name"]
    with pytest.raises(KeyError, match="rate"):
        _ = params.rate


def test_a_stage_does_not_validate_sections_it_does_not_read(board: dict[str, Any]) -> None:
    broken = copy.deepcopy(board)
    broken["rate"]["mode"] = "median"
    assert parse_params(broken, ("seed", "model")).seed == board["seed"]
    with pytest.raises(SpecError, match=r"^rate\.mode: unknown value 'median'"):
        check_board(broken)  # the key stage checks the whole board first


def test_the_key_is_top_level_and_not_part_of_the_scheme(board: dict[str, Any]) -> None:
    assert isinstance(board["key"], str) and "key" not in board["scheme"]
    full = yaml.safe_load((REPO / "params-full.yaml").read_text())
    assert isinstance(full["key"], str) and "key" not in full["scheme"]
    old_layout = copy.deepcopy(board)
    old_layout["scheme"]["key"] = old_layout.pop("key")
    with pytest.raises(SpecError, match=r"^scheme\.key: the watermark key is the top-level `key:`"):
        check_board(old_layout)


def test_no_stage_copies_the_key_into_dvc_lock_and_scheme_users_take_the_whole_section() -> None:
    """No stage lists the key; a stage that reads the scheme takes the whole section, except the detection stages,
    which list exactly the detection keys (tests/test_deps.py checks which)."""
    from mmw.watermark.scheme import DETECTION_KEYS

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        params = [p for p in stage.get("params", []) if isinstance(p, str)]
        assert not any(p == "key" or p.startswith("key.") for p in params), name
        listed = {p.removeprefix("scheme.") for p in params if p.startswith("scheme.")}
        assert not listed or (name.startswith("detect_") and listed == set(DETECTION_KEYS)), name


def test_detect_devices_agree_with_the_detector() -> None:
    from mmw.watermark.detector import DEVICES, Detector
    from mmw.errors import SpecError
    from mmw.watermark.scheme import SchemeSpec

    assert DEVICES == DETECT_DEVICES
    spec = SchemeSpec.from_params(dict(sampler="exponential", randomness="window", window=1, score="sum"))
    with pytest.raises(SpecError, match=r"^detect\.device: unknown device 'gpu'; allowed: auto, cpu, cuda, reference$"):
        Detector(spec, 1 << 40, 64, device="gpu")


# --- scripts/mmw: the stage commands' launcher --------------------------------------------------------------------


def _plain_path() -> str:
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not Path(p, "mmw").exists())


def test_launcher_runs_the_checkouts_venv_without_an_activated_venv(tmp_path: Path) -> None:
    env = {"PATH": _plain_path(), "HOME": os.environ.get("HOME", "/tmp")}
    completed = subprocess.run([BASH, "-c", "scripts/mmw --help"], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "aggregate" in completed.stdout
    bare = subprocess.run([BASH, "-c", "mmw --help"], cwd=REPO, env=env, capture_output=True, text=True)
    assert bare.returncode == 127  # what dvc.yaml's commands met before the launcher


def test_launcher_without_any_mmw_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy2(REPO / "scripts/mmw", tmp_path / "scripts/mmw")
    completed = subprocess.run([BASH, "-c", "scripts/mmw key"], cwd=tmp_path, env={"PATH": _plain_path()},
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 127
    assert "scripts/setup.sh" in completed.stderr and len(completed.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("key", "value", "message"), [
    ("decode_attention", "cudnn", "engine.decode_attention: unknown value 'cudnn'; allowed: flex, efficient, sdpa"),
    ("graph_decode", "yes", "engine.graph_decode: expected true or false, got 'yes'; allowed: true or false"),
    ("static_decode", 0, "engine.static_decode: expected true or false, got 0; allowed: true or false"),
    ("fuse_layers", "on", "engine.fuse_layers: expected true or false, got 'on'; allowed: true or false"),
    ("compile_mode", "fast", "engine.compile_mode: unknown value 'fast'; allowed: reduce-overhead, default, "
                             "max-autotune, max-autotune-no-cudagraphs"),
    ("compile_jugde", True, "engine.compile_jugde: unknown key; allowed: static_decode, graph_decode, "
                            "decode_attention, compile_step, compile_mode, fuse_layers, compile_judge"),
])
def test_an_invalid_engine_switch_fails_naming_its_key_and_the_allowed_values(board: dict[str, Any], key: str,
                                                                              value: Any, message: str) -> None:
    bad = copy.deepcopy(board)
    bad["engine"][key] = value
    with pytest.raises(SpecError) as caught:
        parse_params(bad, ("engine",))
    assert str(caught.value) == message


def test_the_engine_section_is_optional_and_its_defaults_are_the_committed_boards(board: dict[str, Any]) -> None:
    """Without ``engine:`` every switch is at its default, and both committed boards set exactly the defaults (so a
    board from before the section computes what it computed)."""
    from mmw.params import EngineParams

    assert parse_params({k: v for k, v in board.items() if k != "engine"}, ("engine",)).engine == EngineParams()
    for name in ("params.yaml", "params-full.yaml"):
        committed = yaml.safe_load((REPO / name).read_text())["engine"]
        assert parse_params({"engine": committed}, ("engine",)).engine == EngineParams(), name


def test_no_environment_variable_chooses_a_gpu_path() -> None:
    """The switches that change outputs are params: no MMW_* variable of the old GPU switches is read anywhere."""
    old = ("MMW_DECODE_ATTENTION", "MMW_GRAPH_DECODE", "MMW_STATIC_DECODE", "MMW_COMPILE")
    readers = [str(path.relative_to(REPO)) for folder in ("mmw", "stages") for path in (REPO / folder).rglob("*.py")
               if any(name in path.read_text() for name in old)]
    assert readers == []


def test_the_prompt_pool_is_validated_and_defaults_to_the_papers(board: dict[str, Any]) -> None:
    """``prompts.pool``: paper (the default, and both committed boards': per_task null is the paper's 296 prompts)
    or extended; anything else fails naming the key and the allowed values. A range past the pool fails on the
    whole board (mmw.board, the key stage) naming the task, its count and the remedy."""
    assert parse_params({"prompts": {k: v for k, v in board["prompts"].items() if k != "pool"}},
                        ("prompts",)).prompts.pool == "paper"
    for name in ("params.yaml", "params-full.yaml"):
        assert yaml.safe_load((REPO / name).read_text())["prompts"]["pool"] == "paper", name
    bad = copy.deepcopy(board)
    bad["prompts"]["pool"] = "all"
    with pytest.raises(SpecError) as caught:
        parse_params(bad, ("prompts",))
    assert str(caught.value) == "prompts.pool: unknown value 'all'; allowed: paper, extended"
    past = copy.deepcopy(board)
    past["prompts"].update(per_task=8, offset=90)
    with pytest.raises(SpecError) as caught:
        check_board(past)
    assert str(caught.value) == ("prompts.pool: task story holds 96 prompts in the paper pool; prompts [90, 98) run "
                                 "past them; allowed: prompts.pool: extended (354 prompts of story), or "
                                 "prompts.offset + prompts.per_task <= 96")
    past["prompts"]["pool"] = "extended"
    assert check_board(past).prompts.pool == "extended"


def test_dvc_reads_a_flow_mapping_whose_model_name_holds_a_colon():
    """DVC parses params.yaml with ruamel's safe loader. With ruamel.yaml.clib installed that loader is libyaml
    (YAML 1.1), which rejects a plain scalar with a colon inside a flow mapping, so `dvc repro` failed on such a
    params file ("YAML file structure is corrupted"; bench/RESULTS.md, "What the warm server sets up"): the
    environment must keep DVC's YAML 1.2 parse."""
    from dvc.utils.serialize import parse_yaml

    text = "model: {name: embedded:smollm2-135m, temperature: 0.7}\nscheme: {sampler: plugin, delta: null}\n"
    assert parse_yaml(text, "params.yaml") == {"model": {"name": "embedded:smollm2-135m", "temperature": 0.7},
                                               "scheme": {"sampler": "plugin", "delta": None}}
