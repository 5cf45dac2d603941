"""The generate stage's decode loop before (transformers' ``generate`` over the static cache) and after
(``mmw.engines.graph_decode``: our loop, the whole step one CUDA graph), on one card, in one process.

Three parts, all through ``mmw.engines.generate.generate_batch`` (the stage's own call), random-init Llama-3-8B
shape in bf16, a word-level tokenizer over its 128,256 ids:

* ``check``: tokens of ``generate`` vs our loop run eagerly vs our loop captured, on a small padded batch, for
  plain sampling, the C4 scheme of params-full.yaml and the tournament (m = 30, window 4);
* ``long``: 296 rows x ``--long-tokens`` new tokens (prompts of 48-64 tokens, left padded), the C4 scheme:
  before vs after, one run each after a short warm-up; the after run's GPU time per step from CUDA events;
* ``tournament``: issue 32's comparison at batch 296, 64-token prompts, ``--tour-tokens`` new tokens: HF plain
  sampling, HF's SynthID processor, mmw's tournament through ``generate`` (before) and through our loop (after),
  mmw's plain and C4 through our loop; median of ``--rounds`` interleaved rounds after a warm-up.

    PYTHONPATH=. python3 bench/gpu_graph.py --out DIR
"""

from __future__ import annotations

import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import typer
from tokenizers import Tokenizer, models
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedTokenizerFast, \
    SynthIDTextWatermarkingConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_generate import build_model  # noqa: E402

from mmw.engines import generate as engine  # noqa: E402
from mmw.engines import graph_decode  # noqa: E402
from mmw.params import EngineParams  # noqa: E402
from mmw.watermark.processor import WatermarkProcessor  # noqa: E402
from mmw.watermark.scheme import SchemeSpec  # noqa: E402

KEY = 1234
SPECS = {
    "plain": None,
    "C4 (params-full)": dict(sampler="distribution_shift", randomness="window", window=1, delta=5.0, score="sum"),
    "tournament m30 w4": dict(sampler="tournament", layers=30, randomness="window", window=4, score="sum"),
}
SYNTHID_KEYS = [654, 400, 836, 123, 340, 443, 597, 160, 57, 29, 590, 639, 13, 715, 468, 990, 966, 226, 324, 585,
                118, 504, 402, 542, 104, 23, 471, 982, 341, 867]


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    words = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<unk>")),
                                  pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    return tok


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free(model) -> None:
    """Drop transformers' kept static cache (it would hold ~40 GB between calls)."""
    for name in ("_cache",):
        if hasattr(model, name):
            delattr(model, name)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_run(model, tok, prompts, spec_name, new, static: bool, graph: bool = True):
    settings = EngineParams(static_decode=static, graph_decode=graph)  # params engine:
    spec = SchemeSpec.from_params(SPECS[spec_name]) if SPECS[spec_name] else None
    proc = WatermarkProcessor(spec, KEY, model.config.vocab_size, list(range(len(prompts))), 1.0)
    sync()
    t0 = time.perf_counter()
    cols = engine.generate_batch(model, tok, prompts, proc, new, settings)
    sync()
    wall = time.perf_counter() - t0
    free(model)
    return wall, cols


