"""Pipeline plumbing: params validation (one-line errors naming the key), the CLI's failure behaviour, atomic
writes, stable seeds and the attacked subset."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from mmw.cli import app
from mmw.errors import SpecError
from mmw.io import atomic_path, read_json, write_json, write_table
from mmw.board import check_board, load_board
from mmw.seeds import derive_seed
from mmw.stages.perturb import attacked_subset

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    """The repository's default params, as parsed YAML."""
    return yaml.safe_load((REPO / "params.yaml").read_text())


def _with(board: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(board)
    *parents, last = dotted.split(".")
    node = changed
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return changed


def test_default_params_are_valid(board: dict[str, Any]) -> None:
    params = check_board(board)
    assert params.scheme.sampler == "distribution_shift"
    assert 0 < params.scheme.alpha < 1
    assert params.attacks.specs


def test_full_scale_params_are_valid_and_match_the_paper() -> None:
    params = load_board(REPO / "params-full.yaml")
    assert params.prompts.per_task is None  # every prompt: 100 + 96 + 100 = 296
    assert params.model.max_new_tokens == 1024
    assert params.attacks.fraction == pytest.approx(1 / 3)


@pytest.mark.parametrize(("dotted", "value", "key", "allowed"), [
    ("prompts.tasks", ["book_report", "poems"], "prompts.tasks[1]", "fake_news"),
    ("model.name", "/nonexistent/model/dir", "model.name", "local HF model folder"),
    ("model.name", "./missing.gguf", "model.name", "local .gguf"),
    ("model.name", "embedded:llama-9000", "model.name", "embedded:smollm2-135m"),
    ("rate.judge", "/nonexistent/judge", "rate.judge", "local HF model folder"),
    ("attacks.specs.0.name", "swapp", "attacks.specs[0].name", "synonym"),
    ("attacks.specs.0.p", 1.5, "attacks.specs[0].p", "[0.0, 1.0]"),
    ("scheme.alpha", 0.0, "scheme.alpha", "(0, 1)"),
    ("scheme.alpha", 1.2, "scheme.alpha", "(0, 1)"),
    ("scheme.sampler", "green_red", "scheme.sampler", "distribution_shift"),
    ("scheme.score", "align", "scheme.score", "sum"),  # align needs fixed randomness: rejected by the core
    ("attacks.fraction", 1.5, "attacks.fraction", "[0, 1]"),
    ("model.batch_size", 0, "model.batch_size", "integer >= 1"),
    ("model.temperature", -1, "model.temperature", "[0, 100]"),
    ("model.device", "tpu", "model.device", "cuda"),
    ("detect.device", "gpu", "detect.device", "cuda"),
    ("rate.mode", "median", "rate.mode", "expected"),
    ("prompts.per_task", 0, "prompts.per_task", "integer >= 1"),
    ("seed", -3, "seed", "integer >= 0"),
])
def test_invalid_value_names_key_and_allowed_values(board: dict[str, Any], dotted: str, value: Any, key: str,
                                                    allowed: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_board(_with(board, dotted, value))
    message = str(caught.value)
    assert message.startswith(f"{key}: "), message
    assert "allowed:" in message and allowed in message.split("allowed:", 1)[1], message
    assert "\n" not in message


def test_unknown_and_missing_keys(board: dict[str, Any]) -> None:
    typo = copy.deepcopy(board)
    typo["model"]["max_new_token"] = typo["model"].pop("max_new_tokens")
    with pytest.raises(SpecError, match=r"^model\.max_new_token: unknown key; allowed: .*max_new_tokens"):
        check_board(typo)
    extra = {**board, "attack": {}}
    with pytest.raises(SpecError, match=r"^attack: unknown top-level key; allowed: .*attacks"):
        check_board(extra)
    missing = {k: v for k, v in board.items() if k != "rate"}
    with pytest.raises(SpecError, match=r"^rate: missing section"):
        check_board(missing)


def test_duplicate_attacks_rejected(board: dict[str, Any]) -> None:
    doubled = copy.deepcopy(board)
    doubled["attacks"]["specs"] = [{"name": "swap", "p": 0.1}, {"name": "lowercase"}, {"name": "swap", "p": 0.1}]
    with pytest.raises(SpecError, match=r"^attacks\.specs\[2\]: duplicate of attacks\.specs\[0\]"):
        check_board(doubled)


# --- the CLI on bad params: one line, non-zero exit, nothing written ---------------------------------------------


def _write_params(directory: Path, board: dict[str, Any]) -> Path:
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(board))
    return path


@pytest.mark.parametrize(("command", "dotted", "value", "key"), [
    (["prompts"], "prompts.tasks", ["book_report", "haiku"], "prompts.tasks[1]"),
    (["generate", "baseline"], "model.name", "/nonexistent/model", "model.name"),
    (["perturb"], "attacks.specs.1.name", "lowercse", "attacks.specs[1].name"),
    (["detect", "watermarked"], "scheme.alpha", 1.0, "scheme.alpha"),
    (["generate", "watermarked"], "scheme.randomness", "fixed", "scheme.window"),
    (["aggregate"], "scheme.delta", -1.0, "scheme.delta"),
])
def test_cli_rejects_bad_params_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                board: dict[str, Any], command: list[str], dotted: str,
                                                value: Any, key: str) -> None:
    monkeypatch.chdir(tmp_path)
    _write_params(tmp_path, _with(board, dotted, value))
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}: "), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no output, no timing record


