"""A real copy of the DVC pipeline in a temporary git repository, for heavy tests (same approach as test_dvc.py).

The copy holds dvc.yaml, DVC's config and every path dvc.yaml lists as a dependency, plus a ``params.yaml``
board given by the test (``tiny_board()``: 1 prompt per task, 16 new tokens, 2 cheap attacks).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
#: What the copied pipeline needs: its definition, DVC's config, and every path dvc.yaml lists as a dependency.
COPIED = ("dvc.yaml", ".dvc/config", ".dvc/.gitignore", ".dvcignore", "mmw", "stages", "kernels", "data/tasks")
#: The interpreter's bin directory first, so the stages' `mmw` and `dvc` are this environment's.
BIN = Path(sys.executable).parent


def tiny_board() -> dict[str, Any]:
    """The repository's params.yaml scaled down to minutes on a 2-core CPU."""
    board = yaml.safe_load((REPO / "params.yaml").read_text())
    board["model"].update(max_new_tokens=16, batch_size=4)
    board["prompts"]["per_task"] = 1
    board["attacks"]["specs"] = [{"name": "swap", "p": 0.1}, {"name": "lowercase"}]
    board["rate"].update(batch_size=4)
    return board


def run(repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True,
        timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """Run a command in ``repo`` with this environment's bin first on PATH and a git identity set."""
    full_env = {**os.environ, **(env or {}),
                "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "GIT_AUTHOR_NAME": "mmw-test", "GIT_AUTHOR_EMAIL": "test@mmw", "GIT_COMMITTER_NAME": "mmw-test",
                "GIT_COMMITTER_EMAIL": "test@mmw"}
    completed = subprocess.run(args, cwd=repo, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert completed.returncode == 0, f"{' '.join(args)} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed


def stages_run(output: str) -> set[str]:
    """The stages DVC ran, from its output."""
    return set(re.findall(r"Running stage '([^']+)'", output))


def make_pipeline_repo(repo: Path, board: dict[str, Any]) -> Path:
    """Copy the pipeline into the empty directory ``repo``, write ``board`` as params.yaml and ``git init``."""
    if shutil.which("mmw", path=str(BIN)) is None:
        raise AssertionError("the `mmw` command is not installed next to this Python (pip install -e .)")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        source, target = REPO / name, repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            shutil.copy2(source, target)
    (repo / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
    run(repo, "git", "init", "-q")
    return repo
