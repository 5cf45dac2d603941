"""Why does the first generation stage of a process decode slower than the second? The pipeline's generation
stages run in one process (``bench/warm_stages.py``'s path: ``shared_loads``) in a chosen order, repeated, with
the decode loop cut into synchronised parts and every decode step timed on the device:

    python bench/gpu_gen_order.py REPO ORDER OUT.json     # ORDER e.g. b,w,b,w (b: generate_baseline)

Run in the stages' workspace after ``key``, ``low_entropy_inputs`` and ``prompts`` (it runs those three first
again, in this process, as the pipeline does). Per generation stage: its wall time, the parts of ``static_decode``
(the decoder's set-up, the prefill, the first token's choice (which compiles the watermark step), the eager steps,
the captures, and what is left: the replayed steps and the loop's host reads), each step's device time (CUDA
events around it), the device memory the caching allocator reserved and mapped, and a digest of the table's
tokens (repeats of a stage must be equal).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path


def main(repo: str, order: str, out: str) -> int:
    import torch
    from mmw.engines import generate, graph_decode
    from mmw.engines.models import shared_loads
    from mmw.sweep.pipeline import run_stage, stage_plan

    cuda = torch.cuda.is_available()
    if not cuda:  # a CPU dry run of the harness
        torch.cuda.synchronize = lambda *a: None
        torch.cuda.memory_stats = lambda *a: {}
        torch.cuda.get_device_name = lambda *a: "cpu"
        torch.cuda.is_current_stream_capturing = lambda: False
        generate.CACHE_DEVICES = ("cpu", "cuda")
    parts: dict[str, float] = {}
    calls: dict[str, int] = {}

    def add(name: str, seconds: float) -> None:
        parts[name] = parts.get(name, 0.0) + seconds
        calls[name] = calls.get(name, 0) + 1

    def wrap(owner, attr: str, name: str, sync: bool) -> None:
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            if torch.cuda.is_current_stream_capturing():  # a capture only records: no sync there
                return fn(*args, **kwargs)
            if sync:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if sync:
                    torch.cuda.synchronize()
                add(name, time.perf_counter() - t0)

        setattr(owner, attr, timed)

    decoder = graph_decode._Decoder
    wrap(graph_decode, "static_decode", "decode_loop", True)
    generate.static_decode = graph_decode.static_decode
    wrap(decoder, "__init__", "decoder_init", True)
    wrap(decoder, "prefill_scores", "prefill", True)
    wrap(decoder, "step", "eager_steps", True)
    wrap(graph_decode, "_capture", "captures", False)
    first_choose = decoder.choose

    def choose(self, scores):  # the prefill's token: the first call of the (compiled) watermark step of the batch
        if getattr(self, "_timed_first", False) or torch.cuda.is_current_stream_capturing():
            return first_choose(self, scores)
        self._timed_first = True
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return first_choose(self, scores)
        finally:
            torch.cuda.synchronize()
            add("first_choice", time.perf_counter() - t0)

    decoder.choose = choose

    def dynamo_s() -> float:
        metrics = torch._dynamo.utils.compilation_time_metrics
        return sum(sum(v) for k, v in metrics.items() if k.startswith("_compile") or k == "entire_frame_compile")

    names = {"b": "generate_baseline", "w": "generate_watermarked"}
    plan = {stage.name: stage for stage in stage_plan(Path(repo))[0]}
    result = {"order": order, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    with shared_loads():
        for name in ("key", "low_entropy_inputs", "prompts"):
            t0 = time.perf_counter()
            run_stage(plan[name])
            result.setdefault("prefix_s", {})[name] = round(time.perf_counter() - t0, 2)
        for index, letter in enumerate(order.split(",")):
            name = names[letter]
            parts.clear()
            calls.clear()
            graph_decode.STEP_EVENTS = []
            dyn0 = dynamo_s()
            stats0 = torch.cuda.memory_stats()
            torch.cuda.synchronize()
            began = time.time()
            t0 = time.perf_counter()
            run_stage(plan[name])
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            stats1 = torch.cuda.memory_stats()
            steps = [s.elapsed_time(e) for s, e in graph_decode.STEP_EVENTS]
            graph_decode.STEP_EVENTS = None
            table = Path("data/generations") / f"{name.removeprefix('generate_')}.parquet"
            import polars as pl

            tokens = pl.read_parquet(table)["tokens"].to_list()
            digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
            timing = json.loads(Path("reports/timings", f"{name}.json").read_text())
            synced = sum(v for k, v in parts.items() if k not in ("decode_loop",))
            run = {"index": index, "stage": name, "began_unix": round(began, 2), "wall_s": round(wall, 3),
                   "load_s": timing.get("load_s"), "tokens": timing.get("tokens"), "digest": digest,
                   **{k: round(v, 3) for k, v in parts.items()}, "calls": dict(calls),
                   "replay_part_s": round(parts.get("decode_loop", 0.0) - synced, 3),
                   "dynamo_s": round(dynamo_s() - dyn0, 3), "steps": len(steps),
                   "step_ms_sum": round(sum(steps), 1),
                   "step_ms_median": round(sorted(steps)[len(steps) // 2], 3) if steps else None,
                   "step_ms_q": {f"{a}-{b}": round(sum(steps[a:b]) / max(len(steps[a:b]), 1), 3)
                                 for a, b in ((0, 4), (4, 64), (64, 256), (256, 512), (512, 768), (768, 1024))},
                   "reserved_gb": round(stats1.get("reserved_bytes.all.current", 0) / 2**30, 2),
                   "segments_new": stats1.get("segment.all.allocated", 0) - stats0.get("segment.all.allocated", 0),
                   "device_allocs_new": stats1.get("num_device_alloc", 0) - stats0.get("num_device_alloc", 0),
                   "step_ms": [round(x, 3) for x in steps]}
            result["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "step_ms"}), flush=True)
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
