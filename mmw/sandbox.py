"""Run untrusted generated Python (e.g. HumanEval completions) in an isolated subprocess.

One call = one fresh process with a fresh, private directory; the verdict is its exit status. Whatever the program
does (hang, fork, allocate, write or read outside its directory, open a socket, signal other processes, crash the
interpreter), the caller gets a ``SandboxResult`` back and never an exception: bad generated code is a failed test,
not a failed stage.

The boundary is the operating system, not the program's cooperation (``MODES``, chosen by ``quality.sandbox``):

* ``bwrap`` (the default): bubblewrap (Debian package ``bubblewrap``) starts the program in new user, mount, PID,
  network, IPC and UTS namespaces, with a private ``/proc``, a minimal read-only ``/dev``, ``/usr`` (and the
  interpreter's prefix) read-only, and nothing else of the host: no repository, no home directory, no ``/etc``,
  no ``/tmp``. Its only writable place is ``/sandbox``, a private tmpfs of at most ``disk_mb`` MiB and
  ``max_files`` files, mounted by ``unshare --mount`` just before bubblewrap starts and gone when the program
  ends. The program runs as ``nobody`` (as root, the whole chain drops to the host's ``nobody`` first), with
  ``no_new_privs``, no capabilities, its own session, and bubblewrap dies with the caller.
* ``unsafe``: an explicit opt-in for machines without bubblewrap (recorded in reports/quality.json): the older
  layers only (``unshare`` network and PID namespaces and ``nobody`` where they work, rlimits, the audit hook).
  The program can then read every file its user can read. Without the opt-in, a machine where bubblewrap does
  not work refuses to run generated code (:class:`mmw.errors.SpecError` naming ``quality.sandbox``).

In both modes, inside: rlimits set by the runner on itself (``RLIMIT_AS`` memory, ``RLIMIT_CPU``,
``RLIMIT_FSIZE`` largest file, ``RLIMIT_NPROC = 0`` no new process or thread, ``RLIMIT_NOFILE``,
``RLIMIT_CORE = 0``), then an audit hook (PEP 578) that refuses sockets, subprocesses, ``fork``/``exec``,
signals, ``ctypes`` and writes outside the directory with a readable error. The hook is defence in depth: the
program can switch it off (its globals are reachable), and the namespaces and rlimits are what hold then. Outside:
a wall-clock timeout, after which the whole process group is SIGKILLed.

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

from mmw.errors import SpecError

#: Values of ``quality.sandbox``: OS isolation through bubblewrap, or the explicit opt-in to weaker layers.
MODES = ("bwrap", "unsafe")
SETTING = "quality.sandbox"
INSTALL = "apt-get install bubblewrap (as root), or your distribution's bubblewrap package"

#: The runner: executed by the sandboxed interpreter with argv = [memory_bytes, cpu_s, file_bytes]. It limits
#: itself, installs the audit hook, then runs ``program.py`` from its working directory as ``__main__``.
RUNNER = r"""
import os, resource, sys
def _limit(which, value):
    resource.setrlimit(which, (value, value))
