"""A real copy of the DVC pipeline in a temporary git repository, for heavy tests and bench/ scripts.

The copy is what a fresh clone holds (every file git tracks or would track: ``git ls-files -co --exclude-standard``)
plus its own ``.venv`` standing in for ``bash scripts/setup.sh``: a venv with the copy installed editable (so the
stages run the copy's code and read the copy's data, which its dvc.lock hashes) and this environment's packages on
its path (a .pth file: no download). Commands run the way the README says, from a plain shell: no activated venv
(no ``VIRTUAL_ENV``, no ``mmw`` anywhere on PATH), ``dvc`` called by path (``.venv/bin/dvc repro``). So a stage
command that relies on the caller's PATH to find ``mmw`` fails here as it fails for a new user.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
#: The environment's bin directory: its `dvc` and `mmw` are run by path, never found through PATH.
BIN = Path(sys.executable).parent
#: PYTHONPATH entry whose sitecustomize records what each stage imports and reads (tests/test_deps.py).
DEPTRACE = Path(__file__).resolve().parent / "deptrace"
#: PYTHONPATH entry whose sitecustomize counts (or, planned, kills at) each stage's atomic moves (tests/test_faults.py);
#: it runs the next sitecustomize on the path too, so the shared run is traced and counted at once.
FAULTINJECT = Path(__file__).resolve().parent / "faultinject"
#: Left out of the copy: the committed run of the default board (the copy runs its own board from scratch).
NOT_COPIED = ("dvc.lock", "reports/metrics.json")


def tiny_board() -> dict[str, Any]:
    """The repository's params.yaml scaled down to minutes on a 2-core CPU.

    Four cheap attacks: misspelling and contraction read their word lists (data/attacks) through ``__file__``,
    which tests/test_deps.py must see a stage read.
    """
    board = yaml.safe_load((REPO / "params.yaml").read_text())
    board["model"].update(max_new_tokens=16, batch_size=4)
    board["prompts"]["per_task"] = 1
    board["attacks"]["specs"] = [{"name": "swap", "p": 0.1}, {"name": "lowercase"},
                                 {"name": "misspelling", "p": 0.5}, {"name": "contraction"}]
    # The plumbing tests need a judge, not a good one: SmolLM2 rates ~10x faster than the default Qwen judge
    # (the judge's discrimination is tested in test_judge.py and measured on every default run).
    board["rate"].update(batch_size=4, judge="embedded:smollm2-135m", dtype="float32")
    return board


def traced_board() -> dict[str, Any]:
    """The shared traced run's board (:func:`traced_tiny_pipeline`): the tiny board with one generation batch per
    prompt, so that tests/test_faults.py's kills land between stored batches and the shared run is its clean run."""
    board = tiny_board()
    board["model"]["batch_size"] = 1
    return board


def _without_mmw(path: str) -> str:
    """PATH minus every folder holding an `mmw` or `dvc` (this environment's bin, a user install, ...)."""
    keep = [entry for entry in path.split(os.pathsep)
            if entry and not any(Path(entry, name).exists() for name in ("mmw", "dvc"))]
    return os.pathsep.join(keep)


def plain_shell_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a shell with no venv activated (plus ``env``), and a git identity."""
    full = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    full.update(PATH=_without_mmw(os.environ.get("PATH", "")), GIT_AUTHOR_NAME="mmw-test",
                GIT_AUTHOR_EMAIL="test@mmw", GIT_COMMITTER_NAME="mmw-test", GIT_COMMITTER_EMAIL="test@mmw")
    full.update(env or {})
    return full


def run(repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True,
        timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """Run a command in ``repo`` from a plain shell (:func:`plain_shell_env`); ``dvc`` and ``mmw`` run this
    environment's executables by path, as the README's ``.venv/bin/dvc repro`` does."""
    command = [str(BIN / args[0]) if args[0] in ("dvc", "mmw") else args[0], *args[1:]]
    completed = subprocess.run(command, cwd=repo, env=plain_shell_env(env), capture_output=True, text=True,
                               timeout=timeout)
    if check:
        assert completed.returncode == 0, f"{' '.join(args)} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed


def stages_run(output: str) -> set[str]:
    """The stages DVC ran, from its output."""
    return set(re.findall(r"Running stage '([^']+)'", output))


def stages_skipped(output: str) -> set[str]:
    """The stages DVC found unchanged, from its output."""
    return set(re.findall(r"Stage '([^']+)' didn't change, skipping", output))


def copy_checkout(repo: Path, venv: bool = True) -> Path:
    """Copy what a fresh clone of this checkout holds (tracked and untracked-but-not-ignored files) into the new
    directory ``repo``, give it its own ``.venv`` (:func:`make_venv`) unless ``venv`` is false, and ``git init``
    it (nothing committed)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_file():  # deleted in the work tree
            continue
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    _copy_kernel_cache(repo)
    if venv:
        make_venv(repo)
    run(repo, "git", "init", "-q")
    return repo


