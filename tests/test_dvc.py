"""The DVC pipeline for real, as the README runs it: `.venv/bin/dvc repro` from a shell with no venv activated,
then experiments that must rerun exactly what changed and never write the key anywhere.

Runs the whole pipeline (generator, detector, attacks, judge) on a tiny board (1 prompt per task, 16 new tokens)
in a copy of this checkout (tests/pipeline_repo.py); tests/test_deps.py checks the same run's trace.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from _t2_selection_rule import check_select
from pipeline_repo import REPO, TracedRun, clone_pipeline, copy_checkout, plain_shell_env, run, stages_run, \
    stages_skipped, traced_tiny_pipeline

pytestmark = pytest.mark.heavy

#: Hand-classified: what a change of the watermark (scheme or key) must rerun, and what it must not.
#: A new stage fails test_every_stage_is_classified until it is added to one side.
WATERMARK_SIDE = {"key", "generate_watermarked", "perturb", "detect_baseline", "detect_watermarked",
                  "rate_watermarked", "quality", "aggregate"}
BASELINE_SIDE = {"code", "low_entropy_inputs", "prompts", "generate_baseline", "rate_baseline"}
#: What a change of one attack's parameter must rerun (the key stage always runs).
ATTACK_SIDE = {"key", "perturb", "detect_watermarked", "rate_watermarked", "aggregate"}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return traced_tiny_pipeline(tmp_path_factory.getbasetemp() / "tiny-pipeline")


@pytest.fixture(scope="module")
def pipeline(traced: TracedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The traced run in a repository of this file's own: its experiments never reach the shared run."""
    return clone_pipeline(traced.pristine, tmp_path_factory.mktemp("dvc") / "pipeline")


def _run(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    completed = run(repo, *args, env=env)
    return completed.stdout + completed.stderr


def _lock_hashes(repo: Path, stage: str) -> list[str]:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return [out["md5"] for out in lock["stages"][stage]["outs"]]


def _restore_committed_run(repo: Path) -> None:
    """Back to the committed baseline run (an earlier test's `dvc exp run` left its results in the workspace)."""
    _run(repo, "git", "checkout", "--", ".")
    _run(repo, "dvc", "checkout", "--force")


def _all_stages() -> set[str]:
    return set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])


def test_every_stage_is_classified() -> None:
    assert WATERMARK_SIDE | BASELINE_SIDE == _all_stages() and not WATERMARK_SIDE & BASELINE_SIDE


def test_readme_repro_runs_every_stage_from_a_plain_shell(traced: TracedRun, record_property) -> None:
    env = plain_shell_env()
    assert "VIRTUAL_ENV" not in env
    assert not any(Path(entry, "mmw").exists() for entry in env["PATH"].split(":") if entry)
    assert stages_run(traced.output) == _all_stages(), traced.output
    record_property("tiny_dvc_repro_seconds", round(traced.seconds, 1))
    print(f"\ntiny `.venv/bin/dvc repro` from scratch: {traced.seconds:.1f} s")


