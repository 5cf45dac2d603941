"""The sandbox for generated code: ordinary programs pass or fail by their exit status; hostile programs (busy
loop, sleep, fork bomb, huge allocation, writes outside the directory, network, subprocess, endless output) are
stopped, counted as not passed, leave nothing behind, and never raise into the caller."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from mmw.errors import SpecError
from mmw.quality.params import QualityParams
from mmw import sandbox
from mmw.sandbox import SandboxLimits, isolation, probe_bwrap, run_python

FAST = SandboxLimits(timeout_s=3.0, memory_mb=256, file_mb=1)


def test_a_correct_program_passes_and_a_wrong_one_fails():
    ok = run_python("import math, collections\nassert math.gcd(12, 18) == 6\nprint('done')", FAST)
    assert ok.status == "passed" and ok.passed and ok.returncode == 0 and ok.stdout.strip() == "done"
    wrong = run_python("assert sorted([3, 1, 2]) == [3, 2, 1], 'not sorted descending'", FAST)
    assert wrong.status == "failed" and not wrong.passed
    assert "AssertionError: not sorted descending" in wrong.stderr
    syntax = run_python("def f(:\n    pass", FAST)
    assert syntax.status == "failed" and "SyntaxError" in syntax.stderr


def test_the_program_sees_only_the_standard_library():
    # -I -S: no site-packages, so a module of this environment (polars) cannot be imported by generated code.
    result = run_python("import polars", FAST)
    assert result.status == "failed" and "ModuleNotFoundError" in result.stderr


@pytest.mark.parametrize("source", ["while True:\n    pass", "import time\ntime.sleep(60)"], ids=["busy", "sleep"])
def test_a_program_that_never_ends_is_killed_at_the_timeout(source):
    started = time.perf_counter()
    result = run_python(source, SandboxLimits(timeout_s=1.5))
    elapsed = time.perf_counter() - started
    assert result.status in ("timeout", "failed") and not result.passed
    assert elapsed < 1.5 + 5  # killed near the limit, not left running


def _sandbox_processes() -> list[str]:
    """Command lines of live processes that run the sandbox runner (its argv carries the RUNNER source)."""
    # -ww: whole command lines (without a terminal ps may cut them at 80 columns, before the runner's source)
    listing = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if "sys.addaudithook(_hook)" in line]


def test_the_leftover_listing_sees_a_running_program():
    """The listing can fail: while a program runs it is there (its whole command line is read), after it is not."""
    import threading

    done = threading.Thread(target=run_python, args=("import time\ntime.sleep(1.5)", FAST))
    done.start()
    deadline, seen = time.monotonic() + 10, []
    while not seen and time.monotonic() < deadline:
        seen = _sandbox_processes()
        time.sleep(0.02)
    done.join()
    assert seen and _sandbox_processes() == []


@pytest.mark.parametrize("source", [
    "import os\nwhile True:\n    os.fork()",
    "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(30,)).start()",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "import subprocess\nsubprocess.run(['sleep', '30'])",
    "import os\nos.system('sleep 30 &')",
], ids=["fork-bomb", "thread-bomb", "multiprocessing", "subprocess", "system"])
def test_no_new_process_or_thread_and_nothing_left_behind(source):
    result = run_python(source, FAST)
    assert result.status == "failed"  # refused at once (audit hook, RLIMIT_NPROC), not running until the timeout
    assert _sandbox_processes() == []


@pytest.mark.parametrize("source", [
    "x = bytearray(4 * 1024**3)",
    "x = [0] * (2 * 10**9)",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 1024**2))",
], ids=["one-block", "list", "growing"])
def test_a_huge_allocation_fails_instead_of_exhausting_memory(source):
    result = run_python(source, FAST)
    assert result.status == "failed" and "MemoryError" in result.stderr


def test_memory_within_the_limit_is_allowed():
    assert run_python("x = bytearray(50 * 1024**2)\nassert len(x) == 50 * 1024**2", FAST).passed


@pytest.fixture
def open_dir():
    """A directory anyone can reach and write (under /tmp, not pytest's 0700 tmp_path), so that only the sandbox
    can stop a write there, whichever user the program runs as."""
    path = Path(tempfile.mkdtemp(prefix="mmw-escape-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("template", [
    "open({path!r}, 'w').write('escaped')",
    "import os\nfd = os.open({path!r}, os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'escaped')",
    "import pathlib\npathlib.Path({path!r}).write_text('escaped')",
    "import os\nopen('inside.txt', 'w').write('escaped')\nos.rename('inside.txt', {path!r})",
    "import os\nos.symlink({path!r}, 'link')\nopen('link', 'w').write('escaped')",
    "import shutil\nopen('inside.txt', 'w').write('escaped')\nshutil.copy('inside.txt', {path!r})",
], ids=["open", "os.open", "pathlib", "rename", "symlink", "shutil.copy"])
def test_writing_outside_the_sandbox_directory_fails(template, open_dir):
    target = open_dir / f"escape-{uuid.uuid4().hex}.txt"
    result = run_python(template.format(path=str(target)), FAST)
    assert not result.passed
    assert not target.exists()


def test_deleting_outside_the_sandbox_directory_fails(open_dir):
    victim = open_dir / "keep.txt"
    victim.write_text("keep")
    victim.chmod(0o666)
    result = run_python(f"import os\nos.remove({str(victim)!r})", FAST)
    assert not result.passed and victim.read_text() == "keep"


def test_files_inside_the_sandbox_directory_work_and_vanish_afterwards():
    result = run_python("import os\nopen('a.txt', 'w').write('x')\nos.mkdir('d')\nos.rename('a.txt', 'd/b.txt')\n"
                        "assert open('d/b.txt').read() == 'x'\nprint(os.getcwd())", FAST)
    assert result.passed, result.stderr
    assert not Path(result.stdout.strip()).exists()


def test_a_file_larger_than_the_limit_cannot_be_written_and_output_is_capped():
    big = run_python("open('big.bin', 'wb').write(b'x' * (8 * 1024**2))", FAST)  # 8 MiB > file_mb = 1
    assert not big.passed
    chatty = run_python("while True:\n    print('y' * 1000)", FAST)
    assert not chatty.passed and len(chatty.stdout) <= 2000


@pytest.mark.parametrize("source", [
    "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)",
    "import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', 22))",
    "import urllib.request\nurllib.request.urlopen('http://pypi.org', timeout=2)",
], ids=["socket", "raw-socket", "urllib"])
def test_network_access_fails(source):
    result = run_python(source, FAST)
    assert result.status == "failed"


def test_unsafe_mode_uses_the_network_namespace_when_unshare_works_here():
    """The explicit opt-in without bubblewrap: the network namespace still stops native code where it works
    (root), and the description says the mode was unsafe."""
    usable = subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0 \
        if os.geteuid() == 0 else None
    if not usable:
        pytest.skip("no network namespace on this machine (unshare unavailable or not root)")
    where = isolation("unsafe")
    assert "--net" in where.prefix and where.describe().startswith("UNSAFE (quality.sandbox: unsafe)")
    assert run_python("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)",
                      replace(FAST, mode="unsafe")).status == "failed"
    assert run_python("print(6 * 7)", replace(FAST, mode="unsafe")).stdout.strip() == "42"


def test_the_params_setting_offers_exactly_the_sandbox_modes():
    from typing import get_args

    from mmw.sandbox import MODES

    assert get_args(QualityParams.model_fields["sandbox"].annotation) == MODES


def test_bwrap_is_the_default_and_is_described_as_such():
    assert SandboxLimits().mode == "bwrap" and QualityParams().sandbox == "bwrap"
    described = isolation().describe()
    assert described.startswith("bubblewrap: user, mount, pid, network") and "UNSAFE" not in described


@pytest.mark.parametrize("bwrap", [None, "/bin/false"], ids=["missing", "not-working"])
def test_without_working_bubblewrap_generated_code_is_refused_naming_the_setting(bwrap):
    with pytest.raises(SpecError) as info:
        probe_bwrap(bwrap)
    message = str(info.value)
    assert message.startswith("quality.sandbox: bubblewrap") and "quality.sandbox: unsafe" in message
    assert message.endswith("allowed: bwrap, unsafe") and "\n" not in message
    with pytest.raises(SpecError, match="quality.sandbox: unknown sandbox mode 'none'"):
        isolation("none")


def test_the_quality_stage_refuses_before_reading_any_table(tmp_path, monkeypatch):
    """No bubblewrap and no opt-in: one line naming the setting, before the generations are even read."""
    import yaml

    from mmw import sandbox
    from mmw.stages import quality

    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"seed": 0, "quality": {"metrics": ["task"]}}))
    monkeypatch.chdir(tmp_path)  # no data/generations here: reading them would fail differently
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(SpecError, match="^quality.sandbox: bubblewrap .bwrap. is not installed"):
            quality.run(tmp_path / "params.yaml")
    finally:
        sandbox.isolation.cache_clear()


def test_exit_status_zero_from_an_early_exit_is_still_reported_as_such():
    """The sandbox reports what happened; the caller's marker check (task measures) decides what a pass is."""
    result = run_python("import sys\nsys.exit(0)\nprint('unreached')", FAST)
    assert result.passed and "unreached" not in result.stdout


def test_the_provenance_names_the_interpreter_not_the_checkout(tmp_path):
    """quality.json records the sandbox's description: the same interpreter reached through a venv symlink in two
    checkouts must describe the same way, or a fresh clone's `dvc repro` changes a committed output (seen: the
    fresh clone's venv python vs /usr/bin/python3, both /usr/bin/python3.11)."""
    from mmw.sandbox import Isolation

    real = os.path.realpath(shutil.which("python3") or "/usr/bin/python3")
    described = set()
    for checkout in ("a", "b"):
        link = tmp_path / checkout / ".venv/bin/python"
        link.parent.mkdir(parents=True)
        link.symlink_to(real)
        described.add(Isolation((), str(link), False).describe())
    assert described == {Isolation((), real, False).describe()}
    assert described.pop().endswith(f"interpreter {real}")


def test_the_leftover_check_finds_kills_and_fails_a_run_that_left_a_process():
    """A run's PID namespace that still holds a process after the run: the check finds it, kills it, and turns a
    pass into a failure (under bubblewrap the program is PID 1, so this backstop should never fire on its own)."""
    outer = subprocess.Popen(["unshare", "--map-root-user", "--pid", "--fork", "sleep", "60"])
    try:
        children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children")
        deadline = time.monotonic() + 5
        while not children.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)
        child = int(children.read_text().split()[0])
        namespace = int(os.readlink(f"/proc/{child}/ns/pid").split("[")[1].rstrip("]"))
        assert sandbox.processes_in(namespace) == [child]
        status, note = sandbox._end_of_run("passed", {"pid-namespace": namespace})
        assert status == "failed" and "1 process(es)" in note
        assert sandbox.processes_in(namespace) == []
        assert sandbox._end_of_run("passed", {})[0] == "error"  # bubblewrap never said where the run was
    finally:
        outer.kill()
        outer.wait()
