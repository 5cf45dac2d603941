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


def cache_folders(source: Path) -> list[Path]:
    """Where numba may keep the cached kernels of ``source`` (absolute, as imported: numba names the folder after the
    path it imported the file by, links unresolved): beside it, and under ``NUMBA_CACHE_DIR`` when set."""
    folders = [source.parent / "__pycache__"]
    root = os.environ.get("NUMBA_CACHE_DIR")
    if root:
        try:
            from numba.core.caching import _CacheLocator
            folders.append(Path(root) / _CacheLocator.get_suitable_cache_subpath(str(source)))
        except (ImportError, AttributeError):  # another numba: only the in-tree cache is checked
            pass
    return folders


def drop_stale(twin_file: str | Path) -> None:
    """Drop the cached kernels of the twin module at ``twin_file`` (its ``__file__``) unless they were compiled from
    the current twin, ``stats.py``, ``prf.py`` and sampler codes; then stamp the folder with those."""
    source = Path(os.path.abspath(twin_file))
    twin, here = source.stem, source.parent
    digest = hashlib.sha256(b"".join((here / name).read_bytes() for name in (source.name, "stats.py", "prf.py"))
                            + repr(sorted(SAMPLER_CODES.items())).encode()).hexdigest()
    for cache in cache_folders(source):
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