def test_a_bare_mmw_stage_command_fails_in_that_shell(tmp_path: Path) -> None:
    """The environment the README test runs in really lacks `mmw`: the old stage command fails there (exit 127)."""
    repo = copy_checkout(tmp_path / "copy")
    definition = yaml.safe_load((repo / "dvc.yaml").read_text())
    definition["stages"]["key"]["cmd"] = "mmw key"
    (repo / "dvc.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))
    failed = run(repo, ".venv/bin/dvc", "repro", "key", check=False)
    assert failed.returncode != 0
    assert "mmw: command not found" in failed.stdout + failed.stderr or "127" in failed.stdout + failed.stderr


def test_repro_produces_metrics_and_is_then_up_to_date(pipeline: Path) -> None:
    metrics = json.loads((pipeline / "reports/metrics.json").read_text())
    assert {"all", "book_report", "story", "fake_news", "attacks", "judge"} <= set(metrics)
    assert metrics["all"]["generations"] == 3
    assert set(metrics["attacks"]) == {"swap_p0.1", "lowercase", "misspelling_p0.5", "contraction"}
    assert (pipeline / "reports/summary.md").read_text().startswith("# mmw benchmark summary")
    assert (pipeline / "reports/tamper_resistance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Only the key stage is always run (it must notice a new $MMW_KEY); its unchanged output stops the rest.
    status = json.loads(_run(pipeline, "dvc", "status", "--json").splitlines()[-1] or "{}")
    assert status == {"key": ["always changed"]}, status
    again = _run(pipeline, "dvc", "repro")
    assert stages_run(again) == {"key"} and stages_skipped(again) == _all_stages() - {"key"}, again
    assert "Tamper resistance" in _run(pipeline, "dvc", "plots", "show", "--json")


def test_wall_times_are_a_log_not_an_input(pipeline: Path) -> None:
    """Timings change every run: no stage may depend on them, and no cached output may contain them."""
    lock = yaml.safe_load((pipeline / "dvc.lock").read_text())["stages"]
    for name, stage in lock.items():
        paths = [d["path"] for d in stage.get("deps", [])] + [o["path"] for o in stage.get("outs", [])]
        assert not any(p.startswith("reports/timings") for p in paths), name
    wall_times = [json.loads(p.read_text())["wall_s"] for p in (pipeline / "reports/timings").glob("*.json")]
    assert len(wall_times) >= 8
    assert "Wall time" not in (pipeline / "reports/summary.md").read_text()


@pytest.fixture(scope="module")
def scheme_experiment(pipeline: Path) -> dict[str, Any]:
    """`dvc exp run -S scheme.delta=2.5` on the committed run, and what DVC said right after it: the stages it ran
    and skipped, the params and metrics diffs, the baseline generation's hashes before and after."""
    baseline_outputs = _lock_hashes(pipeline, "generate_baseline")
    output = _run(pipeline, "dvc", "exp", "run", "-S", "scheme.delta=2.5")
    return {"output": output, "baseline_before": baseline_outputs,
            "baseline_after": _lock_hashes(pipeline, "generate_baseline"),
            "params_diff": json.loads(_run(pipeline, "dvc", "params", "diff", "--json")),
            "metrics_diff": json.loads(_run(pipeline, "dvc", "metrics", "diff", "--json"))}


def test_scheme_change_reruns_watermark_side_only(scheme_experiment: dict[str, Any]) -> None:
    output = scheme_experiment["output"]
    # delta only shapes generation: the baseline's detection (its params: the detection keys) is not rerun
    assert stages_run(output) == WATERMARK_SIDE - {"detect_baseline"}, output
    assert stages_skipped(output) == BASELINE_SIDE | {"detect_baseline"}, output
    assert scheme_experiment["baseline_after"] == scheme_experiment["baseline_before"]
    params_diff = scheme_experiment["params_diff"]
    assert params_diff == {"params.yaml": {"scheme.delta": {"old": 5.0, "new": 2.5, "diff": -2.5}}}
    diff = scheme_experiment["metrics_diff"]["reports/metrics.json"]
    assert diff, "changing the watermark's bias changed no metric"
    # dvc can subtract every metric: numbers or null, never strings such as "inf"
    for name, change in diff.items():
        for side in ("old", "new"):
            assert change[side] is None or (isinstance(change[side], int | float) and math.isfinite(change[side])), \
                (name, change)
    assert not [name for name in diff if name.startswith("judge.")], "the baseline's judge check changed"


def test_select_on_the_real_pipeline(pipeline: Path, scheme_experiment: dict[str, Any]) -> None:
    """`mmw select` over the committed run and two experiments of it: the scheme experiment above and one more
    `dvc exp run -S scheme.delta=1.0` on top of its workspace. Before the attack experiment below, which the
    selection would refuse as incomparable."""
    key = yaml.safe_load((pipeline / "params.yaml").read_text())["key"]
    _run(pipeline, "dvc", "exp", "run", "-S", "scheme.delta=1.0")
    try:
        check_select(pipeline, key)
    finally:  # what selection wrote is no part of the committed run the later tests restore
        for name in ("reports/selection.md", "reports/selection.png"):
            (pipeline / name).unlink(missing_ok=True)


def test_sweep_evidence_reads_an_experiments_tables_from_the_cache_as_dvc_opens_them(
        pipeline: Path, scheme_experiment: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-prompt rows of an experiment commit (what a sweep's evidence file holds) come straight from the local
    DVC cache, by the md5s of that commit's dvc.lock, without DVC's API; and they equal what DVC's API opens at
    that revision."""
    import dvc.api

    from mmw.sweep import evidence

    refs = run(pipeline, "git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/").stdout.split("\n")
    shas = [line.split()[1] for line in refs if line and "/exec/" not in line]
    assert shas
    for sha in shas:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"dvc.api.open{args} at {sha[:7]}: the table was not read from the cache")

        with monkeypatch.context() as patch:
            patch.setattr(dvc.api, "open", refuse)
            direct = evidence.prompt_rows(pipeline, sha)
        with monkeypatch.context() as patch:
            patch.setattr(evidence, "cached_file", lambda *_: None)
            through_dvc = evidence.prompt_rows(pipeline, sha)
        assert direct is not None and through_dvc is not None and direct.height > 0
        assert direct.equals(through_dvc, null_equal=True)


#: Code no stage runs: the sweep (a module and its command line), the other commands, report code aggregate does
#: not use. Editing it must leave every cached stage valid.
NOT_STAGE_CODE = ("mmw/sweep/confirm.py", "mmw/sweep/tables.py", "mmw/sweep/cli.py", "mmw/commands.py",
                  "mmw/reporting/page.py")


def _status_after_the_code_stage(repo: Path) -> dict[str, Any]:
    """`dvc status` once the code stage has fingerprinted the edited code (`dvc repro code`, well under a second of
    work): before it, status names the code stage only, whose rerun decides what else changed."""
    status = json.loads(_run(repo, "dvc", "status", "--json").splitlines()[-1] or "{}")
    assert "code" in status, status  # any edit of a code folder reruns the code stage
    _run(repo, "dvc", "repro", "code")
    return json.loads(_run(repo, "dvc", "status", "--json").splitlines()[-1] or "{}")


def test_editing_sweep_and_report_code_changes_no_stage(pipeline: Path) -> None:
    _restore_committed_run(pipeline)
    try:
        for path in NOT_STAGE_CODE:
            with (pipeline / path).open("a") as file:
                file.write("\n# an edit no stage may notice\n")
        assert _status_after_the_code_stage(pipeline) == {"key": ["always changed"]}
        with (pipeline / "mmw/cli.py").open("a") as file:  # the stage commands: every stage notices
            file.write("\n# an edit every stage notices\n")
        assert set(_status_after_the_code_stage(pipeline)) == _all_stages() - {"code"}
    finally:
        _run(pipeline, "git", "checkout", "--", *NOT_STAGE_CODE, "mmw/cli.py")
        _restore_committed_run(pipeline)


def test_attack_change_reruns_perturb_and_downstream_only(pipeline: Path) -> None:
    _restore_committed_run(pipeline)
    output = _run(pipeline, "dvc", "exp", "run", "-S", "attacks.specs.0.p=0.3")
    assert stages_run(output) == ATTACK_SIDE, output
    assert stages_skipped(output) == _all_stages() - ATTACK_SIDE, output
    params_diff = json.loads(_run(pipeline, "dvc", "params", "diff", "--json"))["params.yaml"]
    assert set(params_diff) == {"attacks.specs"}
    # DVC shows a changed list as its Python repr
    old, new = (ast.literal_eval(params_diff["attacks.specs"][side]) for side in ("old", "new"))
    assert new == [{**old[0], "p": 0.3}, *old[1:]] and old[0]["p"] == 0.1
    metrics = json.loads((pipeline / "reports/metrics.json").read_text())
    assert set(metrics["attacks"]) == {"swap_p0.3", "lowercase", "misspelling_p0.5", "contraction"}


def _key_forms(key: int) -> list[bytes]:
    """The ways a 64-bit key could be written: decimal, hex (either case, with and without 0x), raw bytes."""
    forms = [str(key).encode(), f"{key:x}".encode(), f"{key:X}".encode(), f"{key:#x}".encode(),
             key.to_bytes(8, "little"), key.to_bytes(8, "big")]
    return [form for form in forms if len(form) >= 6]  # a short decimal could match anywhere by chance


def test_new_key_from_environment_reruns_key_side_and_is_never_written(pipeline: Path) -> None:
    from mmw.watermark.prf import key_from_string

    _restore_committed_run(pipeline)
    secret = "an-env-key-that-must-not-leak-7f3a"
    baseline_outputs = _lock_hashes(pipeline, "generate_baseline")
    watermarked_outputs = _lock_hashes(pipeline, "generate_watermarked")
    output = _run(pipeline, "dvc", "repro", env={"MMW_KEY": secret})
    assert stages_run(output) == WATERMARK_SIDE, output
    assert stages_skipped(output) == BASELINE_SIDE, output
    assert _lock_hashes(pipeline, "generate_baseline") == baseline_outputs
    assert _lock_hashes(pipeline, "generate_watermarked") != watermarked_outputs
    again = _run(pipeline, "dvc", "repro", env={"MMW_KEY": secret})
    assert stages_run(again) == {"key"}
    output += again

    public = yaml.safe_load((pipeline / "params.yaml").read_text())["key"]
    secret_forms = [secret.encode(), *_key_forms(key_from_string(secret))]
    public_forms = [public.encode(), *_key_forms(key_from_string(public))]
    for form in secret_forms:
        assert form not in output.encode(), f"the key leaked into dvc repro's output as {form!r}"
    # Every file the runs wrote or changed (outputs, DVC's cache and temp, dvc.lock, metrics), not the sources the
    # copy committed unchanged (tests/test_dvc.py itself holds the secret).
    changed = set(_run(pipeline, "git", "diff", "--name-only").split())
    committed = set(_run(pipeline, "git", "ls-files").split()) - changed
    for path in pipeline.rglob("*"):
        if not path.is_file() or ".git" in path.parts or ".venv" in path.parts \
                or path.relative_to(pipeline).as_posix() in committed:
            continue
        content = path.read_bytes()
        where = path.relative_to(pipeline)
        for form in secret_forms:
            assert form not in content, f"the key leaked into {where} as {form!r}"
        if path.name == "dvc.lock" or "reports" in where.parts or ".dvc" in where.parts:
            for form in public_forms[1:] + ([public_forms[0]] if path.name == "dvc.lock" else []):
                assert form not in content, f"the params key leaked into {where} as {form!r}"
