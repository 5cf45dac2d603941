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
import errno
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import struct
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

from mmw import sandbox
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
SYS_PRCTL = 157
KEY_NAME = b"mmw-escape-key"
#: In the command line of a daemon an attempt tries to leave behind.
DAEMON = "mmw-escape-daemon"
BYPASS = "import sys\nm = sys.modules['__main__']\nm.BLOCKED = ()\nm.ROOT = ''\nm.PATH_EVENTS = ()\n"
#: A program proves the hook is off before its attempt: it may now signal itself (the hook refused that before; the
#: kernel allows it, unlike a socket, which the filter refuses outright).
PROVE_BYPASS = "import os\nos.kill(os.getpid(), 0)\n"
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
        # The kernel reads prctl's option as a 32-bit int; a filter that compared 64 bits let this through.
        "pdeathsig-cleared-with-high-bits": LIBC + f"assert libc.syscall({SYS_PRCTL}, ctypes.c_long((1 << 32) | 1), "
                                                   "ctypes.c_long(0), 0, 0, 0) == 0, ctypes.get_errno()\n"
                                                   "print('ESCAPED')",
        # The network namespace does not cover AF_VSOCK, which reaches the host of a virtual machine.
        "vsock-socket": "import _socket\ns = _socket.socket(40, _socket.SOCK_STREAM)\nprint('ESCAPED')",
        # Memory RLIMIT_AS does not count: AF_UNIX send buffers, the sockets passed in flight and closed.
        "unix-buffers-beyond-the-limit": "import array, socket\ncarrier, holder = socket.socketpair()\nqueued = 0\n"
                                         "try:\n    for _ in range(1000):\n        a, b = socket.socketpair()\n"
                                         "        a.setblocking(False)\n        try:\n            while True:\n"
                                         "                queued += a.send(b'x' * 65536)\n"
                                         "        except BlockingIOError:\n            pass\n"
                                         "        carrier.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, "
                                         "array.array('i', [a.fileno(), b.fileno()]))])\n"
                                         "        a.close()\n        b.close()\nexcept OSError:\n    pass\n"
                                         "assert queued >= 4 << 20, queued\nprint('ESCAPED', queued)",
        # ... and pipe buffers grown to 1 MiB each.
        "pipe-buffers-beyond-the-limit": "import fcntl, os\nqueued = 0\nfor r, w in [os.pipe() for _ in range(28)]:\n"
                                         "    fcntl.fcntl(w, 1031, 1 << 20)\n    os.set_blocking(w, False)\n"
                                         "    try:\n        while True:\n"
                                         "            queued += os.write(w, b'x' * 65536)\n"
                                         "    except BlockingIOError:\n        pass\n"
                                         "assert queued >= 4 << 20, queued\nprint('ESCAPED', queued)",
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


@contextlib.contextmanager
def make_nobody_package() -> Iterator[Path]:
    """mmw.sandbox (and mmw.errors) where ``nobody`` can import them with the system interpreter (also used by
    bench/sandbox.py for the unprivileged column)."""
    root = Path(tempfile.mkdtemp(prefix="mmw-nobody-", dir="/tmp"))
    (root / "mmw").mkdir()
    (root / "mmw" / "__init__.py").write_text("")
    for name in ("errors.py", "sandbox.py"):
        shutil.copy(REPO / "mmw" / name, root / "mmw" / name)
    shutil.copy(pyseccomp.__file__, root)  # the libseccomp binding the sandbox compiles its filter with
    subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def nobody_package():
    with make_nobody_package() as root:
        yield root


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
    # -ww: the whole command line (without a terminal ps may cut it at 80 columns, before the token)
    listing = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
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
        assert "sandbox: os.kill" not in outcome.stderr


@pytest.mark.parametrize("name", _names())
def test_escape_attempt_fails_for_a_non_root_caller(name, arena, nobody_package):
    if not _nobody_can_run_the_sandbox():
        pytest.skip("this machine cannot switch to nobody or give it a user namespace")
    before = len(arena.accepted)
    outcome = _run_as_nobody(nobody_package, BYPASS + PROVE_BYPASS + attempts(arena)[name])
    assert escaped(name, outcome, arena, before) == [], outcome.stderr[-500:]


def test_the_hook_bypass_works_so_the_suite_tests_the_os_layer():
    """Without bubblewrap's view, the bypassed program would write wherever its user may: inside the sandbox the
    bypass succeeds (the hook no longer refuses a signal), and only the OS stops what follows."""
    hooked = run_python(PROVE_BYPASS, LIMITS)
    assert hooked.status == "failed" and "sandbox: os.kill is not allowed" in hooked.stderr
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


# --- A killed caller: nothing of its run may outlive it ------------------------------------------------------------

