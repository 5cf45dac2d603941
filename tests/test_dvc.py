"""The DVC pipeline for real: `dvc repro` on a tiny board, then experiments that must rerun only what changed.

Runs the whole pipeline (generator, detector, attacks, judge) in a temporary git repository holding a copy of
dvc.yaml and of the code the stages depend on, with 1 prompt per task and 16 new tokens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[1]
#: What the copied pipeline needs: its definition, DVC's config, and every path dvc.yaml lists as a dependency.
COPIED = ("dvc.yaml", ".dvc/config", ".dvc/.gitignore", ".dvcignore", "mmw", "stages", "kernels", "data/tasks")
ALL_STAGES = {"key", "prompts", "generate_baseline", "generate_watermarked", "perturb", "detect_baseline",
              "detect_watermarked", "rate_baseline", "rate_watermarked", "aggregate"}


def _tiny_board() -> dict:
    board = yaml.safe_load((REPO / "params.yaml").read_text())
    board["model"].update(max_new_tokens=16, batch_size=4)
    board["prompts"]["per_task"] = 1
    board["attacks"]["specs"] = [{"name": "swap", "p": 0.1}, {"name": "lowercase"}]
    board["rate"].update(batch_size=4)
    return board


def _run(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    env = {**os.environ, **(env or {}),
           # the stages' `mmw` command lives next to this interpreter, whether or not the venv is activated
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "GIT_AUTHOR_NAME": "mmw-test", "GIT_AUTHOR_EMAIL": "test@mmw", "GIT_COMMITTER_NAME": "mmw-test",
           "GIT_COMMITTER_EMAIL": "test@mmw"}
    completed = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    assert completed.returncode == 0, f"{' '.join(args)} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout + completed.stderr


def _stages_run(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def _lock_hashes(repo: Path, stage: str) -> list[str]:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return [out["md5"] for out in lock["stages"][stage]["outs"]]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("mmw", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("the `mmw` command is not installed next to this Python (pip install -e .)")
    repo = tmp_path_factory.mktemp("pipeline")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        source, target = REPO / name, repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            shutil.copy2(source, target)
    (repo / "params.yaml").write_text(yaml.safe_dump(_tiny_board(), sort_keys=False))
    _run(repo, "git", "init", "-q")
    output = _run(repo, "dvc", "repro")
    assert _stages_run(output) == ALL_STAGES
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
    assert _stages_run(_run(pipeline, "dvc", "repro")) == {"key"}
    plots = _run(pipeline, "dvc", "plots", "show", "--json")
    assert "Tamper resistance" in plots


def test_scheme_change_reruns_watermark_side_only(pipeline: Path) -> None:
    baseline_outputs = _lock_hashes(pipeline, "generate_baseline")
    output = _run(pipeline, "dvc", "exp", "run", "-S", "scheme.delta=2.5")
    assert _stages_run(output) == {"key", "generate_watermarked", "perturb", "detect_baseline",
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
    assert _stages_run(output) == {"key", "perturb", "detect_watermarked", "rate_watermarked", "aggregate"}
    metrics = json.loads((pipeline / "reports/metrics.json").read_text())
    assert set(metrics["attacks"]) == {"swap_p0.3", "lowercase"}


def test_new_key_from_environment_reruns_key_side_and_is_never_written(pipeline: Path) -> None:
    secret = "an-env-key-that-must-not-leak-7f3a"
    baseline_outputs = _lock_hashes(pipeline, "generate_baseline")
    watermarked_outputs = _lock_hashes(pipeline, "generate_watermarked")
    output = _run(pipeline, "dvc", "repro", env={"MMW_KEY": secret})
    assert _stages_run(output) == {"key", "generate_watermarked", "perturb", "detect_baseline",
                                   "detect_watermarked", "rate_watermarked", "aggregate"}
    assert _lock_hashes(pipeline, "generate_baseline") == baseline_outputs
    assert _lock_hashes(pipeline, "generate_watermarked") != watermarked_outputs
    assert _stages_run(_run(pipeline, "dvc", "repro", env={"MMW_KEY": secret})) == {"key"}
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
