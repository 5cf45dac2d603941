"""The generation engine against plain HF ``generate`` on one card: where the gap between them comes from.

Same model (random-init Llama-3-8B shape, bf16), same batch, same number of new tokens, in one process, so the
ratios hold on whatever card runs it. Variants (``--variants``, comma-separated):

* ``plain-nopad``: HF sampling (``do_sample=True``), prompts of one length, no padding mask, no processor — the
  reference shape of plain ``generate``;
* ``plain-pad``: the same with prompts of ``prompt_min``..``prompt_max`` tokens, left-padded (a padding mask);
* ``plain-pad-gqa``: ``plain-pad`` with mmw's grouped-query SDPA switch (``mmw.engines.attention``);
* ``engine``: ``mmw.engines.generate.generate_batch`` as the generate stage calls it (left padding, the switch,
  the C4 watermark processor choosing every token, greedy); ``engine-eager``: the same with the processor
  uncompiled; ``engine-nopad``: the engine on prompts of one length; ``engine-dynamic``: the engine with
  transformers' default growing cache (``DynamicCache``) instead of the pre-allocated one; ``engine-compiled``:
  the engine with transformers' compiled decoding step (``mmw.engines.generate.COMPILE_DECODING``; under
  ``--long`` its compile is inside the time, as in a stage);
* ``plain-nopad-flash``: ``plain-nopad`` with SDPA restricted to the flash kernel (no mask, so it applies).

``--profile VARIANT[,VARIANT]``: torch.profiler over ``--profile-steps`` decode steps of those variants (steps
counted by a no-op logits processor, so the prefill stays out), the kernels that take the GPU time.
``--long VARIANT[,VARIANT]``: those variants again at ``--long-tokens`` new tokens (e.g. the full 1,024).

    PYTHONPATH=. python3 bench/gpu_gap.py --tokenizer DIR --batch 296 --new-tokens 256 \\
        --variants plain-nopad,plain-pad,engine --profile plain-nopad,engine --long plain-nopad,engine --out DIR
"""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import typer
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM, LogitsProcessor, \
    LogitsProcessorList

from mmw.engines.attention import grouped_query_sdpa
from mmw.engines.generate import generate_batch
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)
C4 = dict(sampler="distribution_shift", randomness="window", window=1, delta=5.0, score="sum")