memory, cpu, fsize = (int(v) for v in sys.argv[1:4])
_limit(resource.RLIMIT_AS, memory)
_limit(resource.RLIMIT_CPU, cpu)
_limit(resource.RLIMIT_FSIZE, fsize)
_limit(resource.RLIMIT_CORE, 0)
_limit(resource.RLIMIT_NOFILE, 64)
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
"""

#: What an ordinary standard-library program imports; the interpreter probe checks they load in the sandbox (as
#: ``nobody`` and, under bubblewrap, with only ``/usr`` and the interpreter's prefix visible).
PROBE = "import math, re, collections, itertools, functools, hashlib, heapq, string, typing, fractions, resource"
NOBODY = "nobody"
OUTPUT_TAIL = 2000
#: Where the program's directory appears inside bubblewrap.
INSIDE = "/sandbox"
#: Top-level host paths that may be symlinks into /usr (merged-/usr systems) or directories the loader needs.
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits: wall time (s), address space (MiB), largest file written (MiB), and (under bubblewrap)
    the directory's total size (MiB) and number of files; ``mode`` is ``quality.sandbox`` (one of ``MODES``).

    The CPU-time limit is the wall time rounded up: a busy loop is stopped by both, a sleeping one by the wall
    clock only.
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    disk_mb: int = 32
    max_files: int = 256
    mode: str = "bwrap"


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
    """How this machine isolates programs (see the module docstring). ``mode`` ``bwrap``: ``prefix`` is the
    bubblewrap executable (the chain around it is built per run by :func:`command`); ``unsafe``: the ``unshare``
    prefix (empty when namespaces are unavailable). ``as_nobody``: the program runs as the host's ``nobody``."""

    prefix: tuple[str, ...]
    python: str
    as_nobody: bool
    mode: str = "unsafe"

    def describe(self) -> str:
        # The interpreter by its real path: a venv's python is a symlink inside the checkout, and the description
        # lands in quality.json, which must not change with where the repository was cloned.
        interpreter = f"interpreter {os.path.realpath(self.python)}"
        if self.mode == "bwrap":
            return ("bubblewrap: user, mount, pid, network, ipc, uts namespaces, private /proc, read-only /usr, "
                    "private tmpfs directory (size and file-count limits), user nobody, no_new_privs, "
                    f"rlimits AS/CPU/FSIZE/NOFILE/NPROC, audit hook, {interpreter}")
        network = "network namespace" if "--net" in self.prefix else "audit hook only (no network namespace)"
        user = "user nobody" if self.as_nobody else "the caller's user"
        return f"UNSAFE ({SETTING}: unsafe): {network}, " \
               f"{'pid namespace' if '--pid' in self.prefix else 'no pid namespace'}, {user}, " \
               f"rlimits AS/CPU/FSIZE/NOFILE/NPROC, audit hook, {interpreter}"


def _run_quiet(command: list[str], cwd: str = "/", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=cwd, env=env)


def _works(command: list[str]) -> bool:
    try:
        return _run_quiet(command).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _interpreters() -> list[str]:
    """Candidate interpreters: this one first, then the system's (readable by every user)."""
    found = [sys.executable]
    for name in ("/usr/bin/python3", shutil.which("python3") or ""):
        if name and os.path.exists(name) and name not in found:
            found.append(name)
    return found


def _environment(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}


