"""Set-up of a later stage, run on a side thread while this process's device decodes.

A configuration run in one process (a packed sweep unit, ``bench/gpu_fullscale.py --in-process``) spends ~20 s in
each generation stage's decode loop, where the host only replays a captured CUDA graph and waits on the device,
and then builds the judge (its weights, its compiled layers: 5-13 s on an H100) with the device idle. Here a stage
schedules such set-up (:func:`schedule`), the decode loop says when its device is busy and its host free
(:func:`device_busy`, after the graph's first replay) and when that ends (:func:`settle`, before the loop returns),
and the stage that needs the set-up takes it (:func:`take`): ready, waited for, or built there and then when it
never ran (a CPU, vLLM, an eager loop, too little free device memory) or failed on the side thread.

What a job may rely on, and what it must keep:

* between :func:`device_busy` and :func:`settle` the main thread runs graph replays and stop checks only (no
  Python forward, no compilation, no capture), so a job may compile (Dynamo's frame hook is per thread), and the
  decode's patches of shared code (its attention switches, its fused layer classes: :func:`swapped`) are lifted
  while the jobs run and put back before :func:`settle` returns: a job sees the code its stage would see;
* a job's device work runs on a CUDA stream of its own, synchronised before :func:`settle` returns, so the
  decode's stream never waits on it;
* a job computes what the stage would have computed inline (the same function, the same arguments): scheduling
  changes when set-up happens, never its result;
* nothing a job loads is noted in the running stage's provenance (:func:`mmw.provenance.unrecorded`): the stage
  that takes it notes what it uses.

Jobs live as long as the process's shared loads (:func:`mmw.engines.models.shared_loads` forgets them when it
ends); a taken result is kept for a later :func:`take` of the same key (the watermarked texts' rating stage takes
the judge the baseline's stage took).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mmw import provenance

log = logging.getLogger(__name__)

#: Device memory a job must leave free beyond its own weights: its compile's trial forward and the allocator's
#: rounding. Below ``weights + margin`` free bytes the job waits and runs in its stage.
DEVICE_MARGIN_BYTES = 2 << 30
#: transformers' switch that keeps its weight loading on the calling thread.
SEQUENTIAL_LOAD = "HF_DEACTIVATE_ASYNC_LOAD"
#: The interpreter's switch interval (s) while a job runs beside the decode.
SWITCH_INTERVAL_S = 0.001


@dataclass
class _Job:
    build: Callable[[], Any]
    device_bytes: int
    state: str = "pending"  # pending -> running -> done | failed; "here": built by its stage, not ahead
    host: tuple[str, ...] | None = None  # the decoding stage it waits for (:func:`beside`); None: the next decode
    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0


_JOBS: dict[Hashable, _Job] = {}
_WORKER: threading.Thread | None = None
_SWITCH: float | None = None  # the interpreter's switch interval while no job runs
_BESIDE: tuple[str, ...] | None = None  # the host of the jobs scheduled now (:func:`beside`)
_DECODED: set[tuple[str, ...]] = set()  # the decoding stages this process has entered (:func:`stage_decodes`)


def schedule(key: Hashable, build: Callable[[], Any], device_bytes: int | None) -> None:
    """Run ``build()`` on the side thread at the next :func:`device_busy` (``device_bytes``: the device memory its
    result keeps; None where unknown, then it never runs ahead); inside :func:`beside`, at the first one from its
    host stage on. A key already scheduled or built is kept."""
    if key in _JOBS or device_bytes is None:
        return
    _JOBS[key] = _Job(build, int(device_bytes), host=_BESIDE)


@contextmanager
def beside(name: tuple[str, ...] | None) -> Iterator[None]:
    """Jobs scheduled inside the block wait for a decode of stage ``name`` (:func:`host`) or of a later stage;
    None: the next decode.

    Why: where the process's first decode hosted every job (the watermark step, the detector's kernels, the
    judge's build: ~21 s of jobs with fresh compiler caches on an H100), its loop waited 0.4-1.3 s for them and the
    watermarked stage's decode hosted nothing. Beside the last decode before the stage that takes them
    (:func:`mmw.sweep.pipeline.schedule_ahead` names that one) the waits were 0.0 s; the two decode loops together
    and the stages' sum stayed within the runs' spread (bench/results/gpu.md, section "Each set-up job beside the
    last decode"). As a machine's first process on one H200 the watermarked decode then waited 2.5 s for the judge's
    build and the detector's kernels, so a stage with a short set-up may ask for the first decode instead
    (``AHEAD_BESIDE_FIRST``)."""
    global _BESIDE
    saved, _BESIDE = _BESIDE, name
    try:
        yield
    finally:
        _BESIDE = saved


def host(module: str, *args: str) -> tuple[str, ...]:
    """The name of a decoding stage, ``mmw.stages.<module>`` run with ``args`` (e.g. ``host("generate",
    "watermarked")``), for :func:`beside` and :func:`stage_decodes`."""
    return (module, *args)


def stage_decodes(name: tuple[str, ...]) -> None:
    """Stage ``name`` (:func:`host`) runs now and may decode: the jobs waiting for it may start at the next
    :func:`device_busy` (also where it finds its rows already written and decodes nothing: then a later stage's
    decode hosts them)."""
    _DECODED.add(name)


def pending() -> list[Hashable]:
    """The keys of the jobs not started yet whose host stage has begun (:func:`beside`)."""
    return [key for key, job in _JOBS.items()
            if job.state == "pending" and (job.host is None or job.host in _DECODED)]


def device_busy(device: Any) -> bool:
    """The caller's device (a ``torch.device``) has queued work its host only waits on: start the pending jobs that
    fit in its free memory on the side thread. Returns whether a thread started (False off CUDA, with no job, or
    with one already running)."""
    global _WORKER, _SWITCH
    if _WORKER is not None or not pending():
        return False
    free = _free_bytes(device)
    if free is None:
        return False
    chosen = []
    for key in pending():
        job = _JOBS[key]
        if job.device_bytes + DEVICE_MARGIN_BYTES <= free:
            free -= job.device_bytes
            job.state = "running"
            chosen.append((key, job))
        else:
            log.info("not preparing %s ahead: %.1f GiB free, it needs %.1f GiB", key, free / 2**30,
                     (job.device_bytes + DEVICE_MARGIN_BYTES) / 2**30)
    if not chosen:
        return False
    # The decode's host wakes from a stop check to queue the next replay: let it have the interpreter within
    # ~1 ms of asking (a job compiling holds it otherwise for up to Python's 5 ms interval, the device idle).
    _SWITCH = sys.getswitchinterval()
    sys.setswitchinterval(min(_SWITCH, SWITCH_INTERVAL_S))
    _WORKER = threading.Thread(target=_work, args=(chosen, device), name="mmw-ahead", daemon=True)
    _WORKER.start()
    return True


def _free_bytes(device: Any) -> int | None:
    """Free memory of a CUDA ``device`` (a ``torch.device``), counting blocks the caching allocator holds but no
    tensor uses (released to a job that needs them); None off CUDA, where no job runs ahead."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


@contextmanager
def _side_stream(device: Any) -> Iterator[Callable[[], None]]:
    """On CUDA, a pool stream of ``device`` current in the block (never synchronised with the decode's stream);
    yields its synchronize."""
    if getattr(device, "type", None) != "cuda":
        yield lambda: None
        return
    import torch

    stream = torch.cuda.Stream(device)
    # transformers' loader copies weights to the device from a pool of threads, each on its default stream, where a
    # copy from pageable memory waits for the decode's queued replays: on the side thread it loads on this thread,
    # on the side stream (HF_DEACTIVATE_ASYNC_LOAD; the main thread loads nothing while a job runs).
    saved = os.environ.get(SEQUENTIAL_LOAD)
    os.environ[SEQUENTIAL_LOAD] = "1"
    try:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            yield stream.synchronize
    finally:
        if saved is None:
            os.environ.pop(SEQUENTIAL_LOAD, None)
        else:
            os.environ[SEQUENTIAL_LOAD] = saved


_ABSENT = object()
#: The open :func:`swapped` blocks, oldest first: [owner, name, value before, value inside].
_OPEN: list[list[Any]] = []


def _get(owner: Any, name: str) -> Any:
    return owner.get(name, _ABSENT) if isinstance(owner, dict) else vars(owner).get(name, _ABSENT)


def _put(owner: Any, name: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner.pop(name, None) if value is _ABSENT else owner.__setitem__(name, value)
    elif value is _ABSENT:
        delattr(owner, name)  # inherited before (a class's forward from its base): inherited again
    else:
        setattr(owner, name, value)


@contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` (``owner[name]`` for a dict) is ``value`` inside the block and what it was after (absent
    again where it was absent). The decode's patches of shared code (transformers' attention function and GQA rule,
    the fused layer classes) go through here, so a job beside the decode sees that code as it was before them: a
    later stage's judge, of the generator's architecture, is built as its stage would build it."""
    entry = [owner, name, _get(owner, name), value]
    _put(owner, name, value)
    _OPEN.append(entry)
    try:
        yield
    finally:
        _OPEN[:] = [e for e in _OPEN if e is not entry]
        _put(owner, name, entry[2])


@contextmanager
def _as_before_swaps() -> Iterator[None]:
    """Every open :func:`swapped` block undone inside this block (newest first), then redone (oldest first)."""
    opened = list(_OPEN)
    for owner, name, before, _ in reversed(opened):
        _put(owner, name, before)
    try:
        yield
    finally:
        for owner, name, _, value in opened:
            _put(owner, name, value)


def _work(jobs: list[tuple[Hashable, _Job]], device: Any) -> None:
    with provenance.unrecorded(), _as_before_swaps(), _side_stream(device) as synchronize:
        for key, job in jobs:
            started = time.perf_counter()
            try:
                job.value = job.build()
                synchronize()
                job.state = "done"
            except BaseException as err:  # noqa: BLE001 - the stage builds it again, and reports its own error
                job.error, job.state = err, "failed"
            job.seconds = time.perf_counter() - started
            log.info("prepared %s ahead in %.1f s (%s)", key, job.seconds, job.state)


def settle() -> None:
    """Wait for the side thread's jobs (the caller's busy device is about to become free or to be used by the main
    thread's own compiles and captures)."""
    global _WORKER, _SWITCH
    if _WORKER is not None:
        _WORKER.join()
        _WORKER = None
    if _SWITCH is not None:
        sys.setswitchinterval(_SWITCH)
        _SWITCH = None


def take(key: Hashable, build: Callable[[], Any], problem: Callable[[Any], str | None] = lambda value: None) -> Any:
    """The value of job ``key``: built ahead (waited for if still running), else ``build()`` now (never scheduled,
    never started, or failed ahead: then built again here, where an error is the stage's own). ``problem(value)``:
    why a value built ahead is not what ``build()`` gives here (e.g. a compile that fell back to eager on the side
    thread), or None; such a value is built again too."""
    job = _JOBS.get(key)
    if job is None:
        return build()
    if job.state == "running":
        settle()
    if job.state == "here":
        return job.value
    if job.state == "done":
        reason = problem(job.value)
        if reason is None:
            return job.value
        job.state, job.error = "failed", RuntimeError(reason)
    if job.state == "failed":
        log.warning("preparing %s ahead failed (%s: %s); building it now", key, type(job.error).__name__, job.error)
    del _JOBS[key]
    value = build()
    _JOBS[key] = _Job(build, 0, "here", value)
    return value


def built_ahead(key: Hashable) -> float | None:
    """The seconds job ``key`` took on the side thread, where it was built there; else None."""
    job = _JOBS.get(key)
    return job.seconds if job is not None and job.state == "done" else None


def forget() -> None:
    """Wait for the side thread, then drop every job and result."""
    settle()
    _JOBS.clear()
    _DECODED.clear()
