"""Warm stage processes (mmw.prefork): the same outputs as a process per stage, the caller's exit status,
signals and descriptors, and the fallback when no server can serve.

The heavy case runs the tiny pipeline from scratch through the server and compares every output DVC records with
the shared run's (tests/pipeline_repo.py: plain stage processes, traced), byte for byte.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from pipeline_repo import (
    TracedRun,
    clone_pipeline,
    plain_shell_env,
    run,
    traced_tiny_pipeline,
)

from mmw import prefork


def _outs(lock: Path) -> dict[str, str]:
    """Every output's md5 in a dvc.lock (a directory's is the hash of its listing)."""
    stages = yaml.safe_load(lock.read_text())["stages"]
    return {out["path"]: out["md5"] for stage in stages.values() for out in stage.get("outs", [])}


def _copies(log: Path) -> list[tuple[str, int]]:
    """(command, exit status) of every copy the server's log reports."""
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"copy \d+ \(([^)]*)\) exit status (-?\d+)", log.read_text())]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    return traced_tiny_pipeline(tmp_path_factory.getbasetemp() / "tiny-pipeline")


@pytest.fixture(scope="module")
def warm(traced: TracedRun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The shared run's repository, cloned, then `dvc repro --force` through a server of its own (its folder in
    the test's temporary root, so its log is this test's)."""
    base = tmp_path_factory.mktemp("prefork")
    repo = clone_pipeline(traced.pristine, base / "pipeline")
    servers = base / "run"
    servers.mkdir()
    # A judgement cache of its own, empty like the shared run's: judgements found in a cache shared with other runs
    # would leave the rest to be computed in other batches, whose rows round differently in the last digits
    # (docs/JUDGE.md).
    env = {"MMW_PREFORK": "1", "MMW_PREFORK_IDLE": "60", "XDG_RUNTIME_DIR": str(servers),
           "MMW_JUDGE_CACHE": str(base / "judgements")}
    done = run(repo, ".venv/bin/dvc", "repro", "--force", env=env)
    return {"repo": repo, "env": env, "folder": servers / f"mmw-prefork-{os.getuid()}", "output": done.stdout}


@pytest.mark.heavy
def test_a_pipeline_through_the_server_equals_plain_processes_byte_for_byte(traced: TracedRun,
                                                                             warm: dict[str, Any]) -> None:
    plain, through = _outs(traced.pristine / "dvc.lock"), _outs(warm["repo"] / "dvc.lock")
    assert set(plain) == set(through) and len(plain) > 20
    assert {path: md5 for path, md5 in through.items() if plain[path] != md5} == {}
    logs = list(warm["folder"].glob("*.log"))
    assert len(logs) == 1, logs  # one server for the whole run
    copies = _copies(logs[0])
    stages = yaml.safe_load((warm["repo"] / "dvc.lock").read_text())["stages"]
    assert len(copies) == len(stages) and all(status == 0 for _, status in copies), copies  # one per stage
    assert {command.split()[0] for command, _ in copies} == set(prefork.STAGE_COMMANDS)


def _client(repo: Path, env: dict[str, str], *args: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([str(repo / ".venv/bin/mmw"), *args], cwd=repo, env=plain_shell_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _server(warm: dict[str, Any]) -> psutil.Process:
    """The live server of the warm repository's runs (a command through it first: an idle one has ended)."""
    done = _client(warm["repo"], warm["env"], "key")
    assert done.wait(timeout=300) == 0
    folder = warm["folder"]
    pids = [int(m) for log in folder.glob("*.log") for m in re.findall(r"\(pid (\d+)\)", log.read_text())]
    live = [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)]
    assert len(live) == 1, pids
    return live[0]


def _copy_of(server: psutil.Process, earlier: set[int], deadline: float = 120) -> psutil.Process:
    """The server's first child not in ``earlier`` (an ended copy may linger until the server reaps it)."""
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        children = [child for child in server.children() if child.pid not in earlier
                    and child.status() != psutil.STATUS_ZOMBIE]
        if children:
            return children[0]
        time.sleep(0.05)
    raise AssertionError("no copy started")


def _settled(copy: psutil.Process, repo: Path, deadline: float = 120) -> None:
    """Wait until ``copy`` has become its caller: it moves into the caller's folder right after it puts the
    caller's descriptors in place, so before that its descriptor table is still the server's."""
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        if Path(copy.cwd()).resolve() == repo.resolve():
            return
        time.sleep(0.02)
    raise AssertionError(f"copy {copy.pid} never moved into {repo}")


def _logged(folder: Path, line: str, deadline: float = 60) -> bool:
    """Whether a server's log in ``folder`` holds ``line`` within ``deadline`` seconds (the server writes it on its
    own schedule, not the test's)."""
    stop = time.monotonic() + deadline
    while True:
        if any(line in log.read_text() for log in folder.glob("*.log")):
            return True
        if time.monotonic() >= stop:
            return False
        time.sleep(0.05)


