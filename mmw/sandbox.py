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
  ``max_files`` files, mounted by ``unshare --mount`` over ``/mnt`` of that private mount namespace just before
  bubblewrap starts, and gone when the program ends; the program's source reaches it through a descriptor, so a
  run leaves no name on the host, even when its caller is killed. The program runs as ``nobody`` (as root, the
  whole chain drops to the host's ``nobody`` first), with ``no_new_privs``, no capabilities, its own session. It
  is the namespace's PID 1 and bubblewrap dies with the caller: the parent-death signal, which the filter keeps
  the program from clearing, kills PID 1 from outside and the kernel the rest of the namespace with it (and a
  runner whose caller died before that signal was set ends at once, seeing its lifeline pipe closed). The root
  is read-only, nested user namespaces are off, a seccomp filter (``DENIED_SYSCALLS``, ``ARGUMENT_RULES``: no
  sockets of any family) is loaded before it starts, and after the run nothing may be left in its PID namespace.
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

import contextlib
import errno
import functools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from mmw.errors import SpecError

try:  # libseccomp's own Python binding (Debian python3-seccomp) where the interpreter has it
    import seccomp
except ImportError:  # the same API over ctypes and the system's libseccomp (PyPI pyseccomp)
    try:
        import pyseccomp as seccomp
    except ImportError:
        seccomp = None

#: Values of ``quality.sandbox``: OS isolation through bubblewrap, or the explicit opt-in to weaker layers.
MODES = ("bwrap", "unsafe")
SETTING = "quality.sandbox"
INSTALL = "apt-get install bubblewrap (as root), or your distribution's bubblewrap package"

#: The runner: executed by the sandboxed interpreter with argv = [memory_bytes, cpu_s, file_bytes, ..., lifeline_fd].
#: It ends at once if its caller is gone, limits itself, installs the audit hook, then runs ``program.py`` from its
#: working directory as ``__main__``.
PRELUDE = r"""
import os, resource, select, sys
# The caller holds the only write end of the lifeline (argv[-1]): it reads as ready (end of file) once the caller
# is gone. The parent-death signal that ties this process to the caller was set before this line runs; if the
# caller died before that, it never comes, and this check ends the run instead.
_lifeline = int(sys.argv[-1])
if select.select([_lifeline], [], [], 0)[0]:
    os._exit(1)
os.close(_lifeline)
def _limit(which, value):
    resource.setrlimit(which, (value, value))
memory, cpu, fsize = (int(v) for v in sys.argv[1:4])
def _limit_all():
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
def _program():
    with open("program.py", encoding="utf-8") as fh:
        source = fh.read()
    sys.addaudithook(_hook)
    names = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(source, "program.py", "exec"), names)
    return names
"""

#: The runner of :func:`run_python` (argv = [memory_bytes, cpu_s, file_bytes, lifeline_fd]): it limits itself,
#: installs the audit hook, then runs ``program.py`` from its working directory as ``__main__``.
RUNNER = PRELUDE + r"""
_limit_all()
_program()
"""

#: The runner of :func:`run_tests` (argv = [memory_bytes, cpu_s, file_bytes, tests_fd, lifeline_fd]). PID 1 is
#: the trusted harness. It makes itself non-dumpable (so its own user cannot open /proc/1/mem or /proc/1/fd) and
#: forks the program's process *before* it reads anything of the problem: the program's process closes the tests'
#: descriptor first thing, so no memory, descriptor, file or environment it starts from holds the tests, the
#: expected results or even the entry point (a fork after reading would copy them with the heap, and deleting the
#: variable would not help). Only then the harness reads the entry point (first line) and the tests from the
#: descriptor and runs ``check(candidate)`` with a ``candidate`` that forwards each call to the program's process
#: over a pipe only the two of them hold. Calls go as marshal; results come back as their repr, read with
#: ``ast.literal_eval``: only literals of builtin types cross, so a result cannot carry an ``__eq__`` of its own.
#: The verdict is the harness's exit status, not a frame: the program's process can make it fail (crash, hang,
#: answer wrongly) but cannot make it exit 0.
TEST_RUNNER = PRELUDE + r"""
import ast, ctypes, marshal, struct
tests_fd = int(sys.argv[4])
if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 0
    raise SystemExit("sandbox: the harness could not make itself non-dumpable")
calls_r, calls_w = os.pipe()
answers_r, answers_w = os.pipe()
def _send(fd, data):
    data = struct.pack("<Q", len(data)) + data
    while data:
        data = data[os.write(fd, data):]
def _receive(fd):
    def exactly(n):
        parts = []
        while n:
            part = os.read(fd, min(n, 1 << 20))
            if not part:
                raise EOFError("the program's process ended")
            parts.append(part)
            n -= len(part)
        return b"".join(parts)
    return exactly(struct.unpack("<Q", exactly(8))[0])
if os.fork() == 0:
    os.close(tests_fd); os.close(calls_w); os.close(answers_r)
    _limit_all()
    try:
        names = _program()
        while True:
            entry, args, kwargs = marshal.loads(_receive(calls_r))
            try:
                reply = b"=" + repr(names[entry](*args, **kwargs)).encode("utf-8", "surrogatepass")
            except Exception as error:  # its message is the reason the verdict records (the stderr tail)
                reply = b"!" + f"{type(error).__name__}: {error}"[:500].encode("utf-8", "surrogatepass")
            _send(answers_w, reply)
    except EOFError:
        os._exit(0)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
os.close(calls_r); os.close(answers_w)
with os.fdopen(tests_fd, encoding="utf-8") as fh:
    entry, _, tests = fh.read().partition("\n")
_limit_all()
class CandidateError(Exception):
    pass
def candidate(*args, **kwargs):
    _send(calls_w, marshal.dumps((entry, args, kwargs)))
    reply = _receive(answers_r)
    if reply[:1] == b"!":
        raise CandidateError(reply[1:].decode("utf-8", "replace"))
    return ast.literal_eval(reply[1:].decode("utf-8", "surrogatepass"))
try:
    names = {"__name__": "__harness__"}
    exec(compile(tests, "tests.py", "exec"), names)
    names[entry] = candidate
    names["check"](candidate)
except BaseException:
    import traceback
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
sys.stdout.flush()
os._exit(0)
"""

#: System calls generated code never needs, refused (EPERM) by the seccomp filter bubblewrap loads before it
#: starts the program: tracing and reading other processes, the kernel keyrings, new namespaces and mounts,
#: kernel-side programs and modules, memory outside the address-space limit (memfd, System V shared memory and
#: message queues, POSIX message queues, and every socket: AF_UNIX send buffers, with sockets passed in flight,
#: hold memory that RLIMIT_AS never counts), other socket families the network namespace does not cover
#: (AF_VSOCK reaches the host of a virtual machine), io_uring (whose operations bypass seccomp), execution-domain
#: tricks, and machine-wide switches.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "keyctl", "add_key", "request_key",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "open_by_handle_at", "name_to_handle_at",
    "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "memfd_create", "memfd_secret", "shmget", "msgget", "semget", "mq_open",
    "socket", "socketpair",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "personality", "modify_ldt", "iopl", "ioperm",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog", "uselib", "vhangup",
)
#: ``clone`` flags that would make a new namespace (refused like ``unshare``).
CLONE_NAMESPACES = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                    0x40000000)
PR_SET_PDEATHSIG = 1
F_SETPIPE_SZ = 1031
#: The bits of a system-call argument the kernel reads for a C ``int`` (and for ``clone``'s flags, which it cuts
#: with ``lower_32_bits``). seccomp sees the whole 64-bit register: a rule that compared all 64 bits would let
#: ``prctl(PR_SET_PDEATHSIG | 1 << 32, 0)`` through, which the kernel executes as ``PR_SET_PDEATHSIG``.
INT_BITS = 0xFFFF_FFFF