def test_cli_unknown_which_lists_choices() -> None:
    result = CliRunner().invoke(app, ["generate", "watermark"])
    assert result.exit_code != 0
    assert "baseline" in result.output and "watermarked" in result.output


def test_python_dash_m_entry_point(tmp_path: Path, board: dict[str, Any]) -> None:
    _write_params(tmp_path, _with(board, "prompts.tasks", ["sonnets"]))
    completed = subprocess.run([sys.executable, "-m", "mmw", "prompts"], cwd=tmp_path, capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith("error: prompts.tasks[0]: unknown value 'sonnets'")


# --- io, seeds, attacked subset --------------------------------------------------------------------------------


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "table.parquet"
    write_table(pl.DataFrame({"a": [1, 2]}), target)
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half a parquet file")
        raise RuntimeError("the stage died here")
    # The old complete file is still there and no temporary file is left behind.
    assert pl.read_parquet(target)["a"].to_list() == [1, 2]
    assert [p.name for p in target.parent.iterdir()] == ["table.parquet"]


def test_json_writes_infinity_as_string(tmp_path: Path) -> None:
    write_json({"size": float("inf"), "missing": float("nan"), "nested": [1.5, float("inf")]}, tmp_path / "m.json")
    assert read_json(tmp_path / "m.json") == {"size": "inf", "missing": None, "nested": [1.5, "inf"]}


def test_derive_seed_is_stable_across_processes_and_separates_units() -> None:
    here = derive_seed(0, "attack", "story-001", "swap_p0.1")
    code = "from mmw.seeds import derive_seed; print(derive_seed(0, 'attack', 'story-001', 'swap_p0.1'))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}  # Python's own hash() would change with this
    there = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                               check=True).stdout)
    assert here == there
    seeds = {derive_seed(s, "attack", p, a) for s in (0, 1) for p in ("story-001", "story-002")
             for a in ("swap_p0.1", "typo_p0.05")}
    assert len(seeds) == 8
    assert all(0 <= s < 2**63 for s in seeds)
    # Joining parts must not be ambiguous: ("ab", "c") and ("a", "bc") are different units.
    assert derive_seed(0, "ab", "c") != derive_seed(0, "a", "bc")


def test_attacked_subset_takes_the_first_share_of_each_task() -> None:
    generations = pl.DataFrame({
        "prompt_id": [f"book-{i}" for i in range(100)] + [f"story-{i}" for i in range(96)] + ["news-0", "news-1"],
        "task": ["book"] * 100 + ["story"] * 96 + ["news"] * 2,
    })
    subset = attacked_subset(generations, 1 / 3)
    counts = dict(subset.group_by("task").len().iter_rows())
    assert counts == {"book": 34, "story": 32, "news": 1}
    assert subset.filter(pl.col("task") == "book")["prompt_id"].to_list() == [f"book-{i}" for i in range(34)]
    assert attacked_subset(generations, 0.0).height == 0
    assert attacked_subset(generations, 1.0).height == generations.height


def test_install_argos_rejects_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["install-argos", str(tmp_path / "missing.argosmodel")])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: ") and "no such file" in result.stderr


# --- aggregate on hand-made tables: metrics, summary, plots -------------------------------------------------------


