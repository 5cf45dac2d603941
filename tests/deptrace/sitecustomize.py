"""Dependency trace of a real `dvc repro` (tests/test_deps.py): put this folder on PYTHONPATH and set MMW_DEPTRACE
to a folder; every Python process DVC starts for a stage (DVC sets $DVC_STAGE) then writes, at exit,
``<stage>-<pid>.json``: the files of the modules it imported, the files it opened for reading, and the params
sections it loaded (the ``mmw.params.load`` audit event). Other processes (DVC itself) record nothing.

Opens are seen twice: Python's ``open`` audit event, and inotify ``IN_OPEN`` (Linux) on the folders of the working
tree's ``data/`` and ``reports/``, because native readers (polars' parquet and CSV readers) never go through
Python's ``open``. DVC waits while a stage runs, so the folders' opens in that window are the stage's.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import json
import os
import struct
import sys

_OUT = os.environ.get("MMW_DEPTRACE")
_STAGE = os.environ.get("DVC_STAGE")


_IN_OPEN = 0x20
_IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then a NUL-padded name of len bytes


def _watch_opens(roots: list[str]) -> tuple[int, dict[int, str]] | None:
    """An inotify descriptor watching IN_OPEN on every folder under ``roots`` (None where inotify is missing)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    folders: dict[int, str] = {}
    for root in roots:
        for folder, _, _ in os.walk(root):
            wd = libc.inotify_add_watch(fd, os.fsencode(folder), _IN_OPEN)
            if wd >= 0:
                folders[wd] = folder
    return fd, folders


def _opened_files(fd: int, folders: dict[int, str]) -> set[str]:
    """The files opened under the watched folders since the watch began (drains the queue)."""
    seen: set[str] = set()
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return seen
        offset = 0
        while offset < len(data):
            wd, _, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0").decode(errors="replace")
            offset += _EVENT.size + length
            if name and wd in folders:
                seen.add(os.path.join(folders[wd], name))


def _install(out: str, stage: str) -> None:
    opened: set[str] = set()
    sections: list[str] = []
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if not isinstance(path, str | bytes | os.PathLike):
                return  # a file descriptor
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & writing):
                return
            # A relative name opened against a directory descriptor (shutil.rmtree's dir_fd walk of a temporary
            # directory) resolves against no directory the hook can see; only a file that exists was read.
            absolute = os.path.abspath(os.fsdecode(path))
            if os.path.exists(absolute):
                opened.add(absolute)
        elif event == "mmw.params.load":
            sections.extend(args[0])

    sys.addaudithook(hook)
    watch = _watch_opens([os.path.abspath(d) for d in ("data", "reports") if os.path.isdir(d)])

    def dump() -> None:
        if watch is not None:  # files still there at exit: not the temporary files of atomic writes
            opened.update(path for path in _opened_files(*watch) if os.path.isfile(path))
        modules = {os.path.abspath(f) for m in list(sys.modules.values())
                   if isinstance(f := getattr(m, "__file__", None), str)}
        record = {"stage": stage, "argv": sys.argv, "modules": sorted(modules), "opened": sorted(opened),
                  "sections": sections}
        with open(os.path.join(out, f"{stage}-{os.getpid()}.json"), "w") as handle:
            json.dump(record, handle)

    atexit.register(dump)


if _OUT and _STAGE:
    _install(_OUT, _STAGE)