@dataclass(frozen=True)
class ArgumentRule:
    """A refusal (EPERM) of ``syscall`` when its argument ``index`` has the bits ``mask`` equal to ``value``;
    ``mask`` lies within ``INT_BITS``, so the filter compares exactly the bits the kernel reads."""

    syscall: str
    index: int
    mask: int
    value: int


#: Every rule on an argument: namespace flags of ``clone``; clearing (or changing) the parent-death signal, which
#: would let the program outlive a killed bubblewrap; growing a pipe beyond its default 64 KiB (pipe buffers are
#: memory RLIMIT_AS does not count; 64 descriptors of default pipes hold at most 2 MiB).
ARGUMENT_RULES = (
    *(ArgumentRule("clone", 0, flag, flag) for flag in CLONE_NAMESPACES),
    ArgumentRule("prctl", 0, INT_BITS, PR_SET_PDEATHSIG),
    ArgumentRule("fcntl", 1, INT_BITS, F_SETPIPE_SZ),
)
#: What an ordinary standard-library program imports; the interpreter probe checks they load in the sandbox (as
#: ``nobody`` and, under bubblewrap, with only ``/usr`` and the interpreter's prefix visible).
PROBE = "import math, re, collections, itertools, functools, hashlib, heapq, string, typing, fractions, resource"
NOBODY = "nobody"
OUTPUT_TAIL = 2000
#: Where the program's directory appears inside bubblewrap.
INSIDE = "/sandbox"
#: Directories one of which the chain covers with the program's tmpfs inside its private mount namespace.
MOUNT_POINTS = ("/mnt", "/srv", "/media")
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
            return ("bubblewrap: user, mount, pid, network, ipc, uts namespaces, no nested user namespaces, "
                    "program as PID 1, private /proc, read-only root and /usr, private tmpfs directory (size and "
                    "file-count limits), user nobody, no_new_privs, seccomp filter, "
                    f"rlimits AS/CPU/FSIZE/NOFILE/NPROC, audit hook, leftover check, {interpreter}")
        network = "network namespace" if "--net" in self.prefix else "audit hook only (no network namespace)"
        user = "user nobody" if self.as_nobody else "the caller's user"
        return f"UNSAFE ({SETTING}: unsafe): {network}, " \
               f"{'pid namespace' if '--pid' in self.prefix else 'no pid namespace'}, {user}, " \
               f"rlimits AS/CPU/FSIZE/NOFILE/NPROC, audit hook, {interpreter}"


