"""Is one decode forward over the static cache deterministic? Its settings, one at a time.

bench/gpu_divergence.py found two generations of the same batch (296 rows, random-init Llama-3-8B in bf16, no CUDA
graph) parting at the first decode step: identical prefill logits, then different logits in some rows, while the
teacher-forced forward without a cache repeats exactly. Here that first decode forward is repeated from a fresh
prefill (itself deterministic) ``--repeats`` times per setting, changing one thing at a time from the stage's:

* the static cache's length (``max_new_tokens``): 64 (where whole generations repeated), 128, 129 (a cache of 192,
  a multiple of 16), 192;
* the attention kernel: torch's default choice, or SDPA restricted to math, memory-efficient or cuDNN attention;
* grouped-query attention with the mask (``mmw.engines.attention.grouped_query_sdpa``) on, or off (K/V repeated);
* the mask: the decoder's boolean 4-D mask, or the same mask as an additive float one;
* the stage's decoding-step attention (``mmw.engines.attention.decode_attention``: query heads folded into each
  group's queries, memory-efficient kernel), or SDPA's own GQA choice for the step as before (cuDNN on Hopper).

Each setting also times its decode forward (median of the repeats, synchronised).

For each: how many rows' logits differ from the first repeat, the largest difference, and those rows' padding.

    PYTHONPATH=.:bench python3 bench/gpu_decode_determinism.py --out DIR
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

import torch
import typer
from gpu_repeat import KEY, stand_in_batch  # bench/ is run as scripts, not a package
from torch.nn.attention import SDPBackend, sdpa_kernel

from mmw.engines import graph_decode
from mmw.engines.attention import grouped_query_sdpa
from mmw.watermark.processor import WatermarkProcessor

BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
SETTINGS = [  # (name, max_new_tokens, backend, gqa, float mask, decode path)
    ("stage (new 128)", 128, "", True, False, True),
    ("stage, new 64", 64, "", True, False, True),
    ("stage, new 192", 192, "", True, False, True),
    ("stage, new 1024", 1024, "", True, False, True),
    ("stage, float mask", 128, "", True, True, True),
    ("GQA through SDPA (new 128)", 128, "", True, False, False),
    ("GQA through SDPA, new 64", 64, "", True, False, False),
    ("GQA through SDPA, new 129 (cache 192)", 129, "", True, False, False),
    ("GQA through SDPA, new 192", 192, "", True, False, False),
    ("GQA through SDPA, new 1024", 1024, "", True, False, False),
    ("GQA through SDPA, math", 128, "math", True, False, False),
    ("GQA through SDPA, efficient", 128, "efficient", True, False, False),
    ("GQA through SDPA, cudnn", 128, "cudnn", True, False, False),
    ("no gqa", 128, "", False, False, False),
    ("math, no gqa", 128, "math", False, False, False),
    ("GQA through SDPA, float mask", 128, "", True, True, False),
]


def main(rows: int = 296, repeats: int = 4, smoke: bool = False, only: str = typer.Option(
        "", help="settings to run, separated by ';'"), out: str = "") -> None:
    model, cfg, tok, prompts, spec = stand_in_batch(rows, smoke)
    device = model.device.type
    batch = tok.pad({"input_ids": prompts}, padding=True, padding_side="left", return_tensors="pt")
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    padding = (mask == 0).sum(-1).tolist()
    results: list[dict] = []

    def first_forward(name: str, new: int, backend: str, gqa: bool, float_mask: bool,
                      decode: str = "efficient") -> tuple[list, list, list]:
        """``repeats`` x (the first decode forward's float32 logits [B, V]); for the stage's setting, how the
        prefill's cache of each repeat compares with the first; the forward's seconds."""
        logits, caches, cache_diffs, seconds = [], [], [], []
        for _ in range(repeats):
            with ExitStack() as stack, torch.inference_mode():
                if backend:
                    stack.enter_context(sdpa_kernel([BACKENDS[backend]]))
                stack.enter_context(grouped_query_sdpa(model, decode) if gqa else nullcontext())
                proc = WatermarkProcessor(spec, KEY, cfg.vocab_size, list(range(rows)), 1.0, compiled=False)
                proc.begin_static(rows, new, ids.device, graph=False)
                dec = graph_decode._Decoder(model, ids, mask, proc, new, [1], 0)
                dec.choose(dec.prefill_scores())
                if name == SETTINGS[0][0]:  # the prefill's cache itself: does it repeat, at real and padded positions?
                    kv = torch.stack([torch.stack([layer.keys, layer.values]) for layer in dec.cache.layers])
                    if caches:
                        # [layers, 2, B, heads, L, dim] -> per (row, position): does any layer/head/dim differ
                        diff = (kv != caches[0]).any(-1).any(3).any(1).any(0)  # [B, L]
                        real = torch.zeros_like(diff)
                        real[:, : ids.shape[1]] = mask.bool()
                        cache_diffs.append({"positions_differing_real": int((diff & real).sum()),
                                            "positions_differing_padding": int((diff & ~real)[:, : ids.shape[1]].sum()),
                                            "positions_differing_after_prompt": int(diff[:, ids.shape[1]:].sum()),
                                            "rows": int(diff.any(-1).sum())})
                    else:
                        caches.append(kv)
                # dec.step's forward, without its choice
                dec.now.add_(1)
                dec.position.add_(1)
                torch.logical_and(dec.base, dec.kv_index <= dec.now, out=dec.mask2d)
                attn = dec.mask4d
                if float_mask:
                    attn = torch.zeros(attn.shape, dtype=model.dtype, device=ids.device).masked_fill_(
                        ~attn, torch.finfo(model.dtype).min)
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                o = model(input_ids=dec.token, attention_mask=attn, position_ids=dec.position,
                          past_key_values=dec.cache, use_cache=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - t0)
                logits.append(o.logits[:, -1].float())
                del dec, o
        return logits, cache_diffs, seconds

    for name, new, backend, gqa, float_mask, decode_path in SETTINGS:
        if only and name not in only.split(";"):
            continue
        try:
            logits, cache_diffs, seconds = first_forward(name, new, backend, gqa, float_mask,
                                                         "efficient" if decode_path else "sdpa")
        except RuntimeError as err:  # a restricted backend that has no kernel for this shape
            row = {"setting": name, "error": str(err)[:200]}
        else:
            first = logits[0]
            differ = sorted({r for x in logits[1:] for r in (x != first).any(-1).nonzero().flatten().tolist()})
            row = {"setting": name, "max_new_tokens": new, "cache_len": ids.shape[1] + new - 1,
                   "backend": backend or "default", "gqa": gqa, "float_mask": float_mask, "decode_path": decode_path,
                   "repeats": repeats, "forward_ms_median": round(1000 * sorted(seconds)[len(seconds) // 2], 2),
                   "rows_differing": len(differ),
                   "max_abs_difference": max(float((x - first).abs().max()) for x in logits[1:]),
                   "padding_of_rows_differing": sorted(padding[r] for r in differ)[:40],
                   "rows_with_that_padding": {p: padding.count(p) for p in sorted({padding[r] for r in differ})}}
            if cache_diffs:
                row["prefill_cache_vs_first"] = cache_diffs
        results.append(row)
        print(json.dumps(row), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_decode_determinism.json").write_text(json.dumps(
            {"rows": rows, "gpu": torch.cuda.get_device_name() if not smoke else "cpu", "torch": torch.__version__,
             "results": results}, indent=1))


if __name__ == "__main__":
    typer.run(main)
