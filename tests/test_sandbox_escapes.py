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
import ctypes
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

import pyseccomp
import pytest

from mmw.quality.task_measures import humaneval_program, humaneval_tests
from mmw.sandbox import SandboxLimits, isolation, run_python, run_tests
from mmw.tasks import humaneval_problems

REPO = Path(__file__).resolve().parents[1]
#: The quality stage's limits (its defaults: 1 GiB, 16 MiB files, a 32 MiB / 256-file directory) with a shorter
#: wall clock, so the attempts that hang cost 3 s each.
LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=1024)
#: Prefix of the attempts that call the C library (after the bypass: the hook refuses ctypes).
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_SEARCH, KEYCTL_READ, KEY_SPEC_SESSION_KEYRING = 250, 1, 10, 11, -3
SYS_ADD_KEY = 248
KEY_NAME = b"mmw-escape-key"
#: In the command line of a daemon an attempt tries to leave behind.
DAEMON = "mmw-escape-daemon"
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
    keyring: bool = False  # the secret is also a key in a fresh session keyring of the test process


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
                listener.getsockname()[1], accepted, victim, token, _plant_key(secret))
    victim.kill()
    victim.wait()
    listener.close()
    shutil.rmtree(root, ignore_errors=True)


def _plant_key(secret: str) -> bool:
    """Join a fresh session keyring (which every process this test starts inherits, as a login session's would be)
    and put ``secret`` there as a user key; False where the kernel has no keyrings."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, f"mmw-escape-{uuid.uuid4().hex}".encode()) < 0:
        return False
    payload = secret.encode()
    return libc.syscall(SYS_ADD_KEY, b"user", KEY_NAME, payload, len(payload), KEY_SPEC_SESSION_KEYRING) > 0


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
        "kill-parent": "import os, signal, time\nparent = os.getppid()\n"
                       "assert parent > 0, 'no parent in view (PID 1)'\nos.kill(parent, signal.SIGKILL)\n"
                       "time.sleep(0.5)\nassert not os.path.exists(f'/proc/{parent}')\nprint('ESCAPED')",
        "kill-victim": f"import os, signal\nos.kill({a.victim.pid}, signal.SIGKILL)\nprint('ESCAPED')",
        "kill-everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\nimport time\ntime.sleep(0.5)\n"
                           "print('ESCAPED')",
        "many-small-files": "for i in range(100_000):\n    open(f'f{i}', 'w').write('x')\nprint('ESCAPED')",
        "many-bytes": "for i in range(64):\n    open(f'b{i}', 'wb').write(b'x' * 1_000_000)\nprint('ESCAPED')",
        # Take over the sandbox's PID 1 (the program's own process when it is PID 1; bubblewrap's init otherwise).
        "ptrace-pid-1": LIBC + "assert libc.ptrace(16, 1, 0, 0) == 0 or libc.ptrace(0x4206, 1, 0, 0) == 0, "
                               "ctypes.get_errno()\nos.waitpid(1, 0)\n"
                               "assert libc.ptrace(5, 1, ctypes.c_void_p(0x400000), 0) == 0\nprint('ESCAPED')",
        "ptrace-traceme-exec": LIBC + "assert libc.ptrace(0, 0, 0, 0) == 0, ctypes.get_errno()\nprint('ESCAPED')",
        "daemon-double-fork": "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                              f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 600 # {DAEMON}'])\n"
                              "    os._exit(0)\nprint('ESCAPED')",
        "outlive-by-clearing-pdeathsig": LIBC + "assert libc.prctl(1, 0, 0, 0, 0) == 0, ctypes.get_errno()\n"
                                         f"os.execv('/bin/sh', ['sh', '-c', 'sleep 600 # {DAEMON}'])",
        "fill-root-filesystem": "import os\nwrote = []\n"
                                "for d in ['/', '/etc', '/tmp', '/var/tmp', '/usr', '/dev', '/dev/shm', '/run', "
                                "'/home', '/root']:\n    try:\n"
                                "        with open(os.path.join(d, 'fill'), 'wb') as fh:\n"
                                "            fh.write(b'x' * 1_000_000)\n        wrote.append(d)\n"
                                "    except OSError:\n        pass\nassert wrote\nprint('ESCAPED', wrote)",
        "read-session-keyring": LIBC + f"key = libc.syscall({SYS_KEYCTL}, {KEYCTL_SEARCH}, "
                                       f"{KEY_SPEC_SESSION_KEYRING}, b'user', {KEY_NAME!r}, 0)\n"
                                       "assert key > 0, ctypes.get_errno()\n"
                                       "buf = ctypes.create_string_buffer(4096)\n"
                                       f"n = libc.syscall({SYS_KEYCTL}, {KEYCTL_READ}, key, buf, 4096)\n"
                                       "print('ESCAPED', buf.raw[:n].decode())",
        "nested-user-namespace": LIBC + "assert libc.unshare(0x10000000 | 0x00020000) == 0, ctypes.get_errno()\n"
                                        "print('ESCAPED')",
        "memfd-beyond-the-limit": "import os\nfds = [os.memfd_create('m') for _ in range(60)]\n"
                                  "for fd in fds:\n    os.write(fd, b'x' * (16 << 20))\n"
                                  "heap = bytearray(900 << 20)\nprint('ESCAPED')",
        "sysv-shm-beyond-the-limit": LIBC + "libc.shmat.restype = ctypes.c_void_p\nfor _ in range(6):\n"
                                            "    sid = libc.shmget(0, 256 << 20, 0o1600)\n"
                                            "    assert sid >= 0, ctypes.get_errno()\n"
                                            "    at = libc.shmat(sid, None, 0)\n"
                                            "    ctypes.memset(at, 1, 256 << 20)\n    libc.shmdt(ctypes.c_void_p(at))\n"
                                            "heap = bytearray(900 << 20)\nprint('ESCAPED')",
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
    shutil.copy(pyseccomp.__file__, root)  # the libseccomp binding the sandbox compiles its filter with
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from dataclasses import asdict
from mmw.sandbox import SandboxLimits, isolation, run_python, run_tests
limits = SandboxLimits(**json.loads(sys.argv[2]))
call = json.loads(sys.stdin.read())
result = run_tests(call["source"], call["tests"], call["entry"], limits) if call["tests"] else \\
    run_python(call["source"], limits)
print(json.dumps({"isolation": isolation(limits.mode).describe(), "uid": __import__("os").getuid(),
                  **asdict(result)}))
"""


