"""Is GPU generation bit-reproducible? The same batch generated again and again, in one process and across
processes, under the stage's decode paths, on a random-init Llama-3-8B shape (bf16).

Variants (each ``--repeats`` times in this process, same prompts, seeds and key):
  graph        the stage's default on CUDA: our decode loop captured as one CUDA graph, the watermark step compiled;
  graph-eager  the same loop captured, the watermark step eager (``engine.compile_step: false``);
  loop         our decode loop without the graph (``engine.graph_decode: false``), the step compiled (by default in
               ``reduce-overhead`` mode: its own CUDA graphs);
  eager        no CUDA graph anywhere: the loop and the step eager (both false).
``--sdpa`` restricts the attention to one of torch's SDPA backends for the whole process.
Prints and writes one SHA-256 per variant and repeat over every row's tokens; run the script in two processes
(optionally with ``--deterministic``: ``torch.use_deterministic_algorithms`` and a fixed cuBLAS workspace) and
compare the digests across the files. Each generation's decode steps are timed on the device (CUDA events around
every step, ``graph_decode.STEP_EVENTS``): their median ms and their sum.

``--flex-settings '{"NAME": {"block": 128, "options": {...}, "fuse": true}, ...}'`` runs every variant under each
flex setting in turn within each repeat (interleaved rounds; ``attention.FLEX_BLOCK``,
``gpu_decode_kernels.set_flex_options``; ``"fuse"`` is params ``engine.fuse_layers``, default true), recorded as
``VARIANT@NAME`` (odd repeats run the settings in reverse order). ``--profile-at N``: torch.profiler over
``--profile-steps`` replayed decode steps from the one that has chosen N tokens (prompts of 64 tokens: 64 + N cache
positions written), every kernel of each step in order, summed by kind (``step_split``) into ``profile``
(``--profile-first``: in the first repeat only, a warm-up round).

    PYTHONPATH=.:bench python3 bench/gpu_repeat.py --label A --out DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import typer
from gpu_decode_kernels import FLEX_OPTIONS, set_flex_options  # bench/ is run as scripts, not a package
from gpu_generate import build_model
from gpu_graph import word_tokenizer

from mmw.watermark import processor as processors
from mmw.engines import attention
from mmw.engines import generate as engine
from mmw.engines import graph_decode
from mmw.params import EngineParams
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

KEY = 1234
C4 = dict(sampler="distribution_shift", randomness="window", window=1, delta=5.0, score="sum")
#: params engine.graph_decode / engine.compile_step of each variant.
VARIANTS = {"graph": {"graph_decode": True, "compile_step": True},
            "graph-eager": {"graph_decode": True, "compile_step": False},
            "loop": {"graph_decode": False, "compile_step": True},
            "eager": {"graph_decode": False, "compile_step": False}}


def stand_in_batch(rows: int, smoke: bool):
    """The determinism benches' workload: (model, config, tokenizer, prompts, C4 spec). A random-init Llama-3-8B
    shape in bf16 on CUDA (``smoke``: a 2-layer one on the CPU, decoded through the static loop there too), and
    ``rows`` prompts of 48-64 random tokens, the same in every process."""
    device = "cpu" if smoke else "cuda"
    if smoke:
        engine.CACHE_DEVICES = ("cpu", "cuda")
    model, cfg = build_model(2 if smoke else 32, 64 if smoke else 4096, device, "llama3-8b")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, cfg.vocab_size, (int(n),), generator=gen).tolist()
               for n in torch.randint(48, 65, (rows,), generator=gen)]
    return model, cfg, word_tokenizer(cfg.vocab_size), prompts, SchemeSpec.from_params(C4)


def step_split(trace: dict, steps: int) -> dict:
    """The device kernels of ``steps`` replayed decode steps (a chrome trace's events), each step's in launch order,
    summed by kind: the matrix products (the last one of a step: the lm_head), the flex decoding kernel, what runs
    between it and the next product (the split-K combine and the output's layout), everything after the lm_head (the
    float32 logits, the watermark step, the step's bookkeeping), and the rest (embedding, norms, rotary, the cache
    writes, SiLU x up, residual adds). ms per step."""
    device_kinds = ("kernel", "gpu_memcpy", "gpu_memset")
    kernels = sorted((e for e in trace.get("traceEvents", []) if e.get("cat") in device_kinds), key=lambda e: e["ts"])
    if not kernels:
        return {"kernels": 0}
    per = len(kernels) // steps

    def is_matmul(name: str) -> bool:
        low = name.lower()
        return "flex" not in low and any(k in low for k in ("nvjet", "gemm", "cutlass", "xmma", "sm90_", "matmul"))

    kinds: dict[str, float] = {}
    top: dict[str, list] = {}
    spans = []
    for i in range(steps):
        step = kernels[i * per:(i + 1) * per]
        spans.append((step[-1]["ts"] + step[-1]["dur"] - step[0]["ts"]) / 1000)
        last_mm = max(j for j, e in enumerate(step) if is_matmul(e["name"]))
        after_flex = False
        for j, e in enumerate(step):
            name = e["name"]
            if is_matmul(name):
                kind, after_flex = ("lm_head matmul" if j == last_mm else "matmuls (layers)"), False
            elif j > last_mm:
                kind = "after lm_head: float32 logits, watermark step, bookkeeping"
            elif "flex" in name.lower() or name.startswith("triton_tem"):
                kind, after_flex = "attention: flex decoding kernel", True
            elif after_flex:
                kind = "attention: combine + output layout"
            else:
                kind = "elementwise in the layers: embedding, norms, rotary, cache writes, SiLU, residuals"
            kinds[kind] = kinds.get(kind, 0.0) + e["dur"] / 1000 / steps
            entry = top.setdefault(name[:100], [0, 0.0, kind])
            entry[0] += 1
            entry[1] += e["dur"] / 1000 / steps
    return {"kernels": len(kernels), "kernels_per_step": per, "steps": steps,
            "busy_ms_per_step": round(sum(kinds.values()), 3), "span_ms_per_step": [round(s, 3) for s in spans],
            "ms_per_step": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top": sorted(([round(v[1], 3), v[0] // steps, k, v[2]] for k, v in top.items()), reverse=True)[:30]}


def profile_replays(at: int, steps: int, sink: dict, enabled: list[bool]) -> None:
    """Profile (torch.profiler, CUDA kernels) the replays of the captured decode step for the ``steps`` steps from
    the one after ``at`` chosen tokens, in every generation of the process while ``enabled[0]``; results into
    ``sink`` by generation."""
    original = graph_decode._capture

    class Profiled:
        def __init__(self, graph):
            self.graph, self.replays, self.prof = graph, 0, None

        def pool(self):
            return self.graph.pool()

        def replay(self):
            self.replays += 1
            done = graph_decode.WARMUP_STEPS + self.replays  # the first replay is the step after WARMUP_STEPS + 1
            if done == at and enabled[0]:
                torch.cuda.synchronize()
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                self.prof.__enter__()
            self.graph.replay()
            if self.prof is not None and done == at + steps - 1:
                torch.cuda.synchronize()
                self.prof.__exit__(None, None, None)
                with tempfile.TemporaryDirectory() as folder:
                    path = os.path.join(folder, "trace.json")
                    self.prof.export_chrome_trace(path)
                    split = step_split(json.loads(Path(path).read_text()), steps)
                split["at_tokens"] = at
                split["flex_block"], split["flex_options"] = attention.FLEX_BLOCK, dict(FLEX_OPTIONS)
                sink[str(len(sink))] = split
                print("profile", json.dumps(split), flush=True)
                self.prof = None

    def capture(dec, pool=None):
        graph = original(dec, pool)
        return None if graph is None else Profiled(graph)

    graph_decode._capture = capture


def main(label: str = "A", rows: int = 296, new_tokens: int = 128, repeats: int = 3, deterministic: bool = False,
         variants: str = ",".join(VARIANTS), sdpa: str = typer.Option("", help="restrict SDPA to one backend: "
                                                                        "cudnn | efficient | flash | math"),
         decode: str = typer.Option("efficient", help="a decoding step's attention (engine.decode_attention): "
                                    "efficient (the stage's) | sdpa (SDPA's own GQA kernel, cuDNN on Hopper)"),
         key_bucket: int = typer.Option(0, help="bound the decoding attention's reads to the written cache positions "
                                            "rounded up to this many (graph_decode.KEY_BUCKET; 0: the whole cache)"),
         between: int = typer.Option(0, help="between two repeats, generate this many of the prompts with half the "
                                        "new tokens (another batch and cache shape): the repeats must not depend "
                                        "on what the process ran before"),
         flex_dynamic: bool = typer.Option(False, help="compile flex_decode for dynamic shapes (attention.FLEX_DYNAMIC)"),
         flex_settings: str = typer.Option("", help="JSON {NAME: {block, options}}: each repeat runs every "
                                            "variant under each (attention.FLEX_BLOCK / kernel_options)"),
         profile_at: int = typer.Option(0, help="profile the replayed decode steps from the one after N tokens"),
         profile_steps: int = 3,
         profile_first: bool = typer.Option(False, help="profile only in the first repeat (a warm-up round)"),
         smoke: bool = False, out: str = "") -> None:
    graph_decode.KEY_BUCKET = key_bucket or None
    attention.FLEX_DYNAMIC = flex_dynamic
    settings_of = json.loads(flex_settings) if flex_settings else {"": None}
    profiled: dict = {}
    profiling = [True]
    if profile_at:
        profile_replays(profile_at, profile_steps, profiled, profiling)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    model, cfg, tok, prompts, spec = stand_in_batch(rows, smoke)
    result = {"label": label, "deterministic": deterministic, "rows": rows, "new_tokens": new_tokens,
              "gpu": torch.cuda.get_device_name() if not smoke else "cpu", "torch": torch.__version__,
              "decode": decode, "key_bucket": key_bucket, "between": between, "flex_dynamic": flex_dynamic,
              "flex_settings": settings_of, "digests": {}, "seconds": {}, "step_ms_median": {},
              "steps_device_s": {}, "profile": profiled}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    if sdpa:
        # for the whole process; kept in a name: a generator context left unreferenced is collected at once and
        # restores the previous backends on exit (which is what an earlier version of this line did)
        restriction = sdpa_kernel([backends[sdpa]])
        restriction.__enter__()
        result["sdpa"] = sdpa
    for name in variants.split(","):
        settings = EngineParams(decode_attention=decode, **VARIANTS[name])
        compiled = None if settings.compile_step else False
        processors.watermark_step.cache_clear()
        for repeat in range(repeats):
            profiling[0] = not (profile_first and repeat)
            if between and repeat:
                other = WatermarkProcessor(spec, KEY, cfg.vocab_size, list(range(between)), 1.0, compiled)
                engine.generate_batch(model, tok, prompts[:between], other, max(new_tokens // 2, 1), settings)
                if hasattr(model, "_cache"):
                    del model._cache
            order = list(settings_of.items())
            for setting_name, setting in (order[::-1] if repeat % 2 else order):  # ABBA: no side always first
                key = f"{name}@{setting_name}" if setting_name else name
                if setting is not None:
                    attention.FLEX_BLOCK = setting.get("block", 128)
                    set_flex_options(setting.get("options", {}))
                run_settings = settings.model_copy(update={"fuse_layers": bool((setting or {}).get("fuse", True))})
                proc = WatermarkProcessor(spec, KEY, cfg.vocab_size, list(range(rows)), 1.0, compiled)
                graph_decode.STEP_EVENTS = [] if not smoke else None
                t0 = time.perf_counter()
                cols = engine.generate_batch(model, tok, prompts, proc, new_tokens, run_settings)
                digest = hashlib.sha256(json.dumps(cols["tokens"]).encode()).hexdigest()[:16]
                if hasattr(model, "_cache"):
                    del model._cache
                second = round(time.perf_counter() - t0, 2)
                result["digests"].setdefault(key, []).append(digest)
                result["seconds"].setdefault(key, []).append(second)
                if graph_decode.STEP_EVENTS:
                    torch.cuda.synchronize()
                    steps = [start.elapsed_time(end) for start, end in graph_decode.STEP_EVENTS]
                    result["step_ms_median"].setdefault(key, []).append(round(statistics.median(steps), 3))
                    result["steps_device_s"].setdefault(key, []).append(round(sum(steps) / 1000, 3))
                graph_decode.STEP_EVENTS = None
                print(label, key, digest, f"{second:.1f} s", "step ms", result["step_ms_median"].get(key, ["-"])[-1],
                      flush=True)
                if out:  # after every generation: a run stopped at its time limit keeps what it measured
                    Path(out).mkdir(parents=True, exist_ok=True)
                    Path(out, f"gpu_repeat_{label}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"gpu_repeat_{label}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