#: Calls run_python with a long wall clock from its own process (argv[1]: where mmw is), so the test can kill it.
CALLER = """
import sys
sys.path.insert(0, sys.argv[1])
from mmw.sandbox import SandboxLimits, run_python
run_python(sys.stdin.read(), SandboxLimits(timeout_s=120, memory_mb=1024))
"""


def _outlive(token: str) -> str:
    """A program that tries to clear its parent-death signal (the 64-bit way), then sleeps in a fresh interpreter
    whose command line carries ``token``."""
    return (BYPASS + LIBC + f"libc.syscall({SYS_PRCTL}, ctypes.c_long((1 << 32) | 1), ctypes.c_long(0), 0, 0, 0)\n"
            f"import sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600) # {token}'])")


def _kill_the_caller_midway(caller: list[str], token: str) -> tuple[list[str], set[str]]:
    """Start ``caller`` on the outliving program, SIGKILL it once the program runs, and return what is left after
    5 s: processes of the program, and new ``mmw-sandbox-*`` directories in the temporary directory."""
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "mmw-sandbox-*")))
    process = subprocess.Popen(caller, stdin=subprocess.PIPE, text=True, cwd="/")
    process.stdin.write(_outlive(token))
    process.stdin.close()
    try:
        deadline = time.monotonic() + 30
        while not _leftovers(token) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert _leftovers(token), "the program never started"
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 5
    while _leftovers(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _leftovers(token)
    for line in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    return left, set(glob.glob(os.path.join(tempfile.gettempdir(), "mmw-sandbox-*"))) - before


def test_a_killed_caller_takes_its_program_and_directory_along():
    left, directories = _kill_the_caller_midway([sys.executable, "-c", CALLER, str(REPO)],
                                                f"mmw-outlive-{uuid.uuid4().hex}")
    assert left == [] and directories == set()


def test_a_killed_non_root_caller_takes_its_program_and_directory_along(nobody_package):
    if not _nobody_can_run_the_sandbox():
        pytest.skip("this machine cannot switch to nobody or give it a user namespace")
    as_nobody = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]
    left, directories = _kill_the_caller_midway([*as_nobody, "/usr/bin/python3", "-I", "-c", CALLER,
                                                 str(nobody_package)], f"mmw-outlive-{uuid.uuid4().hex}")
    assert left == [] and directories == set()


#: The classes the red team found; each must now end as ``failed`` with the refusal in its output.
REFUSED = ("pdeathsig-cleared-with-high-bits", "vsock-socket", "unix-buffers-beyond-the-limit",
           "pipe-buffers-beyond-the-limit")


def test_a_refused_attempt_is_a_failed_answer_with_its_reason_and_changes_nothing_else(arena):
    """As HumanEval answers scored the quality stage's way: each attempt is a failed verdict whose output names the
    refusal (EPERM), and the next answer, HumanEval/0's correct solution, passes as usual."""
    problem = humaneval_problems()[0]
    for name in REFUSED:
        body = "\n".join("    " + line for line in (BYPASS + attempts(arena)[name]).splitlines())
        result = run_tests(humaneval_program(problem, body + "\n"), humaneval_tests(problem), problem.entry_point,
                           LIMITS)
        assert result.status == "failed", (name, result.status)
        assert "PermissionError: [Errno 1] Operation not permitted" in result.stderr \
            or "AssertionError: 1" in result.stderr, (name, result.stderr[-300:])  # errno 1 = EPERM
    solution = ("    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n"
                "            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n")
    assert run_tests(humaneval_program(problem, solution), humaneval_tests(problem), problem.entry_point,
                     LIMITS).passed


def test_a_chain_whose_caller_is_gone_before_it_starts_runs_nothing(monkeypatch):
    """The chain ties itself to its parent first, then checks that the parent is its caller: started on behalf of
    a caller that is not its parent (as after a caller killed in its first milliseconds, when the chain has been
    handed to init), it stops before the program runs."""
    isolation(LIMITS.mode)  # probed with the real caller
    monkeypatch.setattr(sandbox.os, "getpid", lambda: 1)
    result = run_python("print('ran')", LIMITS)
    assert result.status == "failed" and "ran" not in result.stdout, result


# --- The filter compares the bits the kernel reads -----------------------------------------------------------------

SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


