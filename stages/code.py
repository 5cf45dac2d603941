"""Stage ``code``: a fingerprint of the code each stage runs, so that DVC reruns a stage when, and only when, a file
it runs changes, through one dependency a stage.

``stages/code.yaml`` lists, for each stage of dvc.yaml, the repository files it runs (its import closure, lazy
imports included, and what it reads through ``__file__``; tests/test_deps.py derives the lists from the code and
checks them against a traced run). This stage depends on the folders those files live in (the list itself among
them) and writes ``data/code/<stage>.md5`` for each: one ``<md5>  <path>`` line a file, sorted (``md5sum -c`` reads
it), a listed folder expanded to its files. A stage depends on its own fingerprint file, which changes only when a
file it runs changes; an edit anywhere else reruns this stage (well under a second) and nothing after it.

Why not list the files as each stage's deps: DVC rewrites dvc.lock after every stage it runs (a round-trip YAML
parse and dump of the whole file), and with every file listed under every stage (427 entries, 2,022 lines) that
took ~0.9 s a stage on the 2-core VM, ~11 s of a 12-stage `dvc repro` (docs/DVC.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from mmw.errors import SpecError
from mmw.io import write_text

#: Where the fingerprints go (the stage's one output, a folder).
CODE_DIR = Path("data/code")
#: The code each stage runs, by stage name.
CODE_MAP = Path("stages/code.yaml")
#: Path parts never fingerprinted: compiled caches Python and numba write next to the code (.dvcignore skips them).
IGNORED_PARTS = frozenset({"__pycache__"})


def listed_files(root: Path, entry: str) -> list[str]:
    """The files of one ``meta.code`` entry under ``root``: the file itself, or a folder's files (sorted, repository-
    relative, without compiled caches)."""
    path = root / entry
    if path.is_file():
        return [entry]
    if not path.is_dir():
        raise SpecError(f"{CODE_MAP}: {entry}", "no such file or folder", "a repository file or folder")
    return sorted(p.relative_to(root).as_posix() for p in path.rglob("*")
                  if p.is_file() and not IGNORED_PARTS & set(p.relative_to(root).parts))


def fingerprint(root: Path, entries: list[str]) -> str:
    """``md5sum`` lines of every file the entries name, sorted by path."""
    files = sorted({f for entry in entries for f in listed_files(root, entry)})
    return "".join(f"{hashlib.md5((root / f).read_bytes()).hexdigest()}  {f}\n" for f in files)


def run(params_path: Path) -> None:
    """Write ``data/code/<stage>.md5`` for every stage ``stages/code.yaml`` lists (in the checkout of
    ``params_path``), and remove the file of a stage it no longer lists."""
    root = params_path.resolve().parent
    code_map = yaml.safe_load((root / CODE_MAP).read_text()) or {}
    for name, entries in code_map.items():
        write_text(fingerprint(root, list(entries)), root / CODE_DIR / f"{name}.md5")
    for stale in (root / CODE_DIR).glob("*.md5"):
        if stale.stem not in code_map:
            stale.unlink()
    print(f"code: fingerprinted {len(code_map)} stages in {CODE_DIR}/")
