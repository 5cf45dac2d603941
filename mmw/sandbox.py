"""Run untrusted generated Python (e.g. HumanEval completions) in a limited subprocess.

One call = one fresh process in a fresh temporary directory; the verdict is its exit status. Whatever the program
does (hang, fork, allocate, write outside its directory, open a socket, crash the interpreter), the caller gets a
``SandboxResult`` back and never an exception: bad generated code is a failed test, not a failed stage.

Layers, from the outside in (docs/VALIDATION.md, "Sandbox", says what each does and does not stop):

1. Wall-clock timeout in the parent: the process runs in its own session and the whole group is SIGKILLed.
2. Namespaces (``unshare`` from util-linux, when it works here; probed once per process):
   ``--net`` (a network namespace with only a downed loopback: every connect fails), ``--pid --fork
   --kill-child`` (when the sandbox's init dies, the kernel kills every process it left behind). As root the
   program also drops to ``nobody`` (``--setuid/--setgid``), because root ignores ``RLIMIT_NPROC`` and may write
   anywhere; without root, a user namespace (``--map-root-user``) is used if the kernel allows it.
3. Resource limits set by the runner on itself before the program starts: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``,
   ``RLIMIT_FSIZE`` (largest file), ``RLIMIT_NPROC = 0`` (no new process or thread: the fork-bomb guard),
   ``RLIMIT_CORE = 0``.
4. An audit hook (PEP 578) installed before the program's code is compiled: it refuses sockets, subprocesses,
   ``fork``/``exec``/``spawn``/``system``, signals to other processes, ``ctypes``, and any write, rename, delete,
   link or mode change outside the temporary directory. Audit hooks are a tripwire, not a security boundary
   (native code can bypass them); layers 1-3 are what hold when it is bypassed.

The interpreter runs with ``-I -S`` (isolated: no environment variables, no user site, no site-packages), so the
program sees the standard library only, as HumanEval expects.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: The runner: executed by the sandboxed interpreter with argv = [memory_bytes, cpu_s, file_bytes]. It limits
#: itself, installs the audit hook, then runs ``program.py`` from its working directory as ``__main__``.
RUNNER = r'''
import os, resource, sys
def _limit(which, value):
    resource.setrlimit(which, (value, value))
memory, cpu, fsize = (int(v) for v in sys.argv[1:4])
_limit(resource.RLIMIT_AS, memory)
_limit(resource.RLIMIT_CPU, cpu)
_limit(resource.RLIMIT_FSIZE, fsize)
_limit(resource.RLIMIT_CORE, 0)
_limit(resource.RLIMIT_NPROC, 0)
ROOT = os.getcwd()
BLOCKED = ("socket.", "subprocess.", "os.fork", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.kill",
           "os.killpg", "os.pidfd_open", "pty.", "ctypes.", "signal.pthread_kill", "_posixsubprocess.")
PATH_EVENTS = ("os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.link", "os.symlink",
               "os.truncate", "os.chmod", "os.chown", "os.utime", "os.setxattr", "os.removexattr", "shutil.")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_join, _norm, _getcwd, _fsdecode, _sep = os.path.join, os.path.normpath, os.getcwd, os.fsdecode, os.sep
def _inside(path):
    if isinstance(path, int):
        return True  # an already open descriptor; opening it was checked
    full = _norm(_join(_getcwd(), _fsdecode(path)))
    return full == ROOT or full.startswith(ROOT + _sep)
def _hook(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
        if writing and path is not None and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the sandbox directory")
    elif event.startswith(PATH_EVENTS):
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg):
                raise PermissionError(f"sandbox: {event} on {arg!r} outside the sandbox directory")
with open("program.py", encoding="utf-8") as _fh:
    _source = _fh.read()
sys.addaudithook(_hook)
del _fh
exec(compile(_source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''

#: What an ordinary standard-library program imports; the interpreter probe checks they load under the sandbox's
#: user (as root, ``nobody`` may not reach an interpreter installed under /root).
PROBE = "import math, re, collections, itertools, functools, hashlib, heapq, string, typing, fractions, resource"
NOBODY = "nobody"
OUTPUT_TAIL = 2000


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits: wall time (s), address space (MiB), largest file written (MiB).

    The CPU-time limit is the wall time rounded up: a busy loop is stopped by both, a sleeping one by the wall
    clock only.
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16


@dataclass(frozen=True)
class SandboxResult:
    """``status``: ``passed`` (exit 0), ``failed`` (non-zero exit or killed by a limit), ``timeout`` (wall clock),
    ``error`` (the sandbox itself could not start the program). ``stdout``/``stderr``: their last 2,000
    characters. Exit status 0 alone is not a test verdict (the program may ``exit(0)`` early): callers that run
    tests also check a marker printed after them (:mod:`mmw.quality.task_measures`)."""

    status: str
    returncode: int | None
    wall_s: float
    stdout: str
    stderr: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Isolation:
    """How this machine isolates programs (see the module docstring): the ``unshare`` prefix (empty when
    namespaces are unavailable), the interpreter, and whether the program runs as ``nobody``."""

    prefix: tuple[str, ...]
    python: str
    as_nobody: bool

    def describe(self) -> str:
        # The interpreter by its real path: a venv's python is a symlink inside the checkout, and the description
        # lands in quality.json, which must not change with where the repository was cloned.
        network = "network namespace" if "--net" in self.prefix else "audit hook only (no network namespace)"
        user = "user nobody" if self.as_nobody else "the caller's user"
        return f"{network}, {'pid namespace' if '--pid' in self.prefix else 'no pid namespace'}, {user}, " \
               f"rlimits AS/CPU/FSIZE/NPROC, audit hook, interpreter {os.path.realpath(self.python)}"


def _works(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30, cwd="/").returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _interpreters() -> list[str]:
    """Candidate interpreters: this one first, then the system's (readable by every user)."""
    found = [sys.executable]
    for name in ("/usr/bin/python3", shutil.which("python3") or ""):
        if name and os.path.exists(name) and name not in found:
            found.append(name)
    return found