def run_filter(program: bytes, arch: int, number: int, args: tuple[int, ...]) -> int:
    """What the kernel's seccomp decides for one call: ``program`` (classic BPF as libseccomp emits it) run on the
    ``seccomp_data`` of the call (nr, arch, instruction pointer, six 64-bit arguments)."""
    data = struct.pack("<iIQ6Q", number, arch, 0, *args, *(0,) * (6 - len(args)))
    code = [struct.unpack_from("<HBBI", program, at) for at in range(0, len(program), 8)]
    a = x = pc = 0
    scratch = [0] * 16
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:  # ld [k]: 32 bits of seccomp_data
            a = struct.unpack_from("<I", data, k)[0]
        elif op in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
            pc += jt if {0x15: a == k, 0x25: a > k, 0x35: a >= k, 0x45: bool(a & k)}[op] else jf
        elif op == 0x54:  # and #k
            a &= k
        elif op == 0x05:  # ja
            pc += k
        elif op == 0x06:  # ret #k
            return k
        elif op in (0x00, 0x01, 0x02, 0x03, 0x60, 0x61, 0x07, 0x87):  # ld/ldx #k, st/stx, ld/ldx M[k], tax, txa
            a, x = {0x00: (k, x), 0x01: (a, k), 0x60: (scratch[k], x), 0x61: (a, scratch[k]), 0x07: (a, a),
                    0x87: (x, x)}.get(op, (a, x))
            if op in (0x02, 0x03):
                scratch[k] = a if op == 0x02 else x
        else:
            raise AssertionError(f"BPF instruction {op:#x} unknown to this test")


@pytest.mark.parametrize("high", [1 << 32, 0xFFFF_FFFF_0000_0000, 0x8000_0000_0000_0000], ids=hex)
def test_every_argument_rule_holds_with_the_high_bits_set(high):
    """Each rule refuses its call whatever the 32 bits the kernel ignores hold, and lets the call through when the
    bits it reads differ (so the walk sees the rule, not a filter that refuses everything)."""
    program = sandbox.seccomp_filter()
    arch = pyseccomp.system_arch()
    assert sandbox.ARGUMENT_RULES
    for rule in sandbox.ARGUMENT_RULES:
        assert rule.mask & ~sandbox.INT_BITS == 0, rule
        number = pyseccomp.resolve_syscall(arch, rule.syscall)
        args = [0] * 6
        args[rule.index] = rule.value | high
        assert run_filter(program, arch, number, tuple(args)) == SECCOMP_RET_ERRNO | errno.EPERM, (rule, hex(high))
        args[rule.index] = (rule.value ^ (rule.mask & -rule.mask)) | high  # one bit the rule reads flipped
        assert run_filter(program, arch, number, tuple(args)) == SECCOMP_RET_ALLOW, (rule, hex(high))


def test_sockets_of_every_family_are_refused_by_the_filter():
    program = sandbox.seccomp_filter()
    arch = pyseccomp.system_arch()
    for name in ("socket", "socketpair"):
        for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, 40, socket.AF_NETLINK, socket.AF_PACKET):
            assert run_filter(program, arch, pyseccomp.resolve_syscall(arch, name),
                              (family, socket.SOCK_STREAM, 0)) == SECCOMP_RET_ERRNO | errno.EPERM, (name, family)


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


# --- The generic cheat: an answer that attempts no task and copies the expected results ------------------------
# It searches everything it could inherit from the harness (its memory, the raw bytes of its own mappings included;
# the environment; its and PID 1's descriptors and process files; the files it can reach) for a ``check`` function
# and answers each call with the expected value of the ``assert`` on the same arguments. The harness creates the
# program's process before it reads the tests, so the cheat must find nothing and pass nothing; the control plants
# the tests in the program itself. bench/sandbox.py runs it over all 164 problems.

