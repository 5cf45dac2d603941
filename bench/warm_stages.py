"""Run the pipeline's stages one after another in this process, each model loaded once: the path a packed sweep
unit takes (mmw.sweep.pack: ``mmw.sweep.pipeline.run_stage`` under ``mmw.engines.models.shared_loads``), for one
configuration. Used by ``bench/gpu_fullscale.py --in-process``; run in the stages' workspace:

    python bench/warm_stages.py REPO STAGE[,STAGE...]

Prints one JSON line per stage: ``{"stage", "wall_s", "rc"}`` (a failing stage is recorded with its error and
the run goes on, as the subprocess harness does); the first stage's time includes the imports it needs and the
loads of the models it uses. ``MMW_BENCH_PROFILE=DIR`` runs each stage under cProfile and writes
``DIR/<stage>.prof`` and ``DIR/<stage>.txt`` (the 40 calls with the most cumulative time). As a pack does, the
stages' set-up that can run beside a decode is scheduled (``mmw.sweep.pipeline.schedule_ahead``: each beside the last
decode before its stage); ``MMW_BENCH_NO_AHEAD=1`` leaves every stage to build its own, for an A/B on one tree;
``MMW_BENCH_AHEAD=STAGE[,STAGE...]`` schedules only those stages' set-up (e.g. ``rate_baseline``: the judge alone);
``MMW_BENCH_AHEAD_FIRST=1`` has the first decode host every job, as trees before ``mmw.engines.ahead.beside`` did;
``MMW_BENCH_AHEAD_LAST=1`` has the last decode before each stage host its job (no stage's ``AHEAD_BESIDE_FIRST``),
as trees before it did.
``MMW_BENCH_JUDGE_INDUCTOR=KEY=VALUE[,KEY=VALUE...]`` adds Inductor options to the judge's compile only (e.g.
``triton.autotune_pointwise=True``: its pointwise kernels' launch settings timed on the device while the baseline
decodes, as before mmw.inductor's ``time_pointwise``), for an A/B on one tree; values are Python literals.
``MMW_BENCH_STEP_INDUCTOR`` does the same for the watermark step's compile (``mmw.watermark.processor``).
"""

from __future__ import annotations

import contextlib
import cProfile
import importlib
import io
import json
import os
import pstats
import sys
import threading
import time
import traceback
from pathlib import Path


