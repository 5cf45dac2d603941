"""Running a sweep: jobs (named DVC experiments) handed to an executor, outcomes logged, progress and ETA.

The executor is pluggable (:class:`Executor`): :class:`LocalDvcExecutor` runs ``dvc exp run --temp`` one job
at a time on this machine; :class:`mmw.sweep.pack.PackedExecutor` runs the jobs that share a baseline several to a
process; a cluster executor (e.g. Ray) only has to implement ``run(jobs, record)``.

Why one ``dvc exp run --temp`` per job and not ``dvc exp run --queue`` + ``dvc queue start -j N``:

* re-evaluations need a fresh secret key per run, and the key may only travel through the environment
  (``MMW_KEY``): queue workers share the environment of ``dvc queue start``, a per-job subprocess does not;
* a failed config must be recorded with its error and wall time: a subprocess per job gives its exit code and
  stderr directly, instead of scraping ``dvc queue logs`` of celery workers;
* on 2 cores parallel workers oversubscribe the CPU (torch and numba each use every core), so ``-j 1`` is the
  only sensible setting here anyway; on a machine with several accelerators the executor is the place to add
  parallelism;
* an interrupt (kill) leaves no queue state to repair: an unfinished job simply has no experiment ref and is
  run again next time.

Interruption: SIGINT, SIGTERM and SIGHUP stop the running ``dvc exp run`` and its stage before the runner exits.
A SIGKILL leaves behind the scratch copy of the experiment it interrupted, which ``dvc exp show`` would go on
listing as running under the job's name; the next run removes it (:func:`clear_interrupted`) before it starts. Only
one local run works in a repository at a time (a lock file under ``.dvc/tmp/sweeps/``): a ``dvc exp run`` orphaned
by a SIGKILL of the runner alone keeps the lock until it ends, so a rerun never runs the same job beside it.

``--temp`` runs each experiment in a scratch copy of the repository; but DVC first writes the run's ``-S``
overrides into the workspace's params.yaml and stashes them, so a kill in that moment can leave params.yaml missing
(seen once on a loaded 2-core machine; the next run refuses, naming the file and `git checkout`) or, in principle,
changed (not detected). Outputs go to the shared DVC cache and run-cache, so stages whose params and deps did not
change (the baseline for a (model, temperature, seed), its ratings) are restored from the run-cache, never
regenerated.

Which jobs are done is read from git: a finished experiment is the ref ``refs/exps/<baseline>/<name>``. Failures
and wall times are appended to ``.dvc/tmp/sweeps/<sweep>/runs.jsonl`` (one JSON object per finished attempt).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from mmw.errors import SpecError
from mmw.sweep.pipeline import exp_run_command

LOG_DIR = Path(".dvc/tmp/sweeps")
#: Held by the local runner and the ``dvc exp run`` it started while either lives.
LOCK_FILE = LOG_DIR / "local-run.lock"
#: DVC's records of ``dvc exp run --temp`` runs (one ``<rev>/<rev>.run`` JSON file each) and their scratch copies.
DVC_RUNS, DVC_SCRATCH = Path(".dvc/tmp/exps/run"), Path(".dvc/tmp/exps/standalone")
#: ``dvc.repo.experiments.executor.base.TaskStatus.SUCCESS``: a run record below it never finished.
_DVC_SUCCESS = 3


@dataclass(frozen=True)
class Job:
    """One DVC experiment to run: ``name`` (unique per baseline commit), the ``-S`` overrides, and extra
    environment variables (``MMW_KEY`` for re-evaluations; never logged)."""

    name: str
    config_id: str
    overrides: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt at a job. ``status``: done | failed; ``error``: the last lines of its output;
    ``ran`` / ``restored``: the stages DVC ran, and those it skipped as unchanged or restored from the run-cache
    (the proof that baselines are shared, not regenerated per config)."""

    name: str
    config_id: str
    status: str
    error: str | None
    wall_s: float
    finished: str
    ran: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    #: A job run in a pack (:mod:`mmw.sweep.pack`): the pack's id, size, the job's place in it and the pack's
    #: shared wall time; None for a DVC experiment.
    packed: dict[str, Any] | None = None
    #: A packed job's results (:class:`mmw.sweep.units.RunEvidence`), handed over in memory: a pack leaves no
    #: experiment ref to read them from. Never logged.
    evidence: Any = field(default=None, repr=False, compare=False)


class Executor(Protocol):
    """Runs jobs and calls ``record`` once per finished attempt (in any order, from the calling thread)."""

    def run(self, jobs: Sequence[Job], record: Callable[[Outcome], None]) -> None: ...


