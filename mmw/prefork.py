"""Warm stage processes: a server that imports the heavy libraries once and forks one process per stage command.

``dvc repro`` starts every stage as a process of its own, and each process that generates, detects, rates or scores
first imports torch, transformers, numba and scipy: 6-9 s a stage on the 2-core CPU machine, ~40 s of a tiny
pipeline's ~95 s and ~25 s of a one-scheme ``dvc exp run``'s ~60 s. With ``MMW_PREFORK=1`` in the environment of
``dvc repro`` / ``dvc exp run`` / ``mmw sweep run``, a stage command (``mmw generate baseline``, ...) instead asks a
server to fork a copy of itself that has those libraries imported and nothing of mmw, and becomes that copy's
stand-in: the copy runs the command with the caller's arguments, working directory, environment, standard streams
and every other open file descriptor (so the locks a sweep passes down are held by the stage, as before); the
caller forwards the signals it gets and ends with the copy's exit status (a copy killed by a signal kills the
caller with the same signal). A caller that dies takes its copy with it (the server kills the copy's process
group when the caller's connection closes).

Why it cannot change a number: the copy imports every module of mmw, stages and kernels fresh, from the caller's
``sys.path``; the libraries the server imported are the ones a fresh process imports, from the same interpreter and
``sys.path`` (one server per interpreter, path, and value of every variable those libraries read while they load:
``OMP_*``, ``MKL_*``, ``NUMBA_*``, ``PYTHON*``...). The server refuses to serve if importing them started a thread
(forking a process with running threads is unsafe) and then every caller runs the command itself. A run with a
``PYTHONPATH`` (per-process hooks such as the tests' tracers) or outside the stage commands never uses it.
tests/test_prefork.py checks a whole pipeline through it against plain processes, byte for byte.

Written by hand: the standard library's ``multiprocessing.forkserver`` forks Python functions for its own pool,
not commands for an outside caller with its descriptors; no maintained package does the latter for Python.

The server lives in ``$XDG_RUNTIME_DIR`` (else the temporary folder), ``mmw-prefork-<uid>/<key>.sock``, in a
session of its own, and exits after ``MMW_PREFORK_IDLE`` seconds (default 300) without a caller. It never holds the
key: ``MMW_KEY`` is removed from its environment (a copy gets the caller's environment with the request).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: The stage commands (mmw.cli) a copy runs; every other command runs in the caller's own process. Library state
#: set up before the fork is the one thing a copy cannot reset: torch sets its thread count at the fork, where a
#: fresh process sets it at its first parallel call, so the detect stage (numba's OpenMP kernels, which change that
#: count) asks torch first (mmw.provenance.settle_threads) and computes and records the same counts either way.
#: tests/test_prefork.py compares every stage's outputs and records with plain processes byte for byte.
STAGE_COMMANDS = frozenset({"code", "key", "low-entropy-inputs", "prompts", "generate", "perturb", "detect", "rate",
                            "quality", "aggregate"})
#: What the server imports: the libraries the stages import, heaviest first. A missing one is skipped.
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "transformers.generation.utils",
           "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
           "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
           "tokenizers", "numba", "numba.core.typed_passes", "scipy.stats", "scipy.special", "scipy.optimize",
           "numpy", "yaml", "typer", "pydantic", "filelock",
           # The aggregate stage's figures: ~1 s of its ~2.5 s copy on the 2-core VM. Matplotlib reads its rc file
           # at import (the working folder's matplotlibrc first), so a caller in a folder with one runs itself.
           "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg")
#: Libraries whose thread pools start when they load and do not survive a fork (a copy's first parallel call would
#: wait forever on threads it does not have): never preloaded; a server that finds one loaded refuses to serve.
#: (BLAS pools, which numpy and torch start, re-create their threads after a fork.)
FORK_UNSAFE = ("polars", "pyarrow")
#: Variables that the preloaded libraries (or the interpreter) read while they load: a server serves only callers
#: whose values of these equal its own.
_LOAD_TIME_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "BLIS_", "NUMBA_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_",
                       "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "POLARS_", "PYTHON", "LD_",
                       "KMP_", "GOMP_", "VECLIB_", "TRITON_", "XLA_", "TF_", "MPL", "MATPLOTLIB", "HOME",
                       "XDG_CONFIG_HOME", "XDG_CACHE_HOME")
#: Programs that must never see the key.
_SECRET = ("MMW_KEY",)
_MAX_MESSAGE = 1 << 20
#: Descriptors one message can pass (the kernel's SCM_MAX_FD is 253); a caller holding more runs the command itself.
_MAX_DESCRIPTORS = 250


def enabled(argv: list[str]) -> bool:
    """Whether this ``mmw`` command should run through the server: ``MMW_PREFORK=1``, a stage command, no
    ``PYTHONPATH`` (per-process hooks), and not already inside a copy."""
    return (os.environ.get("MMW_PREFORK") == "1" and len(argv) > 1 and argv[1] in STAGE_COMMANDS
            and not os.environ.get("PYTHONPATH") and not os.environ.get("_MMW_PREFORK_COPY")
            and not os.path.exists("matplotlibrc")  # read by matplotlib's import, which the server did elsewhere
            and hasattr(socket, "send_fds") and hasattr(os, "fork"))


def _server_key() -> str:
    """One server per interpreter, module search path, load-time variables and version of this file."""
    loaded = sorted((k, v) for k, v in os.environ.items() if k.startswith(_LOAD_TIME_PREFIXES))
    stamp = Path(__file__).stat().st_mtime_ns
    blob = json.dumps([sys.executable, sys.path[1:], loaded, stamp, sys.version])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _folder() -> Path:
    root = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(root) / f"mmw-prefork-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


# ------------------------------------------------------------------------------------------------ the caller


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def _start_server(path: Path) -> socket.socket | None:
    """Start the server for ``path`` (one caller at a time, under a lock) and connect; None if it cannot serve."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(path)
        if conn is not None:
            return conn
        path.unlink(missing_ok=True)
        refused = path.with_suffix(".refused")
        if refused.exists():
            return None
        env = {k: v for k, v in os.environ.items() if k not in _SECRET}
        with open(path.with_suffix(".log"), "ab") as log:
            server = subprocess.Popen([sys.executable, "-m", "mmw.prefork", str(path)], env=env, cwd="/",
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                      close_fds=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and server.poll() is None:
            conn = _connect(path)
            if conn is not None:
                return conn
            time.sleep(0.05)
        return None


def _open_descriptors(skip: int) -> list[int]:
    """The caller's open descriptors that a child process would inherit (0-2 always first)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == skip:
            continue
        try:
            inheritable = os.get_inheritable(fd) or fd <= 2
        except OSError:  # the listing's own descriptor, closed since
            continue
        if inheritable:
            found.append(fd)
    return sorted(found)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _read_message(conn: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def forward(argv: list[str], entry: str) -> int | None:
    """Run ``argv`` (``mmw <stage> ...``) in a copy forked by the server, through ``entry`` (``module:function``,
    the caller's own entry point, imported fresh in the copy); return its exit code, or None when no server can
    serve (the caller then runs the command itself). Ends this process by the copy's signal if one killed it."""
    path = _folder() / f"{_server_key()}.sock"
    conn = _connect(path) or _start_server(path)
    if conn is None:
        return None
    with conn:
        fds = _open_descriptors(conn.fileno())
        if len(fds) > _MAX_DESCRIPTORS:
            return None
        request = {"argv": argv, "entry": entry, "cwd": os.getcwd(), "env": dict(os.environ), "path": sys.path, "fds": fds,
                   "umask": _umask(), "priority": os.getpriority(os.PRIO_PROCESS, 0)}
        try:
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
            started = _read_message(conn)
        except OSError:  # the server went away before it forked: nothing ran, so the caller runs the command
            return None
        if started is None:
            return None
        pid = started["pid"]

        def relay(signum: int, _frame: Any) -> None:
            try:
                os.killpg(pid, signum)  # the copy leads its own process group, as the caller's group would hold it
            except ProcessLookupError:
                pass

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                       signal.SIGUSR2):
            signal.signal(signum, relay)
        ended = _read_message(conn)
    if ended is None:
        print("error: the mmw prefork server ended before the stage did", file=sys.stderr)
        return 1
    status = ended["status"]
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(1)  # the signal ends this process; a caught one falls through to the code below
        return 128 + signum
    return os.waitstatus_to_exitcode(status)


# ------------------------------------------------------------------------------------------------ the server


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    data = b""
    fds: list[int] = []
    while not data.endswith(b"\n"):
        chunk, got, _flags, _addr = socket.recv_fds(conn, 65536, 256)
        fds.extend(got)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None
        data += chunk
        if len(data) > _MAX_MESSAGE:
            raise ValueError("request too large")
    return json.loads(data), fds


class _Hidden:
    """The preloaded top-level packages, out of ``sys.modules`` until the copy imports one (a meta path finder
    that hands back the loaded module): ``sys.modules`` then names what the command imported, as in a process of
    its own (mmw.provenance records the threads of the numeric libraries a stage imported)."""

    def __init__(self, names: list[str]) -> None:
        self.modules = {name: sys.modules.pop(name) for name in names if name in sys.modules}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        # Asked without loading too (importlib.util.find_spec: "is it installed?"), so the module leaves the
        # hiding place only when the import system loads it (create_module).
        module = self.modules.get(name)
        if module is None:
            return None
        import copy

        spec = copy.copy(module.__spec__)
        spec.loader = _Loaded(module, self.modules)
        return spec


class _Loaded:
    """Loader of a module that is already loaded: returns it, runs nothing, and gives it back its own spec."""

    def __init__(self, module: Any, hidden: dict[str, Any]) -> None:
        self.module, self.spec, self.hidden = module, module.__spec__, hidden

    def create_module(self, spec: Any) -> Any:
        self.hidden.pop(spec.name, None)
        return self.module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = self.spec


def _run_copy(request: dict[str, Any], received: list[int], preloaded: list[str]) -> None:
    """In the forked copy: become the caller's process (descriptors, folder, environment, path) and run the
    command; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                       signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # The caller's descriptors at their own numbers: first out of the way (above every target), then in place.
        targets = request["fds"]
        floor = max([*targets, *received]) + 1
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in received]
        for fd in received:
            os.close(fd)
        for fd in range(3):
            if fd not in targets:
                os.close(fd)
        for src, dst in zip(moved, targets):
            os.dup2(src, dst, inheritable=True)
            os.close(src)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        try:
            os.setpriority(os.PRIO_PROCESS, 0, request["priority"])
        except OSError:  # a caller nicer than the server: raising it back needs a privilege
            pass
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["_MMW_PREFORK_COPY"] = "1"
        sys.path[:] = request["path"]
        sys.argv = list(request["argv"])
        for name in [m for m in sys.modules if m.split(".")[0] in ("mmw", "stages", "kernels")]:
            del sys.modules[name]
        import importlib

        importlib.invalidate_caches()
        sys.meta_path.insert(0, _Hidden(preloaded))  # type: ignore[arg-type]
        sys.stdin = open(0, closefd=False) if 0 in targets else sys.stdin  # noqa: SIM115 - the process's own
        sys.stdout = open(1, "w", closefd=False) if 1 in targets else sys.stdout  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, buffering=1) if 2 in targets else sys.stderr  # noqa: SIM115
        module, function = request["entry"].split(":")
        try:
            getattr(importlib.import_module(module), function)()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, (int, type(None))):
                print(done.code, file=sys.stderr)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - reported as an uncaught exception is
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm() -> None:
    """Set-up that every copy would otherwise repeat and that computes nothing: numba's CPU typing and target
    contexts, which a process builds at its first compiled call or cached-kernel load (~0.5 s of each detect
    stage's copy on the 2-core VM); the kernels themselves still load in the copy, from the caller's path."""
    try:
        from numba.core.registry import cpu_target

        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
    except Exception as err:  # noqa: BLE001 - a copy then builds them itself, as a fresh process does
        print(f"prefork: numba's contexts not built: {type(err).__name__}: {err}", flush=True)


def serve(path: Path, idle: float) -> int:
    """Import the libraries, then fork a copy per request until ``idle`` seconds pass with nothing to do."""
    os.chdir("/")
    before = set(sys.modules)
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception as err:  # noqa: BLE001 - a library the stages may not need: they import it themselves
            print(f"prefork: not preloaded {name}: {type(err).__name__}: {err}", flush=True)
    _warm()
    preloaded = sorted(name for name in set(sys.modules) - before
                       if "." not in name and name not in sys.stdlib_module_names)
    unsafe = [name for name in FORK_UNSAFE if name in sys.modules]
    if threading.active_count() > 1 or unsafe:
        why = f"{threading.active_count()} Python threads, {unsafe or 'no'} fork-unsafe pools after the imports"
        path.with_suffix(".refused").write_text(why + "\n")
        print(f"prefork: refusing to serve: {why}", flush=True)
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    listener.bind(str(partial))
    listener.listen(64)
    os.replace(partial, path)
    own = os.stat(path).st_ino
    print(f"prefork: serving {path} (pid {os.getpid()})", flush=True)
    copies: dict[int, socket.socket] = {}  # pid -> its caller's connection
    started: dict[int, tuple[float, list[str]]] = {}  # pid -> when, and which command
    last = time.monotonic()
    try:
        while copies or time.monotonic() - last < idle:
            watched = [listener, *copies.values()]
            readable, _, _ = select.select(watched, [], [], 0.05)
            for ready in readable:
                if ready is listener:
                    conn, _ = listener.accept()
                    try:
                        received = _receive(conn)
                    except (OSError, ValueError) as err:  # a broken or oversized request: that caller runs it
                        print(f"prefork: request refused: {type(err).__name__}: {err}", flush=True)
                        received = None
                    if received is None:
                        conn.close()
                        continue
                    request, fds = received
                    pid = os.fork()
                    if pid == 0:
                        listener.close()
                        for other in copies.values():
                            other.close()
                        conn.close()
                        _run_copy(request, fds, preloaded)
                    for fd in fds:
                        os.close(fd)
                    try:
                        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                    except OSError:  # the caller died since its request: its closed connection ends the copy below
                        pass
                    copies[pid] = conn
                    started[pid] = (time.monotonic(), request["argv"][1:3])
                else:  # a caller's connection: it only ever closes (the caller died) before its copy ends
                    pid = next(p for p, c in copies.items() if c is ready)
                    # Logged before the kill, not after the reap: whoever sees the copy's pid gone then finds the
                    # line (written after the reap, it could still be missing for a moment).
                    print(f"prefork: copy {pid} killed: its caller is gone", flush=True)
                    # The copy itself too: one caught right after the fork has not made its process group yet
                    # (killpg finds none), and would otherwise run the whole command with the server waiting on it.
                    # Its pid stays its own until the wait below reaps it.
                    os.kill(pid, signal.SIGKILL)
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    os.waitpid(pid, 0)
                    copies.pop(pid).close()
                    started.pop(pid, None)
            for pid in list(copies):
                done, status, usage = os.wait4(pid, os.WNOHANG)
                if done:
                    print(f"prefork: copy {pid} ({' '.join(started[pid][1])}) exit status {status}, "
                          f"{time.monotonic() - started.pop(pid)[0]:.2f} s, "
                          f"cpu {usage.ru_utime + usage.ru_stime:.2f} s", flush=True)
                    conn = copies.pop(pid)
                    try:
                        conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                    except OSError:  # the caller died after the copy ended, before the server read its close
                        print(f"prefork: copy {pid} ended: its caller is gone", flush=True)
                    conn.close()
            if copies or readable:
                last = time.monotonic()
    finally:
        try:
            if os.stat(path).st_ino == own:
                path.unlink()
        except OSError:
            pass
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), float(os.environ.get("MMW_PREFORK_IDLE", "300"))))