class Split:
    """``MMW_BENCH_SPLIT=1``: where a stage's time goes, from timers wrapped around a few calls (no profiler): the
    decode loop (``static_decode``, synchronised at both ends) and its parts (the prefill, the eager steps, which
    compile the watermark step and the decoding attention, and the CUDA-graph captures), model loads, the judge's
    set-up after its load (``judge_init``), the detector's numba calls (``detect_kernels``), the decode loop's wait
    for the set-up run beside it (``ahead_wait``: :func:`mmw.engines.ahead.settle`, where the jobs outlast the
    decode), each such job's seconds on the side thread (``ahead_jobs``: the jobs that ended in the stage), and
    Dynamo's own compile-time metrics (``torch._dynamo.utils.compilation_time_metrics``). One JSON line a stage:
    ``{"split": STAGE, ...seconds, calls}``. Built before the stage modules are imported (which bind ``load_model``
    by name); a timer that never ran is absent from the line."""

    def __init__(self) -> None:
        import torch
        from mmw.engines import generate, graph_decode, models

        self.torch = torch
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self._wrap(graph_decode, "static_decode", "decode_loop", sync)
        generate.static_decode = graph_decode.static_decode  # imported by name there
        self._wrap(graph_decode._Decoder, "prefill_scores", "prefill", sync)
        self._wrap(graph_decode._Decoder, "step", "eager_steps", None)  # also runs under capture: never sync
        self._wrap(graph_decode, "_capture", "captures", None)  # synchronises itself
        self._wrap(models, "load_model", "load_model", None)
        try:
            from mmw.engines import ahead
        except ImportError:  # trees before it have none
            ahead = None
        self.ahead = ahead
        if ahead is not None:
            self._wrap(ahead, "settle", "ahead_wait", None)  # graph_decode calls ahead.settle through the module
        from mmw.judge.judge import Judge
        from mmw.kernels.backend import NumbaBackend

        self._wrap(Judge, "__init__", "judge_init", sync)  # its tables, the head, the compile on two rows
        for method in ("sum_prefix_batch", "empirical_prefix_batch", "anytime_batch"):  # numpy out: synchronous
            self._wrap(NumbaBackend, method, "detect_kernels", None)  # the first call compiles numba's kernels
        fused_layers = generate.fused_layers  # imported by name there: what each batch fused, if anything
        self.fused: list[int] = []

        @contextlib.contextmanager
        def recorded(model, enabled=True):
            with fused_layers(model, enabled) as replaced:
                self.fused.append(len(replaced))
                yield replaced

        generate.fused_layers = recorded

    def _wrap(self, owner, attr: str, name: str, sync) -> None:
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():  # set-up run ahead (mmw.engines.ahead)
                return fn(*args, **kwargs)
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if sync is not None:
                    sync()
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

        setattr(owner, attr, timed)

    def dynamo_s(self) -> float:
        try:
            metrics = self.torch._dynamo.utils.compilation_time_metrics
        except AttributeError:
            return float("nan")
        return sum(sum(v) for k, v in metrics.items() if k.startswith("_compile") or k == "entire_frame_compile")

    def begin(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self._dynamo0 = self.dynamo_s()
        self._graphs0 = self.torch._dynamo.utils.counters["stats"]["unique_graphs"]
        self.fused.clear()
        self._jobs0 = self.finished_jobs()

    def finished_jobs(self) -> dict[str, float]:
        """Seconds on the side thread of each job done so far, by its key's first field (the judge, the watermark
        step, the detector's kernels)."""
        jobs = self.ahead._JOBS.items() if self.ahead is not None else ()
        return {str(key[0] if isinstance(key, tuple) else key): round(job.seconds, 3)
                for key, job in jobs if job.state in ("done", "failed")}

    def line(self, stage: str) -> str:
        graphs = self.torch._dynamo.utils.counters["stats"]["unique_graphs"]
        return json.dumps({"split": stage, **{k: round(v, 3) for k, v in self.seconds.items()},
                           "calls": dict(self.calls), "dynamo_compile_s": round(self.dynamo_s() - self._dynamo0, 3),
                           "fused_pieces": list(self.fused), "dynamo_graphs": graphs - self._graphs0,
                           "ahead_jobs": {k: v for k, v in self.finished_jobs().items() if k not in self._jobs0}})


def write_profile(profiler: cProfile.Profile, folder: Path, stage: str) -> None:
    """``folder/<stage>.prof`` (for snakeviz or pstats) and ``<stage>.txt``: the top 40 by cumulative time."""
    folder.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(folder / f"{stage}.prof")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    (folder / f"{stage}.txt").write_text(text.getvalue())


#: Bench switches that add Inductor options to one compile: the module whose ``inductor_options`` they patch.
INDUCTOR_SWITCHES = {"MMW_BENCH_JUDGE_INDUCTOR": "mmw.judge.judge",
                     "MMW_BENCH_STEP_INDUCTOR": "mmw.watermark.processor"}


def added_inductor_options(module_name: str, spec: str) -> None:
    """``torch.compile`` options of the compiles in ``module_name`` (the judge's layers, the watermark step) with
    ``spec``'s (``KEY=VALUE,...``) added."""
    import ast
    import importlib

    module = importlib.import_module(module_name)
    extra = {key: ast.literal_eval(value) for key, value in (item.split("=", 1) for item in spec.split(","))}
    options = module.inductor_options
    module.inductor_options = lambda *args, **kwargs: {**options(*args, **kwargs), **extra}
    print(f"{module_name}'s Inductor options: + {extra}", flush=True)


def main(repo: str, stages: str) -> int:
    from mmw.engines.models import shared_loads
    from mmw.sweep import pipeline
    from mmw.sweep.pipeline import run_stage, stage_plan

    wanted = stages.split(",")
    plan = [stage for stage in stage_plan(Path(repo))[0] if stage.name in wanted]
    failed = 0
    split = Split() if os.environ.get("MMW_BENCH_SPLIT") else None
    for switch, module_name in INDUCTOR_SWITCHES.items():
        if os.environ.get(switch):
            added_inductor_options(module_name, os.environ[switch])
    profiles = Path(os.environ["MMW_BENCH_PROFILE"]) if os.environ.get("MMW_BENCH_PROFILE") else None
    with shared_loads():
        schedule_ahead = getattr(pipeline, "schedule_ahead", None)  # trees before it have none
        if schedule_ahead is not None and not os.environ.get("MMW_BENCH_NO_AHEAD"):
            only = os.environ.get("MMW_BENCH_AHEAD")
            if os.environ.get("MMW_BENCH_AHEAD_FIRST"):
                from mmw.engines import ahead

                ahead.beside = lambda name: contextlib.nullcontext()  # every job waits for the next decode
            if os.environ.get("MMW_BENCH_AHEAD_LAST"):
                for stage in plan:
                    module = importlib.import_module(f"mmw.stages.{stage.module}")
                    if getattr(module, "AHEAD_BESIDE_FIRST", False):
                        module.AHEAD_BESIDE_FIRST = False
            # as a packed unit does: each stage's set-up built beside the last decode before it
            schedule_ahead([s for s in plan if s.name in only.split(",")] if only else plan)
        for stage in plan:
            if split is not None:
                split.begin()
            t0 = time.perf_counter()
            error = None
            profiler = cProfile.Profile() if profiles is not None else None
            try:
                if profiler is not None:
                    profiler.runcall(run_stage, stage)
                else:
                    run_stage(stage)
            except Exception as err:  # noqa: BLE001 - a stage's failure is recorded, as a subprocess's would be
                traceback.print_exc()
                error = f"{type(err).__name__}: {err}"
                failed += 1
            if profiler is not None:
                write_profile(profiler, profiles, stage.name)
            print(json.dumps({"stage": stage.name, "wall_s": round(time.perf_counter() - t0, 1),
                              "rc": 0 if error is None else 1, **({"error": error[:400]} if error else {})}),
                  flush=True)
            if split is not None:
                print(split.line(stage.name), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
