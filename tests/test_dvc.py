"""The DVC pipeline for real: `dvc repro` on a tiny board, then experiments that must rerun only what changed.

Runs the whole pipeline (generator, detector, attacks, judge) in a temporary git repository holding a copy of
dvc.yaml and of the code the stages depend on, with 1 prompt per task and 16 new tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline_repo import REPO, make_pipeline_repo, run, stages_run, tiny_board

pytestmark = pytest.mark.heavy

ALL_STAGES = {"key", "prompts", "generate_baseline", "generate_watermarked", "perturb", "detect_baseline",
              "detect_watermarked", "rate_baseline", "rate_watermarked", "aggregate"}


def _run(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    completed = run(repo, *args, env=env)
    return completed.stdout + completed.stderr


def _lock_hashes(repo: Path, stage: str) -> list[str]:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return [out["md5"] for out in lock["stages"][stage]["outs"]]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_pipeline_repo(tmp_path_factory.mktemp("pipeline"), tiny_board())
    output = _run(repo, "dvc", "repro")
    assert stages_run(output) == ALL_STAGES
    _run(repo, "git", "add", "-A")
    _run(repo, "git", "commit", "-qm", "baseline run")
    return repo


def test_repro_produces_metrics_and_is_then_up_to_date(pipeline: Path) -> None:
    metrics = json.loads((pipeline / "reports/metrics.json").read_text())
    assert {"all", "book_report", "story", "fake_news", "attacks", "judge"} <= set(metrics)
    assert metrics["all"]["generations"] == 3
    assert set(metrics["attacks"]) == {"swap_p0.1", "lowercase"}
    assert (pipeline / "reports/summary.md").read_text().startswith("# mmw benchmark summary")
    assert (pipeline / "reports/tamper_resistance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Only the key stage is always run (it must notice a new $MMW_KEY); its unchanged output stops the rest.
    assert set(yaml.safe_load(_run(pipeline, "dvc", "status", "--json").splitlines()[-1] or "{}")) <= {"key"}
    assert stages_run(_run(pipeline, "dvc", "repro")) == {"key"}
    plots = _run(pipeline, "dvc", "plots", "show", "--json")
    assert "Tamper resistance" in plots


def test_scheme_change_reruns_watermark_side_only(pipeline: Path) -> None:
    baseline_outputs = _lock_hashes(pipeline, "generate_baseline")
    output = _run(pipeline, "dvc", "exp", "run", "-S", "scheme.delta=2.5")
    assert stages_run(output) == {"key", "generate_watermarked", "perturb", "detect_baseline",
                                   "detect_watermarked", "rate_watermarked", "aggregate"}
    assert "Stage 'prompts' didn't change, skipping" in output
    assert "Stage 'generate_baseline' didn't change, skipping" in output
    assert "Stage 'rate_baseline' didn't change, skipping" in output
    assert _lock_hashes(pipeline, "generate_baseline") == baseline_outputs
    diff = json.loads(_run(pipeline, "dvc", "metrics", "diff", "--json"))
    assert diff, "changing the watermark's bias changed no metric"
    params_diff = json.loads(_run(pipeline, "dvc", "params", "diff", "--json"))
    delta = params_diff["params.yaml"]["scheme.delta"]
    assert (delta["old"], delta["new"]) == (5.0, 2.5)


def test_attack_change_reruns_perturb_and_downstream_only(pipeline: Path) -> None:
    output = _run(pipeline, "dvc", "exp", "run", "-S", "attacks.specs.0.p=0.3")
    assert stages_run(output) == {"key", "perturb", "detect_watermarked", "rate_watermarked", "aggregate"}
    metrics = json.loads((pipeline / "reports/metrics.json").read_text())
    assert set(metrics["attacks"]) == {"swap_p0.3", "lowercase"}


def test_new_key_from_environment_reruns_key_side_and_is_never_written(pipeline: Path) -> None:
    secret = "an-env-key-that-must-not-leak-7f3a"
    baseline_outputs = _lock_hashes(pipeline, "generate_baseline")
    watermarked_outputs = _lock_hashes(pipeline, "generate_watermarked")
    output = _run(pipeline, "dvc", "repro", env={"MMW_KEY": secret})
    assert stages_run(output) == {"key", "generate_watermarked", "perturb", "detect_baseline",
                                   "detect_watermarked", "rate_watermarked", "aggregate"}
    assert _lock_hashes(pipeline, "generate_baseline") == baseline_outputs
    assert _lock_hashes(pipeline, "generate_watermarked") != watermarked_outputs
    assert stages_run(_run(pipeline, "dvc", "repro", env={"MMW_KEY": secret})) == {"key"}
    public_key = yaml.safe_load((pipeline / "params.yaml").read_text())["scheme"]["key"]
    for path in pipeline.rglob("*"):
        if path.is_file() and ".git" not in path.parts:
            content = path.read_bytes()
            assert secret.encode() not in content, f"the key leaked into {path.relative_to(pipeline)}"
            if path.name == "dvc.lock" or path.parts[-2:-1] == ("reports",):
                assert public_key.encode() not in content, f"scheme.key copied into {path.relative_to(pipeline)}"


def test_every_scheme_param_but_the_key_is_a_dependency() -> None:
    from mmw.scheme import KNOWN_KEYS

    pipeline = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in pipeline.items():
        listed = {p for p in stage.get("params", []) if isinstance(p, str) and p.startswith("scheme")}
        assert "scheme" not in listed and "scheme.key" not in listed, f"{name} copies the key into dvc.lock"
        if listed:
            assert listed == {f"scheme.{k}" for k in KNOWN_KEYS if k != "key"}, f"{name} misses a scheme param"
            if name != "aggregate":  # aggregate shows the scheme; its inputs already carry the key's effect
                assert "data/key.fingerprint" in stage["deps"], f"{name} would not notice a new key"