def main(out: str = "", check_rows: int = 16, check_tokens: int = 64, long_tokens: int = 1024,
         tour_tokens: int = 128, rounds: int = 2, parts: str = "check,long,tournament", batch: int = 296,
         smoke: bool = typer.Option(False, help="CPU smoke run: 2 layers of width 64, static cache on the CPU")
         ) -> None:
    device = "cpu" if smoke else "cuda"
    if smoke:
        engine.CACHE_DEVICES = ("cpu", "cuda")
    result: dict = dict(gpu=torch.cuda.get_device_name() if not smoke else "cpu", torch=torch.__version__,
                        date=time.strftime("%F %T"), alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))

    def save():
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, "gpu_graph.json").write_text(json.dumps(result, indent=1))

    import transformers
    result["transformers"] = transformers.__version__
    model, cfg = build_model(2 if smoke else 32, 64 if smoke else 4096, device, "llama3-8b")
    tok = word_tokenizer(cfg.vocab_size)
    gen = torch.Generator().manual_seed(0)

    def prompts_of(n, lo, hi):
        lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
        return [torch.randint(3, cfg.vocab_size, (m,), generator=gen).tolist() for m in lengths]

    if "check" in parts:
        prompts = prompts_of(check_rows, 40, 64)
        checks = {}
        for name in SPECS:
            _, ref = engine_run(model, tok, prompts, name, check_tokens, static=False)
            _, eager = engine_run(model, tok, prompts, name, check_tokens, static=True, graph=False)
            _, graphed = engine_run(model, tok, prompts, name, check_tokens, static=True, graph=True)

            def same(a, b):
                pos = [x == y for ra, rb in zip(a["tokens"], b["tokens"]) for x, y in zip(ra, rb)]
                return dict(rows_equal=sum(ra == rb for ra, rb in zip(a["tokens"], b["tokens"])) / len(prompts),
                            positions_equal=sum(pos) / max(len(pos), 1),
                            entropy_max_diff=max(abs((x or 0) - (y or 0)) for x, y in
                                                 zip(a["mean_entropy"], b["mean_entropy"])))
            checks[name] = {"eager_vs_generate": same(eager, ref), "graph_vs_eager": same(graphed, eager),
                            "graph_vs_generate": same(graphed, ref)}
            print("check", name, json.dumps(checks[name]), flush=True)
        result["check"] = checks
        save()

    if "long" in parts:
        prompts = prompts_of(batch, 48, 64)
        for static in (False, True):  # warm-up: compile the step at this batch shape, build plans
            engine_run(model, tok, prompts, "C4 (params-full)", 8, static=static)
        long = {}
        for label, static in (("after: graph loop", True), ("before: generate", False)):
            graph_decode.STEP_EVENTS = [] if static else None
            wall, cols = engine_run(model, tok, prompts, "C4 (params-full)", long_tokens, static=static)
            row = dict(wall_s=wall, tokens=sum(cols["n_tokens"]), mean_n_tokens=statistics.mean(cols["n_tokens"]))
            if static:
                sync()
                ms = [s.elapsed_time(e) for s, e in graph_decode.STEP_EVENTS[4:]] or [float("nan")]
                row.update(gpu_ms_per_step_median=statistics.median(ms), steps=len(graph_decode.STEP_EVENTS) + 1,
                           gpu_ms_per_step_p90=sorted(ms)[int(0.9 * len(ms))])
                graph_decode.STEP_EVENTS = None
            row["wall_ms_per_step"] = 1e3 * wall / long_tokens
            long[label] = row
            long.setdefault("_tokens", {})[label] = cols["tokens"]
            print("long", label, json.dumps(row), flush=True)
        toks = long.pop("_tokens")
        a, b = toks["after: graph loop"], toks["before: generate"]
        long["rows_equal"] = sum(x == y for x, y in zip(a, b)) / len(a)
        long["positions_equal"] = sum(u == v for x, y in zip(a, b) for u, v in zip(x, y)) / sum(map(len, a))
        result["long"] = dict(batch=batch, new_tokens=long_tokens, **long)
        print("long equal", long["rows_equal"], long["positions_equal"], flush=True)
        save()

    if "tournament" in parts:
        torch.manual_seed(batch)
        ids = torch.randint(3, cfg.vocab_size, (batch, 64), device=device)
        prompts = ids.tolist()
        base = dict(max_new_tokens=tour_tokens, min_new_tokens=tour_tokens, eos_token_id=None, pad_token_id=0)
        hf = {"plain sampling (HF generate)": GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                                               **base),
              "HF SynthID (processor)": GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, **base,
                                                         watermarking_config=SynthIDTextWatermarkingConfig(
                                                             ngram_len=5, keys=SYNTHID_KEYS))}
        mmw = {"mmw tournament, generate loop (before)": ("tournament m30 w4", False),
               "mmw tournament, graph loop (after)": ("tournament m30 w4", True),
               "mmw plain, graph loop": ("plain", True),
               "mmw C4, graph loop": ("C4 (params-full)", True)}

        def run(name):
            if name in hf:
                sync()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=copy.deepcopy(hf[name]))
                sync()
                wall = time.perf_counter() - t0
                free(model)
                return wall
            spec, static = mmw[name]
            return engine_run(model, tok, prompts, spec, tour_tokens, static=static)[0]

        rows = {name: dict(warmup_s=run(name), walls=[]) for name in (*hf, *mmw)}
        for _ in range(rounds):
            for name in rows:
                rows[name]["walls"].append(run(name))
        graph_decode.STEP_EVENTS = []
        for name in ("mmw plain, graph loop", "mmw tournament, graph loop (after)"):
            graph_decode.STEP_EVENTS = []
            run(name)
            sync()
            ms = [s.elapsed_time(e) for s, e in graph_decode.STEP_EVENTS[4:]] or [float("nan")]
            rows[name]["gpu_ms_per_step_median"] = statistics.median(ms)
        graph_decode.STEP_EVENTS = None
        plain = statistics.median(rows["plain sampling (HF generate)"]["walls"])
        plain_ours = statistics.median(rows["mmw plain, graph loop"]["walls"])
        for name, row in rows.items():
            wall = statistics.median(row["walls"])
            row.update(wall_s=wall, tokens_per_s=batch * tour_tokens / wall, vs_hf_plain=plain / wall,
                       vs_mmw_plain_graph=plain_ours / wall, step_ms=1e3 * wall / tour_tokens)
        result["tournament"] = dict(batch=batch, new_tokens=tour_tokens, prompt_len=64, rows=rows)
        save()
        print(f"\nB={batch}, {tour_tokens} new tokens, {result['gpu']}")
        for name, row in rows.items():
            print(f"{name:42s} {row['tokens_per_s']:8.0f} tok/s  x{row['vs_hf_plain']:.3f} HF plain  "
                  f"x{row['vs_mmw_plain_graph']:.3f} mmw plain  {row['step_ms']:7.2f} ms/step "
                  f"{row.get('gpu_ms_per_step_median', float('nan')):7.2f} GPU ms", flush=True)
    save()


if __name__ == "__main__":
    typer.run(main)
