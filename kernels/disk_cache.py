"""numba's on-disk kernel cache (``cache=True``), kept consistent with the sources a twin inlines.

numba keys a cached kernel by its own file alone (its path, modification time and size), but both twins inline the
shared specification (``stats.py``, ``prf.py``) and the sampler codes: a kernel compiled before a change there
would run the old statistic. :func:`drop_stale` removes a twin's cached kernels whenever any of those sources
changed since they were compiled, wherever numba keeps them: the ``__pycache__`` beside the file, or the folder
``NUMBA_CACHE_DIR`` names (numba's own rule for the sub-folder, ``_CacheLocator.get_suitable_cache_subpath``).
Written by hand: numba has no hook for extra dependencies of a cached function.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from mmw.kernels.stats import SAMPLER_CODES

HERE = Path(__file__).resolve().parent


def cache_folders(source: Path) -> list[Path]:
    """Where numba may keep the cached kernels of ``source``: beside it, and under ``NUMBA_CACHE_DIR`` when set."""
    folders = [source.parent / "__pycache__"]
    root = os.environ.get("NUMBA_CACHE_DIR")
    if root:
        try:
            from numba.core.caching import _CacheLocator
            folders.append(Path(root) / _CacheLocator.get_suitable_cache_subpath(str(source)))
        except (ImportError, AttributeError):  # another numba: only the in-tree cache is checked
            pass
    return folders


def drop_stale(twin: str, here: Path = HERE) -> None:
    """Drop ``twin``'s (``"cpu"`` or ``"cuda"``: the module name) cached kernels unless they were compiled from the
    current ``{twin}.py``, ``stats.py``, ``prf.py`` and sampler codes; then stamp the folder with those."""
    digest = hashlib.sha256(b"".join((here / name).read_bytes() for name in (f"{twin}.py", "stats.py", "prf.py"))
                            + repr(sorted(SAMPLER_CODES.items())).encode()).hexdigest()
    for cache in cache_folders(here / f"{twin}.py"):
        stamp = cache / f"{twin}.sources.sha256"
        try:
            if stamp.read_text() == digest:
                continue
        except OSError:
            pass
        try:
            cache.mkdir(parents=True, exist_ok=True)
            for stale in [*cache.glob(f"{twin}.*.nbi"), *cache.glob(f"{twin}.*.nbc")]:
                stale.unlink(missing_ok=True)
            stamp.write_text(digest)
        except OSError:  # a read-only install: numba then cannot cache here either
            pass