@pytest.mark.heavy
def test_exit_status_and_error_of_a_bad_command_are_the_processs_own(warm: dict[str, Any], tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.yaml")
    plain = _client(warm["repo"], {}, "key", "-p", missing)
    through = _client(warm["repo"], warm["env"], "key", "-p", missing)
    plain_out, plain_err = plain.communicate(timeout=300)
    out, err = through.communicate(timeout=300)
    assert plain.returncode == through.returncode == 2
    assert (out, err) == (plain_out, plain_err) and missing in err


@pytest.mark.heavy
def test_a_copy_holds_the_callers_descriptors_and_dies_with_its_caller(warm: dict[str, Any]) -> None:
    """A descriptor the caller inherited (a sweep's run lock) is open in the copy; a signal to the caller reaches
    the copy and ends the caller the same way; a caller killed outright takes its copy with it."""
    repo, env = warm["repo"], warm["env"]
    server = _server(warm)
    read_end, write_end = os.pipe()
    try:
        earlier = {child.pid for child in server.children()}
        caller = _client(repo, env, "quality", pass_fds=(write_end,))
        copy = _copy_of(server, earlier)
        _settled(copy, repo)
        assert os.readlink(f"/proc/{copy.pid}/fd/{write_end}") == os.readlink(f"/proc/self/fd/{write_end}")
        os.close(write_end)
        write_end = -1
        caller.send_signal(signal.SIGTERM)
        caller.communicate(timeout=120)
        assert caller.returncode == -signal.SIGTERM
        psutil.wait_procs([copy], timeout=30)
        assert not copy.is_running()
        assert os.read(read_end, 1) == b""  # every holder of the write end is gone
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)

    earlier = {child.pid for child in server.children()}
    caller = _client(repo, env, "quality")
    copy = _copy_of(server, earlier)
    caller.kill()
    caller.communicate(timeout=60)
    psutil.wait_procs([copy], timeout=30)
    assert not copy.is_running()
    assert _logged(warm["folder"], f"copy {copy.pid} killed: its caller is gone")


@pytest.mark.heavy
def test_a_server_that_cannot_serve_leaves_the_command_to_its_caller(warm: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    env = {**warm["env"], "XDG_RUNTIME_DIR": str(folder)}
    key = subprocess.run([str(warm["repo"] / ".venv/bin/python"), "-c",
                          "from mmw import prefork; print(prefork._folder() / prefork._server_key())"],
                         cwd=warm["repo"], env=plain_shell_env(env), capture_output=True, text=True, check=True)
    Path(key.stdout.strip() + ".refused").write_text("test: as if the imports had started threads\n")
    done = _client(warm["repo"], env, "key")
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert not list(folder.rglob("*.log"))  # no server was started, the caller ran the stage


def test_a_hidden_module_comes_back_as_the_same_object_only_when_imported(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mmw_prefork_probe.py").write_text("LOADS = []\nLOADS.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("mmw_prefork_probe")
    hidden = prefork._Hidden(["mmw_prefork_probe"])
    monkeypatch.setattr(sys, "meta_path", [hidden, *sys.meta_path])
    try:
        assert "mmw_prefork_probe" not in sys.modules
        assert importlib.util.find_spec("mmw_prefork_probe") is not None  # "is it installed?" loads nothing
        assert "mmw_prefork_probe" not in sys.modules
        again = importlib.import_module("mmw_prefork_probe")
        assert again is module and again.LOADS == [1] and again.__spec__ is module.__spec__
        assert sys.modules["mmw_prefork_probe"] is module and hidden.modules == {}
    finally:
        sys.modules.pop("mmw_prefork_probe", None)


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["mmw", "generate", "baseline"], {"MMW_PREFORK": "1"}, True),
    (["mmw", "generate", "baseline"], {}, False),
    (["mmw", "sweep", "run", "x"], {"MMW_PREFORK": "1"}, False),
    (["mmw", "generate", "baseline"], {"MMW_PREFORK": "1", "PYTHONPATH": "/x"}, False),
    (["mmw", "rate", "baseline"], {"MMW_PREFORK": "1", "_MMW_PREFORK_COPY": "1"}, False),
])
def test_only_stage_commands_without_process_hooks_go_to_the_server(argv: list[str], env: dict[str, str],
                                                                    expected: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MMW_PREFORK", "PYTHONPATH", "_MMW_PREFORK_COPY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert prefork.enabled(argv) is expected


def test_a_stage_in_a_folder_with_a_matplotlibrc_runs_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server imported matplotlib in another folder, and matplotlib reads the working folder's matplotlibrc at
    import: a copy would draw without it."""
    for name in ("PYTHONPATH", "_MMW_PREFORK_COPY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MMW_PREFORK", "1")
    monkeypatch.chdir(tmp_path)
    assert prefork.enabled(["mmw", "aggregate"])
    (tmp_path / "matplotlibrc").write_text("font.size: 20\n")
    assert not prefork.enabled(["mmw", "aggregate"])


def test_the_server_key_follows_load_time_variables_but_not_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    base = prefork._server_key()
    monkeypatch.setenv("MMW_KEY", "a" * 32)
    monkeypatch.setenv("DVC_STAGE", "generate_baseline")
    assert prefork._server_key() == base  # one server for every stage and key
    monkeypatch.setenv("OMP_NUM_THREADS", str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1))
    assert prefork._server_key() != base