def _copy_kernel_cache(repo: Path) -> None:
    """numba's compiled CPU kernels, where this checkout has them, into the copy: a fresh copy's first detect stage
    otherwise compiles them again (~8 s on the 2-core machine). They stay valid there: numba checks each against
    kernels/cpu.py's mtime and size (``copy2`` keeps both), and kernels/cpu.py drops them unless its stamp matches
    the sources they were compiled from."""
    cache = REPO / "kernels/__pycache__"
    files = [*cache.glob("cpu.*.nbi"), *cache.glob("cpu.*.nbc"), *cache.glob("cpu.sources.sha256")]
    if not files:
        return
    (repo / "kernels/__pycache__").mkdir(parents=True, exist_ok=True)
    for path in files:
        try:
            shutil.copy2(path, repo / "kernels/__pycache__" / path.name)
        except OSError:  # being replaced by another process's compile: that kernel compiles in the copy
            pass


def make_venv(repo: Path) -> Path:
    """``repo/.venv``: the copy installed editable, this environment's packages reached through a .pth file, and
    this environment's ``dvc`` linked in (what setup.sh would install, without a download; ~10 s)."""
    venv = repo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_mmw_test_packages.pth").write_text(ours + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-deps",
                    "--no-build-isolation", "-e", str(repo)], check=True, capture_output=True)
    (venv / "bin/dvc").symlink_to(BIN / "dvc")
    return venv


def make_pipeline_repo(repo: Path, board: dict[str, Any]) -> Path:
    """:func:`copy_checkout` into the new directory ``repo``, without the committed run, with ``board`` as
    params.yaml."""
    repo.mkdir(parents=True, exist_ok=True)
    copy_checkout(repo)
    for name in NOT_COPIED:
        (repo / name).unlink(missing_ok=True)
    (repo / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
    return repo


@dataclass(frozen=True)
class TracedRun:
    """The tiny pipeline after one traced ``dvc repro`` from scratch, committed."""

    repo: Path
    traces: Path  # <stage>-<pid>.json per stage process (tests/deptrace)
    counts: Path  # <stage>.count: each stage process's atomic moves (tests/faultinject, MMW_FAULT_COUNT)
    pristine: Path  # a copy of ``repo`` (no venv) taken right after the commit, which nothing changes
    output: str  # dvc repro's stdout + stderr
    seconds: float  # wall time of the dvc repro


def traced_tiny_pipeline(base: Path) -> TracedRun:
    """The tiny pipeline (:func:`traced_board`) after one traced ``.venv/bin/dvc repro`` from scratch, committed (the
    run experiments compare with), built once per test session and shared by test_dvc, test_deps, test_prefork,
    test_plugins and test_faults (its clean run: the stages' atomic moves are counted, and the judge starts from a
    judgement cache of its own, so the run makes every judgement it records).

    ``base`` is a folder in the process's temporary root (``getbasetemp() / name``). Under pytest-xdist every worker
    gets the one run, built by the first to ask, in the session's shared root (the parent of the workers' roots),
    under a file lock: the others wait for it instead of running the same pipeline beside it on the same cores.
    A test that runs experiments works in a :func:`clone_pipeline` of ``pristine``, a copy taken right after the
    commit that nothing changes (``repo`` itself may be in the middle of another worker's experiment: the stage
    traces name its paths, so the trace readers keep it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent.parent / base.name
    base.mkdir(parents=True, exist_ok=True)
    record = base / "run.json"
    with FileLock(base / "build.lock"):
        if not record.is_file():
            for partial in ("pipeline", "traces", "counts", "judgements", "pristine"):  # left by a failed build
                shutil.rmtree(base / partial, ignore_errors=True)
            repo = make_pipeline_repo(base / "pipeline", traced_board())
            traces, counts = base / "traces", base / "counts"
            traces.mkdir()
            counts.mkdir()
            started = time.perf_counter()
            completed = run(repo, ".venv/bin/dvc", "repro",
                            env={"PYTHONPATH": f"{FAULTINJECT}{os.pathsep}{DEPTRACE}", "MMW_DEPTRACE": str(traces),
                                 "MMW_FAULT_COUNT": str(counts), "MMW_JUDGE_CACHE": str(base / "judgements")})
            seconds = time.perf_counter() - started
            run(repo, "git", "add", "-A")
            run(repo, "git", "commit", "-qm", "baseline run")
            shutil.copytree(repo, base / "pristine", symlinks=True, ignore=shutil.ignore_patterns(".venv"))
            made = record.with_suffix(".tmp")
            made.write_text(json.dumps({"output": completed.stdout + completed.stderr, "seconds": seconds}))
            os.replace(made, record)
    saved = json.loads(record.read_text())
    return TracedRun(base / "pipeline", base / "traces", base / "counts", base / "pristine", saved["output"],
                     saved["seconds"])


def clone_pipeline(source: Path, dest: Path) -> Path:
    """A copy of the pipeline repository ``source`` (work tree, git history, DVC cache and run-cache, the stage
    timings) in the new directory ``dest``, with its own ``.venv`` (:func:`make_venv`): the same committed run in a
    repository of its own, to change without touching ``source`` (~10 s instead of a ``dvc repro``)."""
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".venv"))
    make_venv(dest)
    return dest


#: Two CPU configs at the tiny board's scale for real sweep tests (tests/test_sweep.py, tests/test_ray.py): distribution
#: shift delta 5 and exponential with skip 0.05, both window 1.
TWO_CONFIG_GRIDS = [
    {"name": "ds", "scheme.sampler": "distribution_shift", "scheme.score": "sum", "scheme.randomness": "window",
     "scheme.window": 1, "scheme.delta": 5.0},
    {"name": "exp", "scheme.sampler": "exponential", "scheme.score": "sum", "scheme.randomness": "window",
     "scheme.window": 1, "scheme.skip_prob": 0.05},
]