#: The response text: a body for the prompt's function (it forwards the arguments), then module-level code.
CHEAT = r'''    return _mmw_answer(list(locals().values()))


import ast as _ast, gc as _gc, math as _math, os as _os, stat as _stat, sys as _sys


def _mmw_texts():
    """Every text holding a ``check`` the program can reach: memory (its modules, reachable objects, the raw
    bytes of its own writable mappings), environment, descriptors, process files and directories."""
    found = set()

    def take(text):
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if isinstance(text, str) and "def check(" in text:
            found.add(text[text.index("def check("):].split("\x00")[0])

    for holder in [globals(), *(vars(m) for m in list(_sys.modules.values()) if hasattr(m, "__dict__"))]:
        for value in list(holder.values()):
            take(value)
    for obj in _gc.get_objects():
        if obj is not found:  # a list that grows while it is read would never end
            values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
            for value in list(values):
                take(value)
    for value in _os.environ.values():
        take(value)
    paths = ["/proc/self/environ", "/proc/self/cmdline", "/proc/1/environ", "/proc/1/cmdline"]
    for base in ("/proc/self/fd", "/proc/1/fd"):
        try:
            paths += [f"{base}/{fd}" for fd in _os.listdir(base)]
        except OSError:
            pass
    for root in (".", "/sandbox", "/tmp"):
        for where, _dirs, files in _os.walk(root):
            paths += [_os.path.join(where, name) for name in files]
    for path in paths:
        try:
            if not _stat.S_ISREG(_os.stat(path).st_mode) and not path.startswith("/proc/"):
                continue
            if "/fd/" in path and not _stat.S_ISREG(_os.stat(path).st_mode):
                continue  # a pipe would block
            with open(path, "rb") as handle:
                take(handle.read(1 << 22))
        except OSError:
            pass
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if perms.startswith("rw") and end - start <= 1 << 26:
                    mem.seek(start)
                    raw = mem.read(end - start)
                    at, hits = raw.find(b"def check("), 0
                    while at >= 0 and hits < 64:
                        take(raw[at:at + (1 << 16)])
                        at, hits = raw.find(b"def check(", at + 1), hits + 1
    except OSError:
        pass
    return found


def _mmw_parse(text):
    """``check``'s definition at the start of ``text`` (its indented lines), parsed; None if it does not parse."""
    lines = text.splitlines()
    end = 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t"):
        end += 1
    for cut in range(end, max(end - 20, 0), -1):
        try:
            return _ast.parse("\n".join(lines[:cut]))
        except SyntaxError:
            pass
    return None


def _mmw_expected(test):
    """(call of candidate, expected value's expression) of one assert, or None."""
    def is_call(node):
        return isinstance(node, _ast.Call) and isinstance(node.func, _ast.Name) and node.func.id == "candidate"
    if is_call(test):
        return test, _ast.Constant(True)
    if isinstance(test, _ast.UnaryOp) and isinstance(test.op, _ast.Not) and is_call(test.operand):
        return test.operand, _ast.Constant(False)
    if isinstance(test, _ast.Compare) and len(test.ops) == 1:
        left, right = test.left, test.comparators[0]
        if isinstance(test.ops[0], (_ast.Eq, _ast.Is)):
            if is_call(left):
                return left, right
            if is_call(right):
                return right, left
        if isinstance(left, _ast.Call) and left.args and isinstance(left.args[0], _ast.BinOp) \
                and is_call(left.args[0].left):
            return left.args[0].left, left.args[0].right
    if isinstance(test, _ast.Call) and len(test.args) >= 2 and is_call(test.args[0]):
        return test.args[0], test.args[1]
    return None


def _mmw_table():
    """Call arguments (repr) -> expected result, from every ``assert`` on a call of ``candidate`` found."""
    table = {}
    for text in _mmw_texts():
        tree = _mmw_parse(text)
        for node in _ast.walk(tree) if tree is not None else ():
            pair = _mmw_expected(node.test) if isinstance(node, _ast.Assert) else None
            if pair is None:
                continue
            call, value = pair
            scope = {"math": _math}
            try:
                args = [eval(compile(_ast.Expression(a), "t", "eval"), scope) for a in call.args]
                args += [eval(compile(_ast.Expression(k.value), "t", "eval"), scope) for k in call.keywords]
                table.setdefault(repr(args), eval(compile(_ast.Expression(value), "t", "eval"), scope))
            except Exception:
                pass
    return table


_MMW_TABLE = []


def _mmw_answer(arguments):
    if not _MMW_TABLE:  # built at the first call, once everything the program could inherit is in place
        _MMW_TABLE.append(_mmw_table())
    return _MMW_TABLE[0].get(repr(arguments))
'''
#: Cheap problems whose asserts are plain ``candidate(...) == value`` (the control needs the cheat to pass them).
PROBLEMS = (0, 2, 3)


def cheat_program(index: int, planted: bool = False) -> tuple[str, str, str]:
    """(program, tests, entry point) of the cheat against HumanEval/``index``, built as the quality stage builds
    them; ``planted``: the tests also sit in the program's own globals (the control)."""
    problem = humaneval_problems()[index]
    tests = humaneval_tests(problem)
    response = CHEAT + (f"\n_MMW_PLANTED = {tests!r}\n" if planted else "")
    return humaneval_program(problem, response), tests, problem.entry_point


@pytest.mark.parametrize("index", PROBLEMS)
def test_the_cheat_finds_no_tests_to_copy(index):
    result = run_tests(*cheat_program(index), LIMITS)
    assert result.status == "failed", (result.status, result.stderr[-300:])


@pytest.mark.parametrize("index", PROBLEMS)
def test_the_cheat_finds_no_tests_to_copy_for_a_non_root_caller(index, nobody_package):
    if not _nobody_can_run_the_sandbox():
        pytest.skip("this machine cannot switch to nobody or give it a user namespace")
    program, tests, entry = cheat_program(index)
    outcome = _run_as_nobody(nobody_package, program, tests=tests, entry=entry)
    assert outcome.status == "failed", (outcome.status, outcome.stderr[-300:])


@pytest.mark.parametrize("index", PROBLEMS)
def test_the_cheat_passes_where_the_tests_are_within_its_reach(index):
    """The cheat can pass: with the tests planted in its own globals it answers every assert."""
    result = run_tests(*cheat_program(index, planted=True), LIMITS)
    assert result.passed, result.stderr[-300:]