@functools.cache
def isolation() -> Isolation:
    """Probe (once per process) the strongest isolation that works on this machine."""
    unshare = shutil.which("unshare")
    prefixes: list[tuple[tuple[str, ...], bool]] = []
    if unshare and os.geteuid() == 0:
        nobody = pwd.getpwnam(NOBODY)
        prefixes.append(((unshare, "--net", "--pid", "--fork", "--kill-child", "--setgid", str(nobody.pw_gid),
                          "--setuid", str(nobody.pw_uid)), True))
        prefixes.append(((unshare, "--net", "--pid", "--fork", "--kill-child"), False))
    elif unshare:
        prefixes.append(((unshare, "--map-root-user", "--net", "--pid", "--fork", "--kill-child"), False))
    prefixes.append(((), False))
    for prefix, as_nobody in prefixes:
        for python in _interpreters():
            if _works([*prefix, python, "-I", "-S", "-c", PROBE]):
                return Isolation(prefix, python, as_nobody)
    return Isolation((), sys.executable, False)


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``source`` as a program in the sandbox; never raises for anything the program does."""
    where = isolation()
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="mmw-sandbox-"))
    try:
        (workdir / "program.py").write_text(source, encoding="utf-8")
        if where.as_nobody:
            nobody = pwd.getpwnam(NOBODY)
            for path in (workdir, workdir / "program.py"):
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
        cpu_s = max(1, int(-(-limits.timeout_s // 1)))
        command = [*where.prefix, where.python, "-I", "-S", "-c", RUNNER, str(limits.memory_mb << 20), str(cpu_s),
                   str(limits.file_mb << 20)]
        # Output goes to files under the file-size limit, so a program printing forever cannot fill the
        # parent's memory through a pipe; they are read back through the parent's descriptors, so a program that
        # replaces the files cannot forge its output.
        with open(workdir / ".stdout", "w+b") as out, open(workdir / ".stderr", "w+b") as err:
            try:
                process = subprocess.Popen(command, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                           start_new_session=True, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
            except OSError as error:
                return SandboxResult("error", None, time.perf_counter() - started, "", f"cannot start: {error}")
            try:
                returncode = process.wait(timeout=limits.timeout_s)
                status = "passed" if returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                returncode, status = None, "timeout"
            finally:
                _kill_group(process)
            stdout, stderr = (_tail(handle) for handle in (out, err))
        return SandboxResult(status, returncode, time.perf_counter() - started, stdout, stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _tail(handle: BinaryIO) -> str:
    """The last ``OUTPUT_TAIL`` bytes written to ``handle``, decoded."""
    handle.seek(0, os.SEEK_END)
    handle.seek(max(0, handle.tell() - OUTPUT_TAIL))
    return handle.read().decode("utf-8", "replace")


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the program's whole process group (it is the leader of its own session) and reap the leader."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