def _hand_made_run(directory: Path) -> None:
    """Tables of a run with 2 tasks x 3 prompts, the first prompt of each task attacked by two attacks:
    'wipe' removes every watermark at 80% of the quality, 'keep' changes nothing."""
    tasks = {"book_report": ["book_report-000", "book_report-001", "book_report-002"],
             "story": ["story-000", "story-001", "story-002"]}
    detections, ratings, perturbed = [], [], []
    for task, ids in tasks.items():
        for i, prompt_id in enumerate(ids):
            # One baseline false positive in book reports; watermarked sizes 20, 40, undetected.
            detections.append((prompt_id, task, "baseline", "", 100, 0.01 if (task, i) == ("book_report", 0)
                               else 0.5, (task, i) == ("book_report", 0), None))
            detections.append((prompt_id, task, "watermarked", "", 100, 0.001 if i < 2 else 0.3, i < 2,
                               [20, 40, None][i]))
            ratings.append((prompt_id, task, "baseline", "", 50.0))
            ratings.append((prompt_id, task, "watermarked", "", [50.0, 40.0, None][i]))
        attacked = ids[0]
        # the attacked prompt's watermarked text, re-tokenized as attacked texts are (R's no-attack anchor)
        detections.append((attacked, task, "retokenized", "", 100, 0.001, True, 20))
        for attack, detected, rating in (("wipe", False, 40.0), ("keep", True, 50.0)):
            perturbed.append((attacked, task, attack, attack, True, "text", True, ""))
            detections.append((attacked, task, "attack", attack, 100, 0.5 if not detected else 0.001, detected,
                               None if not detected else 20))
            ratings.append((attacked, task, "attack", attack, rating))
    detection_schema = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "attack": pl.String,
                        "n_tokens": pl.Int64, "pvalue": pl.Float64, "detected": pl.Boolean, "size": pl.Int64}
    table = pl.DataFrame(detections, schema=detection_schema, orient="row").with_columns(
        size_valid=pl.col("size"),
        size_anytime=pl.col("size"),
        audit_pvalues=pl.when(pl.col("source") == "baseline").then(pl.concat_list(pl.col("pvalue"))))
    write_table(table.filter(pl.col("source") == "baseline"), directory / "data/detections/baseline.parquet")
    write_table(table.filter(pl.col("source") != "baseline"), directory / "data/detections/watermarked.parquet")
    rating_table = pl.DataFrame(ratings, schema={"prompt_id": pl.String, "task": pl.String, "source": pl.String,
                                                 "attack": pl.String, "rating": pl.Float64}, orient="row")
    rating_table = rating_table.with_columns(rating_greedy=pl.lit(None, pl.Float64), rating_expected=pl.col("rating"))
    write_table(rating_table.filter(pl.col("source") == "baseline"), directory / "data/ratings/baseline.parquet")
    write_table(rating_table.filter(pl.col("source") != "baseline"), directory / "data/ratings/watermarked.parquet")
    write_table(pl.DataFrame(perturbed, schema=["prompt_id", "task", "attack", "family", "in_R", "text", "ok",
                                                "error"], orient="row"), directory / "data/perturbed.parquet")
    write_json({"requested_mode": "auto", "mode": "expected", "discriminates": False, "best_mode": None,
                "modes": {}}, directory / "reports/judge.json")
    write_json({"stage": "generate_watermarked", "wall_s": 12.5},
               directory / "reports/timings/generate_watermarked.json")


def test_aggregate_writes_metrics_summary_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   board: dict[str, Any]) -> None:
    monkeypatch.chdir(tmp_path)
    _write_params(tmp_path, board)
    _hand_made_run(tmp_path)
    result = CliRunner().invoke(app, ["aggregate"])
    assert result.exit_code == 0, result.output
    metrics = read_json(tmp_path / "reports/metrics.json")
    overall = metrics["all"]
    assert overall["fpr"] == pytest.approx(1 / 6) and overall["fpr_n"] == 6
    assert overall["fpr_ci_low"] < 1 / 6 < overall["fpr_ci_high"]
    assert overall["quality_watermarked"] == pytest.approx(45.0)  # the null rating is excluded, not a 0
    assert overall["relative_quality"] == pytest.approx(0.9)
    assert overall["ratings_missing"] == 2
    assert overall["size"] == 40.0  # median of 20, 40, inf, 20, 40, inf
    # 'wipe' sits at (0.8, 0): frontier (0,0) -> (0.8,0) -> (1,1), area 0.1, R = 0.2; 'keep' is at (1, 1).
    assert overall["tamper_resistance"] == pytest.approx(0.2)
    assert metrics["attacks"]["wipe"]["watermarked"] == 0.0
    assert metrics["attacks"]["wipe"]["quality_retained"] == pytest.approx(0.8)
    assert metrics["judge"] == {"mode": "expected", "discriminates": False}
    summary = (tmp_path / "reports/summary.md").read_text()
    assert "discriminates baseline from word-shuffled baseline: **NO**" in summary
    # Wall times are a log (reports/timings, `mmw timings`), never part of the cached, reproducible summary.
    assert "12.5" not in summary
    timings = CliRunner().invoke(app, ["timings"])
    assert timings.exit_code == 0 and "| generate_watermarked | 12.5 |" in timings.output
    assert (tmp_path / "reports/tamper_resistance.png").stat().st_size > 10_000
    # Every file the dvc.yaml plot definitions point at exists and has the plotted columns.
    dvc_plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    for definition in dvc_plots:
        (spec,) = definition.values()
        for axis in ("x", "y"):
            fields = spec[axis] if isinstance(spec[axis], dict) else {f: spec[axis] for f in spec["y"]}
            for file, column in fields.items():
                assert column in pl.read_csv(tmp_path / file).columns, (file, column)