@functools.cache
def seccomp_filter() -> bytes:
    """The compiled BPF program (libseccomp) that refuses ``DENIED_SYSCALLS``, the calls ``ARGUMENT_RULES``
    describe and ``clone3`` (ENOSYS, so the C library falls back to ``clone``, whose flags the filter can see,
    while ``clone3``'s sit in memory it cannot read). Raises :class:`SpecError` naming
    ``quality.sandbox`` when no libseccomp binding is importable: no filter, no run."""
    if seccomp is None:
        raise SpecError(SETTING, "no libseccomp binding (pyseccomp or python3-seccomp) is importable, so the "
                                 "sandbox's system-call filter cannot be built; pip install pyseccomp (the "
                                 f"project's extras do), or set {SETTING}: unsafe", MODES)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    refuse = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        rules.add_rule(refuse, name)
    for rule in ARGUMENT_RULES:
        rules.add_rule(refuse, rule.syscall, seccomp.Arg(rule.index, seccomp.MASKED_EQ, rule.mask, rule.value))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as compiled:
        rules.export_bpf(compiled)
        compiled.seek(0)
        return compiled.read()


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


@dataclass(frozen=True)
class Descriptors:
    """Descriptors a run hands down the chain to bubblewrap: the seccomp program to load (``seccomp``), where
    bubblewrap writes its child's host pid and namespaces (``info``), the program's source (``program``, which
    bubblewrap copies into ``/sandbox/program.py``), and extra ones for the program (the tests)."""

    seccomp: int
    info: int
    program: int
    extra: tuple[int, ...] = ()

    @property
    def all(self) -> tuple[int, ...]:
        return (self.seccomp, self.info, self.program, *self.extra)


