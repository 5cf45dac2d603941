"""Escape attempts against the code sandbox, each through the project's own API (:func:`mmw.sandbox.run_python`)
and each required to fail. Every attempt is made twice: as written, and after switching off the in-process audit
hook the way a program can (``m = sys.modules['__main__']; m.BLOCKED = (); m.ROOT = ''``), so that what is tested is
the OS boundary, not the program's cooperation. The whole suite also runs as a non-root caller (the host's
``nobody``) where this machine allows switching to it.

An attempt *succeeds* when the program reaches its last line and prints ``ESCAPED`` (it only does once the
forbidden thing worked), or when a side effect shows outside: a file on the host, a connection to the test's
listener, a dead victim or parent process, a program still running after the timeout, or a process left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pytest

from mmw.sandbox import SandboxLimits, isolation, run_python

REPO = Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=512, file_mb=1, disk_mb=8, max_files=64)
BYPASS = "import sys\nm = sys.modules['__main__']\nm.BLOCKED = ()\nm.ROOT = ''\nm.PATH_EVENTS = ()\n"
#: A program proves the hook is off before its attempt: it may now open a socket (the hook refused that before).
PROVE_BYPASS = "import socket\nsocket.socket().close()\n"
NOBODY = pwd.getpwnam("nobody")


@dataclass
class Arena:
    """What the attempts aim at, set up by the test as a victim would have it."""

    outside: Path          # a world-writable directory on the host (so only the sandbox can stop a write there)
    shm: Path              # a file name in the host's /dev/shm
    public: Path           # a world-readable file in a world-readable directory
    ssh_key: Path          # a 0600 ~/.ssh file owned by the user the program runs as
    secret: str            # the content of both
    port: int              # a listener on 127.0.0.1
    accepted: list         # connections the listener accepted
    victim: subprocess.Popen  # a process owned by the program's user, which it must not be able to kill
    token: str             # in the victim's command line, for the /proc attempts


def _owned_by_sandbox_user(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)


@contextlib.contextmanager
def make_arena() -> Iterator[Arena]:
    """The targets, torn down afterwards (also used by bench/sandbox.py to count escapes per mode)."""
    root = Path(tempfile.mkdtemp(prefix="mmw-arena-", dir="/tmp"))
    root.chmod(0o755)
    outside = root / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    secret = f"secret-{uuid.uuid4().hex}"
    public = root / "public.txt"
    public.write_text(secret)
    public.chmod(0o644)
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    ssh_key = home / ".ssh" / "id_ed25519"
    ssh_key.write_text(secret)
    ssh_key.chmod(0o600)
    (home / ".ssh").chmod(0o700)
    home.chmod(0o755)
    for path in (home, home / ".ssh", ssh_key):
        _owned_by_sandbox_user(path)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list = []

    def serve() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    token = f"mmw-victim-{uuid.uuid4().hex}"
    as_nobody = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"] \
        if os.geteuid() == 0 else []
    victim = subprocess.Popen([*as_nobody, "/bin/sh", "-c", f"sleep 600 # {token}", token])
    yield Arena(outside, Path("/dev/shm") / f"mmw-escape-{uuid.uuid4().hex}", public, ssh_key, secret,
                listener.getsockname()[1], accepted, victim, token)
    victim.kill()
    victim.wait()
    listener.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def arena():
    with make_arena() as made:
        yield made


def attempts(a: Arena) -> dict[str, str]:
    """id -> program. Each ends with ``print('ESCAPED')`` only if its forbidden step worked."""
    target = a.outside / "escaped.txt"
    return {
        "write-outside": f"open({str(target)!r}, 'w').write('x')\nprint('ESCAPED')",
        "write-outside-os-open": f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n"
                                 "os.write(fd, b'x')\nprint('ESCAPED')",
        "write-dev-shm": f"open({str(a.shm)!r}, 'w').write('x')\nprint('ESCAPED')",
        "read-repository": f"text = open({str(REPO / 'params.yaml')!r}).read()\nassert 'seed' in text\n"
                           "print('ESCAPED')",
        "read-world-readable-file": f"text = open({str(a.public)!r}).read()\nassert text.startswith('secret-')\n"
                                    "print('ESCAPED', text)",
        "read-ssh-key": f"text = open({str(a.ssh_key)!r}).read()\nassert text.startswith('secret-')\n"
                        "print('ESCAPED', text)",
        "read-other-proc": f"import os\nassert {a.token!r} in open('/proc/{a.victim.pid}/cmdline').read()\n"
                           "print('ESCAPED')",
        "list-host-processes": "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
                               "assert len(pids) > 3, pids\nprint('ESCAPED')",
        "loopback-connect": f"import _socket\ns = _socket.socket()\ns.settimeout(2)\n"
                            f"s.connect(('127.0.0.1', {a.port}))\nprint('ESCAPED')",
        "fork-50": "import os, time\nn = 0\nfor _ in range(50):\n    if os.fork() == 0:\n        time.sleep(60)\n"
                   "        os._exit(0)\n    n += 1\nassert n == 50\nprint('ESCAPED')",
        "allocate-4gb": "x = bytearray(4 * 1024**3)\nx[::4096] = b'x' * len(range(0, len(x), 4096))\nprint('ESCAPED')",
        "busy-loop": "while True:\n    pass",
        "sleep": "import time\ntime.sleep(60)\nprint('ESCAPED')",
        "kill-parent": "import os, signal, time\nparent = os.getppid()\nos.kill(parent, signal.SIGKILL)\n"
                       "time.sleep(0.5)\nassert not os.path.exists(f'/proc/{parent}')\nprint('ESCAPED')",
        "kill-victim": f"import os, signal\nos.kill({a.victim.pid}, signal.SIGKILL)\nprint('ESCAPED')",
        "kill-everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\nimport time\ntime.sleep(0.5)\n"
                           "print('ESCAPED')",
        "many-small-files": "for i in range(100_000):\n    open(f'f{i}', 'w').write('x')\nprint('ESCAPED')",
        "many-bytes": "for i in range(64):\n    open(f'b{i}', 'wb').write(b'x' * 1_000_000)\nprint('ESCAPED')",
    }


@dataclass
class Outcome:
    status: str
    wall_s: float
    stdout: str
    stderr: str
    caller_alive: bool = True


def run_as_caller(source: str, limits: SandboxLimits = LIMITS) -> Outcome:
    result = run_python(source, limits)
    return Outcome(result.status, result.wall_s, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def nobody_package():
    """mmw.sandbox (and mmw.errors) where ``nobody`` can import them with the system interpreter."""
    root = Path(tempfile.mkdtemp(prefix="mmw-nobody-", dir="/tmp"))
    (root / "mmw").mkdir()
    (root / "mmw" / "__init__.py").write_text("")
    for name in ("errors.py", "sandbox.py"):
        shutil.copy(REPO / "mmw" / name, root / "mmw" / name)
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from dataclasses import asdict
from mmw.sandbox import SandboxLimits, isolation, run_python
limits = SandboxLimits(**json.loads(sys.argv[2]))
print(json.dumps({"isolation": isolation(limits.mode).describe(), "uid": __import__("os").getuid(),
                  **asdict(run_python(sys.stdin.read(), limits))}))
"""


