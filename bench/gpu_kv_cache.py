"""Where the full-scale generation time goes: transformers' KV cache and attention kernel at 296 x 1,024 tokens.

The full-scale run (bench/RESULTS.md, "Full scale on one H100") spends ~60% of its time in the two generate
stages: 296 rows x 1,024 new tokens through `model.generate` with the default `DynamicCache` and SDPA. This script
generates exactly that workload (random-init Llama-3-8B shape, bf16, left-padded prompts, the watermark processor
of the default scheme choosing every token) under several cache/attention settings and reports the wall time of
each, so the lever is measured rather than guessed:

* ``dynamic-sdpa``: what the stages do today (the cache grows by concatenation; with a padding mask SDPA gets
  K/V repeated to all 32 query heads);
* ``static-sdpa``: `cache_implementation="static"` (pre-allocated cache; transformers then compiles the decode
  step with torch.compile);
* ``static-flex``: the same with `attn_implementation="flex_attention"` (grouped-query attention without the
  repeat, masks as block masks).

    PYTHONPATH=. python3 bench/gpu_kv_cache.py --batch 296 --new-tokens 1024 --settings dynamic-sdpa,static-sdpa \\
        --out DIR

Each setting runs once (a warm-up of 16 tokens first, so one-time compilation is reported separately); the
tokens of each setting are compared with the first setting's (bf16 kernels may differ in the last bit, which
can flip a choice; the share of equal tokens is reported, not asserted).
"""

from __future__ import annotations

import json
import os
import time

import torch
import typer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, LogitsProcessorList

from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)
SETTINGS = {
    "dynamic-sdpa": dict(attn="sdpa", cache=None),
    "static-sdpa": dict(attn="sdpa", cache="static"),
    "static-flex": dict(attn="flex_attention", cache="static"),
    # SDPA told to use grouped-query attention even with a padding mask (transformers only does it without a
    # mask, fearing the math kernel): no repeat of K/V to 32 heads.
    "dynamic-sdpa-gqa": dict(attn="sdpa", cache=None, gqa=True),
}


def main(batch: int = 296, new_tokens: int = 1024, prompt_min: int = 48, prompt_max: int = 96,
         settings: str = "dynamic-sdpa,static-sdpa", layers: int = 32, out: str = "",
         device: str = "cuda", profile_steps: int = 0, check_logits: bool = False) -> None:
    """``profile_steps`` > 0: instead of timing whole runs, profile that many decode steps of the first setting at
    the end of the context (prompts of ``prompt_min``..``prompt_max`` tokens, e.g. ~1,000) with torch.profiler and
    print the CUDA kernels that take the time."""
    cfg = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers}, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    # Left-padded prompts of varied length, as the generate stage makes them.
    lengths = torch.randint(prompt_min, prompt_max + 1, (batch,)).tolist()
    width = max(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, cfg.vocab_size, (n,))
        mask[row, width - n:] = 1
    ids, mask = ids.to(device), mask.to(device)
    if check_logits:  # the same attention? one padded forward pass with and without mmw's GQA switch
        from mmw.engines.attention import grouped_query_sdpa

        model.set_attn_implementation("sdpa")
        with torch.inference_mode():
            plain = model(input_ids=ids[:16], attention_mask=mask[:16]).logits[:, -1].float()
            with grouped_query_sdpa(model):
                gqa = model(input_ids=ids[:16], attention_mask=mask[:16]).logits[:, -1].float()
        check = dict(max_abs_diff=float((plain - gqa).abs().max()), logit_scale=float(plain.abs().max()),
                     argmax_equal=float((plain.argmax(-1) == gqa.argmax(-1)).float().mean()))
        print("check_logits", json.dumps(check), flush=True)
        return
    spec = SchemeSpec.from_params(dict(sampler="distribution_shift", randomness="window", window=1, delta=5.0,
                                       score="sum"))
    result: dict = dict(gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                        batch=batch, new_tokens=new_tokens, prompt_tokens=sum(lengths), settings={})
    reference = None
    import transformers.integrations.sdpa_attention as sdpa_attention

    original_gqa = sdpa_attention.use_gqa_in_sdpa
    for name in settings.split(","):
        setting = SETTINGS[name]
        model.set_attn_implementation(setting["attn"])
        import transformers.integrations.sdpa_attention as sdpa_attention

        sdpa_attention.use_gqa_in_sdpa = (lambda mask, key, value: True) if setting.get("gqa") else original_gqa

        def run(new: int) -> tuple[float, torch.Tensor]:
            config = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                                      pad_token_id=0, cache_implementation=setting["cache"])
            processor = WatermarkProcessor(spec, 1234, cfg.vocab_size, list(range(batch)), 0.7)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.inference_mode():
                output = model.generate(ids, attention_mask=mask, generation_config=config,
                                        logits_processor=LogitsProcessorList([processor]))
            torch.cuda.synchronize()
            return time.perf_counter() - t0, output[:, width:]

        if profile_steps:
            run(4)  # warm-up (compilation, cache allocation)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                wall, _ = run(profile_steps)
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
            print(f"{name}: {profile_steps} steps (prefill included) in {wall:.2f} s\n{table}", flush=True)
            if out:
                with open(os.path.join(out, f"profile_{name}.txt"), "w") as handle:
                    handle.write(table)
            return
        row: dict = {}
        try:
            row["warmup_16_s"], _ = run(16)
            wall, tokens = run(new_tokens)
            row.update(wall_s=round(wall, 1), tokens_per_s=round(batch * new_tokens / wall),
                       step_ms=round(1e3 * wall / new_tokens, 1),
                       peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1))
            if reference is None:
                reference = tokens
            else:
                row["tokens_equal_first"] = float((tokens == reference).float().mean())
        except Exception as err:  # noqa: BLE001 - a setting that fails is a result, the others still run
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        result["settings"][name] = row
        print(name, json.dumps(row), flush=True)
        if out:
            with open(os.path.join(out, "gpu_kv_cache.json"), "w") as handle:
                json.dump(result, handle, indent=1)


if __name__ == "__main__":
    typer.run(main)