def mount_point(python: str) -> str:
    """Where the chain's private mount namespace mounts the program's tmpfs before bubblewrap binds it as
    ``/sandbox``: the first of ``MOUNT_POINTS`` that is a directory and holds neither ``/usr`` nor the interpreter.
    It is covered only inside that namespace, so a run creates nothing on the host that a killed caller could
    leave behind."""
    prefix = Path(os.path.realpath(python)).parents[1]
    for path in MOUNT_POINTS:
        if os.path.isdir(path) and not os.path.islink(path) and not prefix.is_relative_to(path):
            return path
    raise SpecError(SETTING, f"none of {', '.join(MOUNT_POINTS)} is a directory here, so the sandbox has no place "
                             f"to mount its private directory; create /mnt, or set {SETTING}: unsafe", MODES)


def command(where: Isolation, limits: SandboxLimits, argv: list[str], fds: Descriptors | None = None,
            caller: int = 0) -> list[str]:
    """The full command that runs ``python argv`` for ``where``; under bubblewrap (``fds`` and ``caller``, the pid
    of the process that starts it, required) the program's directory is a fresh tmpfs holding ``program.py`` from
    ``fds.program``, in the ``unsafe`` mode the caller's working directory."""
    if where.mode != "bwrap":
        return [*where.prefix, where.python, *argv]
    if fds is None:
        raise ValueError("bubblewrap needs the seccomp, info and program descriptors")
    box = mount_point(where.python)
    # The program is the namespace's PID 1 (no bubblewrap init it could trace and take over; when it exits the
    # kernel kills everything it left, and bubblewrap, which dies with the caller, takes it along through the
    # parent-death signal the filter keeps it from clearing); the root is read-only after the mounts, so /sandbox
    # is the only place it can write; no further user namespaces; the seccomp program is loaded just before exec.
    bwrap = [
        where.prefix[0], "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--die-with-parent",
        "--new-session", "--cap-drop", "ALL",
        *_system_binds(where.python), "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--bind", box, INSIDE, "--ro-bind-data", str(fds.program), f"{INSIDE}/program.py",
        "--remount-ro", "/", "--seccomp", str(fds.seccomp), "--info-fd", str(fds.info),
        "--chdir", INSIDE, "--uid", str(pwd.getpwnam(NOBODY).pw_uid), "--gid", str(pwd.getpwnam(NOBODY).pw_gid),
        where.python, *argv,
    ]
    # A private mount namespace (a user namespace first when not root) in which a tmpfs with a size and an inode
    # limit becomes the program's directory; bubblewrap itself cannot set an inode limit.
    # The chain is one process (each step execs the next) whose parent is the caller. It dies with the caller from
    # its first step on: setpriv sets the parent-death signal before anything else runs, the shell checks that
    # the caller was still its parent after that (so a caller killed before it had no chance to leave a program
    # running), and the second setpriv sets the signal again after its change of user, which clears it.
    drop = ["setpriv", "--no-new-privs", "--pdeathsig", "KILL"]
    if os.geteuid() == 0:
        nobody = pwd.getpwnam(NOBODY)
        drop += [f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
        namespace = ["unshare", "--mount", "--propagation", "private"]
    else:
        namespace = ["unshare", "--map-root-user", "--mount", "--propagation", "private"]
    options = f"size={limits.disk_mb}m,nr_inodes={limits.max_files + 2},mode=0777"
    script = '[ "$PPID" = "$2" ] && mount -t tmpfs -o "$1" mmw-sandbox "$0" && shift 2 && exec "$@"'
    return ["setpriv", "--pdeathsig", "KILL", "--", *namespace, "--", "/bin/sh", "-c", script, box, options,
            str(caller), *drop, *bwrap]


def _prepare(where: Isolation, source: str) -> Path:
    """The ``unsafe`` mode's fresh directory with ``program.py``, readable by the sandbox's user."""
    workdir = Path(tempfile.mkdtemp(prefix="mmw-sandbox-"))
    (workdir / "program.py").write_text(source, encoding="utf-8")
    if where.as_nobody:
        nobody = pwd.getpwnam(NOBODY)
        for path in (workdir, workdir / "program.py"):
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
    return workdir


def probe_bwrap(bwrap: str | None) -> Isolation:
    """The bubblewrap isolation with the first interpreter that runs ``PROBE`` in it; a :class:`SpecError`
    naming ``quality.sandbox`` when bubblewrap or the seccomp filter is missing or does not work here."""
    if not bwrap:
        raise SpecError(SETTING, f"bubblewrap (bwrap) is not installed, so generated code cannot be isolated; "
                                 f"{INSTALL}, or set {SETTING}: unsafe to run it without OS isolation", MODES)
    seccomp_filter()
    problem = "no interpreter could be started"
    # As root, the chain drops to the host's nobody before bubblewrap, which then needs unprivileged user
    # namespaces. Where the kernel forbids them this refuses rather than run bubblewrap as root: the program would
    # then be host root outside its namespaces, which RLIMIT_NPROC does not limit (50 forks got through).
    for python in _interpreters():
        where = Isolation((bwrap,), python, os.geteuid() == 0, "bwrap")
        done = _execute(where, PROBE, SandboxLimits(timeout_s=30), ["-I", "-S", "program.py"])
        if done.passed:
            return where
        problem = (done.stderr.strip().splitlines() or [f"status {done.status}"])[-1]
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
    return _execute(where, source, limits, ["-I", "-S", "-c", RUNNER, *_limit_argv(limits)])


def run_tests(program: str, tests: str, entry_point: str,
              limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``check(entry_point)`` of the trusted ``tests`` source against ``program`` (see ``TEST_RUNNER``):
    ``passed`` iff the harness, a process the program cannot write to, trace or signal to exit 0, saw every test
    pass. The entry point and the tests reach the harness through an unnamed file's descriptor that the program's
    process closes before it runs anything and the harness reads only after that process exists. Never raises for
    anything the program does."""
    where = isolation(limits.mode)
    with _unnamed(f"{entry_point}\n{tests}") as handed:
        argv = ["-I", "-S", "-c", TEST_RUNNER, *_limit_argv(limits), str(handed)]
        return _execute(where, program, limits, argv, (handed,))


@contextlib.contextmanager
def _unnamed(text: str) -> Iterator[int]:
    """A descriptor, at offset 0, of an unnamed file holding ``text`` (no path anyone could open)."""
    with tempfile.TemporaryFile() as handle:
        handle.write(text.encode("utf-8", "surrogatepass"))
        handle.flush()
        handle.seek(0)
        yield handle.fileno()


def _limit_argv(limits: SandboxLimits) -> list[str]:
    cpu_s = max(1, int(-(-limits.timeout_s // 1)))
    return [str(limits.memory_mb << 20), str(cpu_s), str(limits.file_mb << 20)]


def _execute(where: Isolation, source: str, limits: SandboxLimits, argv: list[str],
             extra_fds: tuple[int, ...] = ()) -> SandboxResult:
    """Run ``python argv`` on ``source`` under ``where``; under bubblewrap, afterwards, kill whatever of the run is
    still alive in its PID namespace and record such a run as ``failed``."""
    started = time.perf_counter()
    # The lifeline: the read end goes to the runner, the write end stays here (not inherited), open until the end.
    lifeline, lifeline_write = os.pipe()
    try:
        return _execute_with(where, source, limits, [*argv, str(lifeline)], (*extra_fds, lifeline), started)
    finally:
        os.close(lifeline)
        os.close(lifeline_write)


def _execute_with(where: Isolation, source: str, limits: SandboxLimits, argv: list[str], extra_fds: tuple[int, ...],
                  started: float) -> SandboxResult:
    if where.mode != "bwrap":
        workdir = _prepare(where, source)
        try:
            return _launch(where, limits, command(where, limits, argv), str(workdir), extra_fds, (), None, started)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    # Under bubblewrap nothing of the run has a name on the host: the source, the filter and bubblewrap's report
    # travel as descriptors, the directory is a tmpfs of the chain's own mount namespace.
    pipes: list[int] = []
    try:
        seccomp_read, seccomp_write = os.pipe()
        info_read, info_write = os.pipe()
        pipes += [seccomp_read, seccomp_write, info_read, info_write]
        os.write(seccomp_write, seccomp_filter())
        os.close(seccomp_write)
        pipes.remove(seccomp_write)
        os.set_blocking(info_read, False)
        with _unnamed(source) as program:
            fds = Descriptors(seccomp_read, info_write, program, extra_fds)
            chain = command(where, limits, argv, fds, os.getpid())
            handed_over = (seccomp_read, info_write)
            for fd in handed_over:  # _launch closes them once bubblewrap holds them
                pipes.remove(fd)
            return _launch(where, limits, chain, "/", fds.all, handed_over, info_read, started)
    finally:
        for fd in pipes:
            os.close(fd)


def _launch(where: Isolation, limits: SandboxLimits, argv: list[str], cwd: str, fds: tuple[int, ...],
            close_after_start: tuple[int, ...], info_read: int | None, started: float) -> SandboxResult:
    """Start ``argv`` in its own session with ``fds``, close ``close_after_start`` (the ends only the chain may
    hold: bubblewrap's report reaches EOF when it and its child end), wait at most ``timeout_s``, SIGKILL the
    process group, and (under bubblewrap, ``info_read`` given) check the run's PID namespace is empty."""
    home = INSIDE if where.mode == "bwrap" else cwd
    # Output goes to unnamed files under the file-size limit, so a program printing forever cannot fill the
    # parent's memory through a pipe, and the program cannot reach or replace them.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                       start_new_session=True, env=_environment(home), pass_fds=fds)
        except OSError as error:
            return SandboxResult("error", None, time.perf_counter() - started, "", f"cannot start: {error}")
        finally:
            for fd in close_after_start:
                os.close(fd)
        try:
            returncode = process.wait(timeout=limits.timeout_s)
            status = "passed" if returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            returncode, status = None, "timeout"
        finally:
            _kill_group(process)
        note = ""
        if info_read is not None:
            status, note = _end_of_run(status, _read_info(info_read))
        stdout, stderr = (_tail(handle) for handle in (out, err))
    return SandboxResult(status, returncode, time.perf_counter() - started, stdout, stderr + note)


def _read_info(fd: int) -> dict:
    """bubblewrap's ``--info-fd`` JSON (its child's host pid and namespaces); empty when it never got that far."""
    try:
        return json.loads(os.read(fd, 1 << 16) or b"{}")
    except (OSError, ValueError):
        return {}


def processes_in(pid_namespace: int) -> list[int]:
    """Host pids of the live processes in ``pid_namespace`` (by their ``/proc/PID/ns/pid`` link); zombies, which
    run nothing and hold nothing but their pid until the host's init reaps them, do not count."""
    link, found = f"pid:[{pid_namespace}]", []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == link:
                    with open(f"/proc/{entry.name}/stat", "rb") as stat:
                        if stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X"):
                            found.append(int(entry.name))
            except (OSError, IndexError):
                pass  # gone meanwhile
    return found


def _end_of_run(status: str, info: dict) -> tuple[str, str]:
    """The run's status after the check that nothing of it is left: leftovers in its PID namespace are killed and
    make the run ``failed`` (a ``timeout`` stays one); a run bubblewrap never reported on cannot have passed."""
    namespace = info.get("pid-namespace")
    if namespace is None:
        return ("error", "\nsandbox: bubblewrap reported no namespace") if status == "passed" else (status, "")
    left = processes_in(namespace)
    if status == "timeout":  # the parent-death signal is on its way to PID 1; make sure
        left = []
    deadline = time.monotonic() + 5.0
    while remaining := processes_in(namespace):
        for pid in remaining:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return "error", f"\nsandbox: {len(remaining)} process(es) of the run could not be killed"
        time.sleep(0.01)
    if left:
        return "failed", f"\nsandbox: {len(left)} process(es) of the run were left after it ended; killed"
    return status, ""


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