class StepHook(LogitsProcessor):
    """Calls ``hook()`` once per decoding step and leaves the scores alone."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, input_ids, scores):
        self.hook()
        return scores


def main(tokenizer: Path = Path(".gpu/tokenizer"), batch: int = 296, new_tokens: int = 256, prompt_min: int = 48,
         prompt_max: int = 96, variants: str = "plain-nopad,plain-pad,plain-pad-gqa,engine",
         profile: str = "", profile_steps: int = 8, profile_context: int = 512, long: str = "",
         long_tokens: int = 1024, layers: int = 32, device: str = "cuda", out: str = "") -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers}, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.set_attn_implementation("sdpa")
    result: dict = dict(gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                        batch=batch,
                        new_tokens=new_tokens, model_init_s=round(time.perf_counter() - t0, 1), runs=[])
    vocab = len(tok)
    spec = SchemeSpec.from_params(C4)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(prompt_min, prompt_max + 1, (batch,), generator=gen).tolist()
    padded = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lengths]
    mean_len = round(sum(lengths) / batch)
    equal = [torch.randint(1, vocab, (mean_len,), generator=gen).tolist() for _ in range(batch)]

    def save() -> None:
        if out:
            Path(out, "gpu_gap.json").write_text(json.dumps(result, indent=1))

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def run(variant: str, n_new: int, prompts=None, extra=()) -> float:
        """Seconds for one generation of ``n_new`` tokens per row (synchronized)."""
        nopad = variant.endswith("nopad")
        rows = prompts if prompts is not None else (equal if nopad else padded)
        sync()
        start = time.perf_counter()
        if variant.startswith("engine"):
            import mmw.engines.generate as engine

            saved, saved_compile = engine.CACHE_IMPLEMENTATION, engine.COMPILE_DECODING
            if variant == "engine-dynamic":
                engine.CACHE_IMPLEMENTATION = None
            engine.COMPILE_DECODING = variant == "engine-compiled"
            processor = WatermarkProcessor(spec, 1234, vocab, list(range(batch)), 0.7,
                                           compiled=False if variant == "engine-eager" else None)
            if extra:
                processor = _Chain(processor, extra)
            try:
                generate_batch(model, tok, rows, processor, n_new)
            finally:
                engine.CACHE_IMPLEMENTATION, engine.COMPILE_DECODING = saved, saved_compile
        else:
            enc = tok.pad({"input_ids": rows}, padding=True, padding_side="left", return_tensors="pt")
            ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            config = GenerationConfig(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=True, top_k=0,
                                      eos_token_id=None, pad_token_id=tok.pad_token_id)
            switch = grouped_query_sdpa(model) if variant.endswith("gqa") else nullcontext()
            if variant.endswith("flash"):
                from torch.nn.attention import SDPBackend, sdpa_kernel

                switch = sdpa_kernel([SDPBackend.FLASH_ATTENTION])
            with torch.inference_mode(), switch:
                model.generate(ids, attention_mask=None if nopad else mask, generation_config=config,
                               logits_processor=LogitsProcessorList(list(extra)))
        sync()
        return time.perf_counter() - start

    for variant in [v for v in variants.split(",") if v]:
        try:
            run(variant, 8)  # warm-up: compilation, allocator
            wall = run(variant, new_tokens)
        except Exception as err:  # noqa: BLE001 - a variant that fails is a result, the others still run
            result["runs"].append(dict(variant=variant, error=f"{type(err).__name__}: {str(err)[:300]}"))
            print(result["runs"][-1], flush=True)
            continue
        row = dict(variant=variant, new_tokens=new_tokens, wall_s=round(wall, 2),
                   tokens_per_s=round(batch * new_tokens / wall), step_ms=round(1e3 * wall / new_tokens, 1))
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
        save()

    for variant in [v for v in profile.split(",") if v]:
        from torch.profiler import ProfilerActivity, profile as torch_profile, schedule

        long_rows = [torch.randint(1, vocab, (profile_context,), generator=gen).tolist() for _ in range(batch)]
        if not variant.endswith("nopad"):  # keep the padding: a few pad positions per row
            long_rows = [r[: profile_context - (i % 32)] for i, r in enumerate(long_rows)]
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                           schedule=schedule(wait=2, warmup=2, active=profile_steps)) as prof:
            wall = run(variant, 4 + profile_steps + 1, prompts=long_rows, extra=(StepHook(prof.step),))
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70)
        print(f"== profile {variant}: {profile_steps} decode steps at ~{profile_context} tokens of context\n{table}",
              flush=True)
        if out:
            Path(out, f"profile_{variant}.txt").write_text(table)
        torch.cuda.empty_cache()

    for variant in [v for v in long.split(",") if v]:
        try:
            wall = run(variant, long_tokens)
        except Exception as err:  # noqa: BLE001 - a variant that fails is a result, the others still run
            result["runs"].append(dict(variant=variant, new_tokens=long_tokens,
                                       error=f"{type(err).__name__}: {str(err)[:300]}"))
            print(result["runs"][-1], flush=True)
            save()
            continue
        row = dict(variant=variant, new_tokens=long_tokens, wall_s=round(wall, 2),
                   tokens_per_s=round(batch * long_tokens / wall), step_ms=round(1e3 * wall / long_tokens, 1),
                   peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1) if device == "cuda" else None)
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        save()


class _Chain:
    """The engine's processor followed by extra hooks (for profiling the engine's own loop)."""

    def __init__(self, processor, extra):
        self.processor, self.extra = processor, extra

    def __call__(self, input_ids, scores):
        for hook in self.extra:
            hook(input_ids, scores)
        return self.processor(input_ids, scores)

    def mean_entropy(self, lengths):
        return self.processor.mean_entropy(lengths)

    def mean_spike_entropy(self, lengths):
        return self.processor.mean_spike_entropy(lengths)


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    typer.run(main)