def _stage_path_env() -> dict[str, str]:
    """The environment for DVC and the stages it runs: this interpreter's bin directory on PATH, so the stages'
    ``mmw`` is this environment's even when the venv is not activated."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    return {"PATH": path if bin_dir in path.split(os.pathsep) else f"{bin_dir}{os.pathsep}{path}"}


def clear_interrupted(repo: Path) -> list[str]:
    """Remove the scratch copies of ``dvc exp run --temp`` runs that were killed before they finished (their run
    record says preparing or running and their copy still exists), so ``dvc exp show`` stops listing them as
    running beside the finished experiment of the same name and their disk space is freed. Call it only while no
    ``dvc exp run --temp`` works in ``repo`` (:func:`hold_run_lock`). Returns the names of the cleared runs."""
    cleared = []
    scratch = (repo / DVC_SCRATCH).resolve()
    for record in sorted((repo / DVC_RUNS).glob("*/*.run")):
        try:
            info = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        root = Path(str(info.get("root_dir") or ""))
        if (info.get("location") != "tempdir" or int(info.get("status", _DVC_SUCCESS)) >= _DVC_SUCCESS
                or not root.is_dir() or scratch not in root.resolve().parents):
            continue
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(record.parent, ignore_errors=True)
        cleared.append(str(info.get("name") or record.stem))
    return cleared


def hold_run_lock(repo: Path) -> int:
    """Take the repository's local-run lock (an open descriptor holding ``flock``; it is released when every
    process holding the descriptor has ended). SpecError naming the holder when another run has it."""
    path = repo / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text().strip() or "unknown"
        os.close(fd)
        raise SpecError("sweep", f"another local sweep run works in {repo} ({holder}); a `dvc exp run` left by a "
                        "killed `mmw sweep run` holds it until it ends",
                        "wait for it to finish, or stop that process, then run again") from None
    _note_holder(fd, f"mmw sweep pid {os.getpid()}")
    return fd


def _note_holder(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (text + "\n").encode(), 0)


class LocalDvcExecutor:
    """``dvc exp run --temp -n NAME -S ...`` for each job, one after another, in ``repo``."""

    def __init__(self, repo: Path, timeout_s: float | None = None) -> None:
        self.repo = repo
        self.timeout_s = timeout_s
        self._child: subprocess.Popen[str] | None = None
        self._lock: int | None = None

    def _terminate(self, signum: int, _frame: Any) -> None:
        """Stop the running ``dvc exp run`` and the stage it runs before exiting (no orphaned stages): SIGINT
        first (DVC cleans up its scratch copy), then SIGKILL to whatever is left of its process tree. Exit code
        128 + the signal (130 after Ctrl-C)."""
        import psutil  # a dependency of DVC

        child = self._child
        if child is not None and child.poll() is None:
            try:
                tree = [child.pid, *(p.pid for p in psutil.Process(child.pid).children(recursive=True))]
            except psutil.NoSuchProcess:
                tree = []
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        raise SystemExit(128 + signum)

    def run(self, jobs: Sequence[Job], record: Callable[[Outcome], None]) -> None:
        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {signum: signal.signal(signum, self._terminate) for signum in signals}
        self._lock = hold_run_lock(self.repo)
        try:
            clear_interrupted(self.repo)
            for job in jobs:
                record(self._run_one(job))
        finally:
            os.close(self._lock)
            self._lock = None
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run_one(self, job: Job) -> Outcome:
        command = exp_run_command(job.name, job.overrides, temp=True)
        env = {**os.environ, **_stage_path_env(), **job.env}
        started = time.perf_counter()
        # The child inherits the lock: should this process die without stopping it, no rerun starts beside it.
        locks = () if self._lock is None else (self._lock,)
        self._child = subprocess.Popen(command, cwd=self.repo, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, pass_fds=locks)
        if self._lock is not None:
            _note_holder(self._lock, f"mmw sweep pid {os.getpid()}, its dvc exp run pid {self._child.pid}")
        try:
            output, _ = self._child.communicate(timeout=self.timeout_s)
            code = self._child.returncode
        except subprocess.TimeoutExpired:
            self._child.kill()
            output, _ = self._child.communicate()
            code, output = -1, f"{output}\ntimed out after {self.timeout_s:g} s"
        finally:
            self._child = None
        wall = round(time.perf_counter() - started, 1)
        error = None if code == 0 else error_text(output, code)
        return Outcome(name=job.name, config_id=job.config_id, status="done" if code == 0 else "failed",
                       error=error, wall_s=wall, finished=datetime.now(UTC).isoformat(timespec="seconds"),
                       ran=re.findall(r"Running stage '([^']+)'", output),
                       restored=re.findall(r"Stage '([^']+)' (?:is cached|didn't change)", output))


def error_text(output: str, code: int) -> str:
    """The informative part of a failed run's output, one line: the stage's own error (``error: ...`` or the
    last exception line of a traceback) and DVC's ERROR lines; else the last 3 lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and "it/s]" not in line]
    picked = [line for line in lines if line.startswith(("ERROR", "error:"))
              or re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", line)]
    picked = list(dict.fromkeys(picked)) or lines[-3:]
    return f"exit {code}: " + " | ".join(picked)[-600:]


# ---------------------------------------------------------------------------------------------- bookkeeping


def head_commit(repo: Path) -> str:
    """The baseline commit experiments hang off (``git rev-parse HEAD``); SpecError outside a git repo."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SpecError("sweep", f"{repo} has no commit to hang experiments off",
                        "a git repository with the pipeline committed (git init && git add -A && git commit)")
    return done.stdout.strip()


def finished_experiments(repo: Path, baseline: str | None = None) -> dict[str, str]:
    """Experiment name -> commit sha of every experiment ref of ``baseline`` (default HEAD)."""
    baseline = baseline or head_commit(repo)
    prefix = f"refs/exps/{baseline[:2]}/{baseline[2:]}/"
    done = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)", prefix], cwd=repo,
                          capture_output=True, text=True, check=True)
    names: dict[str, str] = {}
    for line in done.stdout.splitlines():
        ref, sha = line.split()
        names[ref.removeprefix(prefix)] = sha
    return names


def log_path(repo: Path, sweep: str) -> Path:
    return repo / LOG_DIR / sweep / "runs.jsonl"


def read_log(repo: Path, sweep: str) -> dict[str, Outcome]:
    """The last logged outcome per experiment name."""
    path = log_path(repo, sweep)
    outcomes: dict[str, Outcome] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                outcome = Outcome(**json.loads(line))
                outcomes[outcome.name] = outcome
    return outcomes


def append_log(repo: Path, sweep: str, outcome: Outcome) -> None:
    """Append one outcome (a single ``write`` of one line: a kill leaves whole lines only)."""
    path = log_path(repo, sweep)
    path.parent.mkdir(parents=True, exist_ok=True)
    logged = {k: v for k, v in asdict(outcome).items() if k != "evidence" and (k != "packed" or v is not None)}
    with path.open("a") as handle:
        handle.write(json.dumps(logged) + "\n")


@dataclass
class Progress:
    """Counts for the progress line: ``done`` (refs exist), ``failed`` (last attempt failed), ``queued``."""

    total: int
    done: int
    failed: int
    queued: int
    walls: list[float] = field(default_factory=list)

    def line(self, label: str) -> str:
        eta = ""
        if self.walls and self.queued:
            seconds = sum(self.walls) / len(self.walls) * self.queued
            eta = f", ETA {seconds / 60:.0f} min ({sum(self.walls) / len(self.walls):.0f} s a config)"
        return (f"[{label}] done {self.done}/{self.total}, failed {self.failed}, queued {self.queued}{eta}")


def run_jobs(repo: Path, sweep: str, label: str, jobs: Sequence[Job], executor: Executor,
             echo: Callable[[str], None] = print, finished: Collection[str] = (),
             on_done: Callable[[Job, Outcome], None] | None = None) -> Progress:
    """Run the jobs of ``jobs`` that have neither an experiment ref nor a name in ``finished`` (failed and missing
    ones), logging each outcome, calling ``on_done(job, outcome)`` after each finished one (the sweep writes its
    evidence file there) and printing a progress line after each. Returns the final counts."""
    finished = set(finished_experiments(repo)) | set(finished)
    todo = [job for job in jobs if job.name not in finished]
    by_name = {job.name: job for job in todo}
    previous = read_log(repo, sweep)
    progress = Progress(total=len(jobs), done=len(jobs) - len(todo),
                        failed=sum(1 for j in todo if j.name in previous and previous[j.name].status == "failed"),
                        queued=len(todo))
    echo(progress.line(label) + (" (retrying failed and missing)" if progress.done and progress.queued else ""))

    def record(outcome: Outcome) -> None:
        append_log(repo, sweep, outcome)
        was_failed = outcome.name in previous and previous[outcome.name].status == "failed"
        progress.queued -= 1
        if outcome.status == "done":
            progress.done += 1
            progress.failed -= int(was_failed)
        else:
            progress.failed += int(not was_failed)
        previous[outcome.name] = outcome
        if outcome.status == "done" and on_done is not None:
            on_done(by_name[outcome.name], outcome)
        progress.walls.append(outcome.wall_s)
        status = outcome.status if outcome.error is None else f"{outcome.status}: {outcome.error}"
        echo(f"  {outcome.name} {status} ({outcome.wall_s:.0f} s)")
        echo(progress.line(label))

    executor.run(todo, record)
    return progress