def _nobody_can_run_the_sandbox() -> bool:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK):
        return False
    probe = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
             "unshare", "--map-root-user", "--mount", "true"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _run_as_nobody(package: Path, source: str, tests: str = "", entry: str = "") -> Outcome:
    """The same call from a process of the host's ``nobody`` (a non-root caller: no setuid step, a user namespace
    for the mount); the caller's own death (kill-parent) counts as an escape."""
    limits = json.dumps(asdict(LIMITS))
    done = subprocess.run(["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups",
                           "/usr/bin/python3", "-I", "-c", DRIVER, str(package), limits],
                          input=json.dumps({"source": source, "tests": tests, "entry": entry}),
                          capture_output=True, text=True, cwd=package, timeout=60)
    if done.returncode != 0:
        return Outcome("caller-died", 0.0, done.stdout, done.stderr, caller_alive=False)
    reply = json.loads(done.stdout)
    assert reply["uid"] == NOBODY.pw_uid and reply["isolation"].startswith("bubblewrap")
    return Outcome(reply["status"], reply["wall_s"], reply["stdout"], reply["stderr"])


def _leftovers(token: str) -> list[str]:
    """Live processes whose command line holds ``token`` (as "pid args")."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in listing.splitlines() if token in line and "ps -eo" not in line]


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
    for token in ("sys.addaudithook(_hook)", DAEMON):
        if left := _leftovers(token):
            signs.append(f"processes left behind: {left}")
            for line in left:  # so that the next attempt starts clean
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split()[0]), signal.SIGKILL)
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


@pytest.mark.parametrize("name", ["read-world-readable-file", "read-other-proc", "list-host-processes",
                                  "fill-root-filesystem", "read-session-keyring", "nested-user-namespace",
                                  "ptrace-traceme-exec"])
def test_the_suite_sees_an_escape_where_the_os_boundary_is_missing(name, arena):
    """The detector can fail: under the explicit ``unsafe`` mode (no mount namespace, host /proc) these attempts
    get through once the hook is off, and the suite says so."""
    outcome = run_as_caller(BYPASS + attempts(arena)[name], replace(LIMITS, mode="unsafe"))
    assert escaped(name, outcome, arena, len(arena.accepted)) != []


# --- Forged verdicts: the HumanEval harness runs check() outside the program's process -------------------------

#: A wrong solution of HumanEval/0 (has_close_elements) plus an attempt to pass anyway; each must score 0.
FORGERIES = {
    "print-marker-from-source": "import os\nprint(open('program.py').read()[-300:])\n"
                                "print('mmw-tests-passed-0000000000000000')\nos._exit(0)",
    "exit-zero-early": "import os\nos._exit(0)",
    "always-equal-object": "class Equal:\n    def __eq__(self, other):\n        return True\n"
                           "    def __ne__(self, other):\n        return False\n    def __bool__(self):\n        return True\n"
                           "def has_close_elements(*args):\n    return Equal()",
    "bool-subclass-equal": "class B(int):\n    def __eq__(self, other):\n        return True\n"
                           "def has_close_elements(*args):\n    return B(1)",
    "kill-the-harness": "import os, signal\nfor s in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):\n"
                        "    try:\n        os.kill(1, s)\n    except OSError:\n        pass",
    "write-harness-memory": "fh = open('/proc/1/mem', 'r+b')\nprint('ESCAPED')",
    "ptrace-the-harness": LIBC + "assert libc.ptrace(16, 1, 0, 0) == 0, ctypes.get_errno()\nprint('ESCAPED')",
    "read-the-tests": "import os\nfound = []\nfor fd in os.listdir('/proc/1/fd'):\n    try:\n"
                      "        found.append(open(f'/proc/1/fd/{fd}').read())\n    except OSError:\n        pass\n"
                      "assert any('def check' in f for f in found)\nprint('ESCAPED')",
}


def _forge(name: str) -> tuple[str, str, str]:
    """(program, tests, entry point) of a forgery against HumanEval/0, built as the quality stage builds them."""
    problem = humaneval_problems()[0]
    program = humaneval_program(problem, f"```python\n{BYPASS}{FORGERIES[name]}\n```")
    return program, humaneval_tests(problem), problem.entry_point


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_verdict_does_not_pass(name):
    result = run_tests(*_forge(name), LIMITS)
    assert not result.passed and "ESCAPED" not in result.stdout, (result.status, result.stderr[-300:])


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forged_verdict_does_not_pass_for_a_non_root_caller(name, nobody_package):
    if not _nobody_can_run_the_sandbox():
        pytest.skip("this machine cannot switch to nobody or give it a user namespace")
    program, tests, entry = _forge(name)
    outcome = _run_as_nobody(nobody_package, program, tests=tests, entry=entry)
    assert outcome.status != "passed" and "ESCAPED" not in outcome.stdout, outcome.stderr[-300:]


def test_the_harness_passes_a_correct_solution_and_sees_a_wrong_one():
    """The forgery test can fail: the same harness passes the canonical solution of HumanEval/0."""
    problem = humaneval_problems()[0]
    solution = ("    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
                "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n")
    assert run_tests(humaneval_program(problem, solution), humaneval_tests(problem), problem.entry_point,
                     LIMITS).passed
    assert not run_tests(*_forge("exit-zero-early"), LIMITS).passed