def _nobody_can_run_the_sandbox() -> bool:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK):
        return False
    probe = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
             "unshare", "--map-root-user", "--mount", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _run_as_nobody(package: Path, source: str) -> Outcome:
    """The same call from a process of the host's ``nobody`` (a non-root caller: no setuid step, a user namespace
    for the mount); the caller's own death (kill-parent) counts as an escape."""
    limits = json.dumps(asdict(LIMITS))
    done = subprocess.run(["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
                           "/usr/bin/python3", "-I", "-c", DRIVER, str(package), limits],
                          input=source, capture_output=True, text=True, cwd=package, timeout=60)
    if done.returncode != 0:
        return Outcome("caller-died", 0.0, done.stdout, done.stderr, caller_alive=False)
    reply = json.loads(done.stdout)
    assert reply["uid"] == NOBODY.pw_uid and reply["isolation"].startswith("bubblewrap")
    return Outcome(reply["status"], reply["wall_s"], reply["stdout"], reply["stderr"])


def _leftovers(token: str) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if token in line and "ps -eo" not in line]


def escaped(name: str, outcome: Outcome, arena: Arena, before: int) -> list[str]:
    """Every sign that the attempt got through (empty: it failed, as it must)."""
    signs = []
    if outcome.status == "passed" or "ESCAPED" in outcome.stdout:
        signs.append(f"the program finished its attempt ({outcome.status}): {outcome.stdout[-200:]!r}")
    if not outcome.caller_alive:
        signs.append(f"the calling process died: {outcome.stderr[-300:]!r}")
    if (arena.outside / "escaped.txt").exists():
        signs.append("a file appeared outside the sandbox directory")
    if arena.shm.exists():
        signs.append("a file appeared in the host's /dev/shm")
    if len(arena.accepted) > before:
        signs.append("the loopback listener accepted a connection")
    if arena.victim.poll() is not None:
        signs.append("the victim process was killed")
    if outcome.wall_s > LIMITS.timeout_s + 5:
        signs.append(f"the call ran {outcome.wall_s:.1f} s, past the {LIMITS.timeout_s} s limit")
    if _leftovers("sys.addaudithook(_hook)"):
        signs.append(f"processes left behind: {_leftovers('sys.addaudithook(_hook)')}")
    if arena.secret in outcome.stdout + outcome.stderr:
        signs.append("the secret appeared in the program's output")
    return signs


