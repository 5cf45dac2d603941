"""Exit codes and one-line errors of every ``mmw`` command (mmw/cli.py).

Contract: 0 success; 2 when the command cannot start — bad params, no or weak key, a missing input file (named with
the stage that makes it), bad options — always one ``error: <key>: <problem>`` line on stderr and no output files;
1 when the work ran but its outcome is a failure (``mmw select`` with nothing feasible, a sweep with failed configs).

Every case here fails before any model loads (the stages check params, the key and their input files first), so
the whole file runs in seconds after the first imports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from mmw.cli import app

ROOT = Path(__file__).resolve().parents[1]
GOOD_KEY = "cli-test-key-0123456789"

# Every pipeline stage command, with the input file whose absence it must report and the stage that makes it.
STAGES: list[tuple[list[str], str | None, str | None]] = [
    (["key"], None, None),
    (["prompts"], None, None),
    (["low-entropy-inputs"], None, None),
    (["generate", "baseline"], "data/prompts.parquet", "prompts"),
    (["generate", "watermarked"], "data/prompts.parquet", "prompts"),
    (["perturb"], "data/generations/watermarked.parquet", "generate_watermarked"),
    (["detect", "baseline"], "data/generations/baseline.parquet", "generate_baseline"),
    (["detect", "watermarked"], "data/generations/watermarked.parquet", "generate_watermarked"),
    (["rate", "baseline"], "data/generations/baseline.parquet", "generate_baseline"),
    (["rate", "watermarked"], "data/generations/watermarked.parquet", "generate_watermarked"),
    (["aggregate"], "data/detections/baseline.parquet", "detect_baseline"),
    (["quality"], "data/generations/baseline.parquet", "generate_baseline"),
]
NEEDS_KEY = [["key"], ["generate", "watermarked"], ["detect", "baseline"], ["detect", "watermarked"]]


def cmd_id(command: list[str]) -> str:
    return "-".join(command)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty pipeline directory: the repository's params.yaml (with a valid key) and dvc.yaml, no data."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MMW_KEY", raising=False)
    board = yaml.safe_load((ROOT / "params.yaml").read_text())
    board["key"] = GOOD_KEY
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(board))
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return tmp_path


def set_param(path: Path, dotted: str, value: Any) -> None:
    board = yaml.safe_load(path.read_text())
    *parents, last = dotted.split(".")
    node = board
    for p in parents:
        node = node[p]
    node[last] = value
    path.write_text(yaml.safe_dump(board))


def invoke(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(app, args, env=env)


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def only_inputs_left(directory: Path) -> None:
    """Nothing was written: no table, no fingerprint, no timing record."""
    assert sorted(p.name for p in directory.iterdir()) == ["dvc.yaml", "params.yaml"]


# ---------------------------------------------------------------------------------------------- bad params: 2
@pytest.mark.parametrize("command", [s[0] for s in STAGES], ids=cmd_id)
def test_bad_params_exit_2_for_every_stage(workdir: Path, command: list[str]) -> None:
    board = yaml.safe_load((workdir / "params.yaml").read_text())
    board["colour"] = "red"
    (workdir / "params.yaml").write_text(yaml.safe_dump(board))
    result = invoke(command)
    assert result.exit_code == 2, result.output
    assert one_error_line(result).startswith("error: colour: unknown top-level key")
    only_inputs_left(workdir)


@pytest.mark.parametrize("scheme,key,allowed", [
    ({"sampler": "reweight", "reweight_alpha": 0.75, "delta": None}, "scheme.reweight_alpha", "(0, 0.5]"),
    ({"randomness": "selfhash", "window": 4, "key_length": 16}, "scheme.key_length", None),
    ({"sampler": "inverse_transform", "randomness": "selfhash", "window": 4, "delta": None, "gamma": None},
     "scheme.sampler", "distribution_shift"),
], ids=["reweight-alpha", "selfhash-fixed-key", "selfhash-shared-draws"])
def test_bad_reweight_and_selfhash_schemes_exit_2(workdir: Path, scheme: dict, key: str, allowed) -> None:
    """Out-of-range reweighting strength and SelfHash with a fixed key or a sampler that needs one seed per
    position: one line naming the key, before any work."""
    for name, value in scheme.items():
        set_param(workdir / "params.yaml", f"scheme.{name}", value)
    result = invoke(["generate", "watermarked"])
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert line.startswith(f"error: {key}: "), line
    assert allowed is None or allowed in line.split("allowed:")[1], line
    only_inputs_left(workdir)


# ---------------------------------------------------------------------------------------------- the key: 2
@pytest.mark.parametrize("command", NEEDS_KEY, ids=cmd_id)
def test_missing_key_exits_2_naming_key(workdir: Path, command: list[str]) -> None:
    set_param(workdir / "params.yaml", "key", None)
    result = invoke(command)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert line.startswith("error: key: no watermark key") and "MMW_KEY" in line
    only_inputs_left(workdir)


@pytest.mark.parametrize("command", NEEDS_KEY, ids=cmd_id)
def test_empty_or_short_env_key_exits_2_naming_mmw_key(workdir: Path, command: list[str]) -> None:
    for value, problem in (("", "set but empty"), ("   ", "set but empty"), ("short-key", "too short")):
        result = invoke(command, env={"MMW_KEY": value})
        assert result.exit_code == 2, result.output
        line = one_error_line(result)
        assert line.startswith("error: MMW_KEY: ") and problem in line, line
        assert value.strip() == "" or value not in line  # the key itself is never echoed
    only_inputs_left(workdir)


def test_short_params_key_exits_2(workdir: Path) -> None:
    set_param(workdir / "params.yaml", "key", "abc123")
    result = invoke(["key"])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert line.startswith("error: key: the key has 6 characters: too short to be secret") and "abc123" not in line


def test_key_command_writes_only_the_fingerprint(workdir: Path) -> None:
    from mmw.keys import key_fingerprint, resolve_key

    result = invoke(["key"], env={"MMW_KEY": "an-environment-key-wins-42"})
    assert result.exit_code == 0, result.output
    fingerprint = (workdir / "data/key.fingerprint").read_text().strip()
    assert fingerprint == key_fingerprint(resolve_key("an-environment-key-wins-42"))
    assert fingerprint != key_fingerprint(resolve_key(GOOD_KEY))  # $MMW_KEY won over params


def test_a_stage_in_its_own_process_ends_at_once_losing_no_output(workdir: Path) -> None:
    """``python -m mmw`` (as DVC runs a stage) skips the interpreter's teardown after a stage succeeds: exit code
    0, the stage's output in place, the exit handlers run, and what was printed before (block-buffered into a pipe)
    still delivered. A failing stage keeps its message and exit code 2."""
    from mmw.keys import key_fingerprint, resolve_key

    script = ("import atexit, sys, mmw.cli; print('printed before the stage'); "
              "atexit.register(lambda: print('exit handler ran')); sys.argv = ['mmw', *sys.argv[1:]]; "
              "mmw.cli.main(); print('not reached')")
    done = subprocess.run([sys.executable, "-c", script, "key"], cwd=workdir, capture_output=True, text=True,
                          env={**os.environ, "MMW_KEY": "an-environment-key-wins-42"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "printed before the stage\nexit handler ran\n"
    assert (workdir / "data/key.fingerprint").read_text().strip() == key_fingerprint(
        resolve_key("an-environment-key-wins-42"))
    failed = subprocess.run([sys.executable, "-m", "mmw", "perturb"], cwd=workdir, capture_output=True, text=True)
    assert failed.returncode == 2 and "data/generations/watermarked.parquet" in failed.stderr, failed.stderr


# ---------------------------------------------------------------------------------------------- missing input: 2
@pytest.mark.parametrize("command,path,producer", [s for s in STAGES if s[1]], ids=lambda v: cmd_id(v)
                         if isinstance(v, list) else None)
def test_missing_input_exits_2_naming_file_and_producer(workdir: Path, command: list[str], path: str,
                                                        producer: str) -> None:
    result = invoke(command)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert line.startswith(f"error: {path}: missing input file, made by stage `{producer}`"), line
    assert f"dvc repro {producer}" in line
    assert "Traceback" not in result.output


def test_missing_input_without_dvc_yaml_still_names_the_file(workdir: Path) -> None:
    (workdir / "dvc.yaml").unlink()
    result = invoke(["perturb"])
    assert result.exit_code == 2
    assert one_error_line(result) == "error: data/generations/watermarked.parquet: missing input file (no stage " \
                                     "of dvc.yaml makes it)"


# ---------------------------------------------------------------------------------------------- other commands
def test_unknown_sweep_exits_2(workdir: Path) -> None:
    result = invoke(["sweep", "run", "no-such-sweep"])
    assert result.exit_code == 2 and one_error_line(result).startswith("error: sweep: unknown sweep")


def test_task_timeout_without_ray_exits_2(workdir: Path) -> None:
    (workdir / "sweeps").mkdir()
    shutil.copy(ROOT / "sweeps/smoke.yaml", workdir / "sweeps/smoke.yaml")
    result = invoke(["sweep", "run", "smoke", "--task-timeout", "60"])
    assert result.exit_code == 2 and one_error_line(result).startswith("error: --task-timeout: only applies to Ray")


def test_report_with_nothing_to_report_exits_2(workdir: Path) -> None:
    result = invoke(["report"])
    assert result.exit_code == 2 and one_error_line(result).startswith("error: report: nothing to report")


def test_install_argos_missing_file_exits_2(workdir: Path) -> None:
    result = invoke(["install-argos", str(workdir / "nothing.argosmodel")])
    assert result.exit_code == 2 and "no such file" in one_error_line(result)


def test_select_outside_a_dvc_repository_exits_2(workdir: Path) -> None:
    result = invoke(["select"])
    assert result.exit_code == 2 and one_error_line(result).startswith("error: dvc exp show: ")


def test_select_bad_option_exits_2(workdir: Path) -> None:
    result = invoke(["select", "--k", "0"])
    assert result.exit_code == 2 and one_error_line(result).startswith("error: --k: ")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_select_with_nothing_feasible_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real git + DVC repository holding one evaluated setting; targets it cannot meet -> exit 1, with the
    report still written (it shows why nothing qualified)."""
    dvc = Path(sys.executable).with_name("dvc")
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.org")
    _git(repo, "config", "user.name", "t")
    subprocess.run([str(dvc), "init", "-q"], cwd=repo, check=True, capture_output=True)
    (repo / "params.yaml").write_text(yaml.safe_dump(
        {"seed": 0, "model": {"temperature": 0.7}, "scheme": {"delta": 2.0, "gamma": 0.5}}))
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"score": {
        "cmd": "true", "params": ["scheme.delta"], "metrics": [{"reports/metrics.json": {"cache": False}}]}}}))
    (repo / "reports").mkdir()
    (repo / "reports/metrics.json").write_text(
        '{"all": {"relative_quality": 0.9, "size": 50.0, "tamper_resistance": 0.1, "fpr": 0.0}}\n')
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "one setting")
    result = invoke(["select", "--max-quality-loss", "0.01", "--min-tamper-resistance", "0.5"])
    assert result.exit_code == 1, result.output
    assert "no feasible setting" in result.stderr
    assert (repo / "reports/selection.md").exists()
    loose = invoke(["select", "--max-quality-loss", "0.5", "--min-tamper-resistance", "0.0"])
    assert loose.exit_code == 0, loose.output  # the same repository with reachable targets picks it