def _system_binds(python: str) -> list[str]:
    """bubblewrap arguments for the read-only system view: /usr, the merged-/usr links (or directories), the
    loader cache, and the interpreter's prefix when it lives outside /usr."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = Path(os.path.realpath(python)).parents[1]
    if not str(prefix).startswith("/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args


def command(where: Isolation, workdir: Path, limits: SandboxLimits, argv: list[str]) -> list[str]:
    """The full command that runs ``python argv`` for ``where`` with ``workdir`` (holding ``program.py`` and the
    empty mount point ``box``) as the program's directory."""
    if where.mode != "bwrap":
        return [*where.prefix, where.python, *argv]
    box = workdir / "box"
    bwrap = [
        where.prefix[0], "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        *_system_binds(where.python), "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--bind", str(box), INSIDE, "--ro-bind", str(workdir / "program.py"), f"{INSIDE}/program.py",
        "--chdir", INSIDE, "--uid", str(pwd.getpwnam(NOBODY).pw_uid), "--gid", str(pwd.getpwnam(NOBODY).pw_gid),
        where.python, *argv,
    ]
    # A private mount namespace (a user namespace first when not root) in which a tmpfs with a size and an inode
    # limit becomes the program's directory; bubblewrap itself cannot set an inode limit.
    drop = ["setpriv", "--no-new-privs"]
    if os.geteuid() == 0:
        nobody = pwd.getpwnam(NOBODY)
        drop += [f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
        namespace = ["unshare", "--mount", "--propagation", "private"]
    else:
        namespace = ["unshare", "--map-root-user", "--mount", "--propagation", "private"]
    options = f"size={limits.disk_mb}m,nr_inodes={limits.max_files + 2},mode=0777"
    script = 'mount -t tmpfs -o "$1" mmw-sandbox "$0" && shift && exec "$@"'
    return [*namespace, "--", "/bin/sh", "-c", script, str(box), options, *drop, *bwrap]


def _prepare(where: Isolation, source: str) -> Path:
    """A fresh directory with ``program.py`` (and the mount point ``box``), readable by the sandbox's user."""
    workdir = Path(tempfile.mkdtemp(prefix="mmw-sandbox-"))
    (workdir / "program.py").write_text(source, encoding="utf-8")
    (workdir / "box").mkdir()
    if where.as_nobody:
        nobody = pwd.getpwnam(NOBODY)
        for path in (workdir, workdir / "program.py", workdir / "box"):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
    return workdir


def probe_bwrap(bwrap: str | None) -> Isolation:
    """The bubblewrap isolation with the first interpreter that runs ``PROBE`` in it; a :class:`SpecError`
    naming ``quality.sandbox`` when bubblewrap is missing or does not work here."""
    if not bwrap:
        raise SpecError(SETTING, f"bubblewrap (bwrap) is not installed, so generated code cannot be isolated; "
                                 f"{INSTALL}, or set {SETTING}: unsafe to run it without OS isolation", MODES)
    problem = "no interpreter could be started"
    # As root, the chain drops to the host's nobody before bubblewrap, which then needs unprivileged user
    # namespaces. Where the kernel forbids them this refuses rather than run bubblewrap as root: the program would
    # then be host root outside its namespaces, which RLIMIT_NPROC does not limit (50 forks got through).
    for python in _interpreters():
        where = Isolation((bwrap,), python, os.geteuid() == 0, "bwrap")
        workdir = _prepare(where, PROBE)
        try:
            done = _run_quiet(command(where, workdir, SandboxLimits(), ["-I", "-S", "program.py"]),
                              cwd=str(workdir), env=_environment(INSIDE))
            if done.returncode == 0:
                return where
            problem = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        except (OSError, subprocess.SubprocessError) as error:
            problem = f"{type(error).__name__}: {error}"
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    raise SpecError(SETTING, f"bubblewrap ({bwrap}) does not work on this machine ({problem}), so generated code "
                             f"cannot be isolated; allow user namespaces or run as root, or set {SETTING}: unsafe "
                             "to run it without OS isolation", MODES)


def _probe_unsafe() -> Isolation:
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


@functools.cache
def isolation(mode: str = "bwrap") -> Isolation:
    """Probe (once per process and mode) how programs are isolated here; ``mode`` is ``quality.sandbox``. Call it
    before heavy work: in ``bwrap`` mode it raises :class:`SpecError` where bubblewrap is unavailable."""
    if mode not in MODES:
        raise SpecError(SETTING, f"unknown sandbox mode {mode!r}", MODES)
    return probe_bwrap(shutil.which("bwrap")) if mode == "bwrap" else _probe_unsafe()


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``source`` as a program in the sandbox; never raises for anything the program does (only
    :func:`isolation`'s refusal, before any program runs, is an exception)."""
    where = isolation(limits.mode)
    started = time.perf_counter()
    workdir = _prepare(where, source)
    try:
        cpu_s = max(1, int(-(-limits.timeout_s // 1)))
        argv = ["-I", "-S", "-c", RUNNER, str(limits.memory_mb << 20), str(cpu_s), str(limits.file_mb << 20)]
        home = INSIDE if where.mode == "bwrap" else str(workdir)
        # Output goes to unnamed files under the file-size limit, so a program printing forever cannot fill the
        # parent's memory through a pipe, and the program cannot reach or replace them.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                process = subprocess.Popen(command(where, workdir, limits, argv), cwd=workdir,
                                           stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                           start_new_session=True, env=_environment(home))
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