def _names() -> list[str]:
    """The attempts' ids (for parametrize, before the arena exists)."""
    class Stub:
        pid = 1

    return list(attempts(Arena(Path("/o"), Path("/s"), Path("/p"), Path("/k"), "s", 1, [], Stub(), "t")))


@pytest.mark.parametrize("bypass", [False, True], ids=["hook-on", "hook-bypassed"])
@pytest.mark.parametrize("name", _names())
def test_escape_attempt_fails(name, bypass, arena):
    if isolation().mode != "bwrap":
        pytest.fail("the escape suite needs the default (bubblewrap) isolation")
    source = (BYPASS + PROVE_BYPASS if bypass else "") + attempts(arena)[name]
    before = len(arena.accepted)
    outcome = run_as_caller(source)
    assert escaped(name, outcome, arena, before) == [], outcome.stderr[-500:]
    if bypass:  # the bypass itself worked (so the OS layer, not the hook, stopped the attempt)
        assert "sandbox: socket" not in outcome.stderr


@pytest.mark.parametrize("name", _names())
def test_escape_attempt_fails_for_a_non_root_caller(name, arena, nobody_package):
    if not _nobody_can_run_the_sandbox():
        pytest.skip("this machine cannot switch to nobody or give it a user namespace")
    before = len(arena.accepted)
    outcome = _run_as_nobody(nobody_package, BYPASS + PROVE_BYPASS + attempts(arena)[name])
    assert escaped(name, outcome, arena, before) == [], outcome.stderr[-500:]


def test_the_hook_bypass_works_so_the_suite_tests_the_os_layer():
    """Without bubblewrap's view, the bypassed program would write wherever its user may: inside the sandbox the
    bypass succeeds (the hook no longer refuses a socket), and only the OS stops what follows."""
    hooked = run_python(PROVE_BYPASS, LIMITS)
    assert hooked.status == "failed" and "sandbox: socket.__new__ is not allowed" in hooked.stderr
    bypassed = run_python(BYPASS + PROVE_BYPASS + "print('hook off')", LIMITS)
    assert bypassed.passed and bypassed.stdout.strip() == "hook off"


def test_what_a_program_can_still_do_is_confined_to_its_own_run():
    """It may write inside its directory (up to the limits), read the standard library, and print anything,
    a forged pass marker included; nothing of it outlives the run."""
    result = run_python("import os, json\nopen('note', 'w').write('x' * 1000)\nprint(os.listdir('.'))\n"
                        "print('mmw-tests-passed-0000')", LIMITS)
    assert result.passed and "note" in result.stdout and result.stdout.rstrip().endswith("mmw-tests-passed-0000")
    assert not list(Path(tempfile.gettempdir()).glob("mmw-sandbox-*/box/note"))


def test_processes_outside_are_not_even_visible():
    """In its PID namespace the program sees only its own processes: the test's own pid does not exist there."""
    result = run_python(BYPASS + f"import os\nos.kill({os.getpid()}, 0)\nprint('ESCAPED')", LIMITS)
    assert result.status == "failed" and "ProcessLookupError" in result.stderr


@pytest.mark.parametrize("name", ["read-world-readable-file", "read-other-proc", "list-host-processes"])
def test_the_suite_sees_an_escape_where_the_os_boundary_is_missing(name, arena):
    """The detector can fail: under the explicit ``unsafe`` mode (no mount namespace, host /proc) these attempts
    get through once the hook is off, and the suite says so."""
    outcome = run_as_caller(BYPASS + attempts(arena)[name], replace(LIMITS, mode="unsafe"))
    assert escaped(name, outcome, arena, len(arena.accepted)) != []