# ---------------------------------------------------------------------------------------------- keys (unit level)
def test_resolve_key_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmw.keys import resolve_key
    from mmw.watermark.prf import key_from_string

    monkeypatch.delenv("MMW_KEY", raising=False)
    assert resolve_key(GOOD_KEY) == key_from_string(GOOD_KEY)
    assert resolve_key(1234567890123456789) == key_from_string("1234567890123456789")  # an int key is its digits
    monkeypatch.setenv("MMW_KEY", "environment-key-0987654321")
    assert resolve_key(GOOD_KEY) == key_from_string("environment-key-0987654321")  # the environment wins
    assert resolve_key(None) == key_from_string("environment-key-0987654321")


def test_key_fingerprint_is_scrypt_with_the_documented_cost() -> None:
    """Pinned to scrypt with N = 2^15, r = 8 (32 MiB, ~0.1 s a guess): a later 'speed-up' that weakens the KDF, or a
    switch back to a fast hash, fails here. Distinct keys (even one bit apart) get unrelated fingerprints, and
    neither the key's decimal nor its hex digits appear in it."""
    import hashlib

    from mmw.keys import key_fingerprint

    key = 0x0123456789ABCDEF
    want = hashlib.scrypt(key.to_bytes(8, "little"), salt=b"mmw key fingerprint v2", n=2**15, r=8, p=1,
                          maxmem=2**26, dklen=16).hex()
    assert key_fingerprint(key) == want and len(want) == 32
    assert key_fingerprint(key) == key_fingerprint(key)
    assert key_fingerprint(key ^ 1) != want
    assert hashlib.blake2b(key.to_bytes(8, "little"), digest_size=16).hexdigest() != want
    assert f"{key:x}" not in want and str(key) not in want


def test_generation_resume_fingerprint_depends_on_the_key_without_containing_it() -> None:
    """Rows resumed from disk must come from the same key: two keys give two fingerprints (so parts of one run are
    never reused by the other), and the fingerprint carries the key only through the scrypt tag."""
    from mmw.watermark.scheme import SchemeSpec
    from mmw.stages.generate import resume_fingerprint

    spec = SchemeSpec.from_params(dict(sampler="exponential", randomness="window", window=1, score="sum"))
    key_a, key_b = 0x1111222233334444, 0x1111222233334445
    a, b = resume_fingerprint(1.0, spec, key_a), resume_fingerprint(1.0, spec, key_b)
    assert a != b
    assert resume_fingerprint(0.7, spec, key_a) != a  # the temperature too
    other = SchemeSpec.from_params(dict(sampler="exponential", randomness="window", window=2, score="sum"))
    assert resume_fingerprint(1.0, other, key_a) != a  # and the scheme
    for text in (a, b):
        for key in (key_a, key_b):
            assert str(key) not in text and f"{key:x}" not in text and f"{key:016x}" not in text
    assert resume_fingerprint(1.0, None, None) == "T=1.0"  # the baseline does not depend on any key
