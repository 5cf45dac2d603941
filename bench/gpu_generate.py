"""Generation throughput with each watermark on a GPU, side by side with plain sampling and HF's own watermarks.

The GPU machine cannot receive real 7B weights, so the model is a randomly initialised Llama-2-7B-shaped network in
bf16: timings hold, text quality does not. For every batch size, one process measures tokens/s of HF ``generate``:

- plain sampling (``do_sample=True``, no processor): the baseline every ratio is taken against;
- HF's ``WatermarkLogitsProcessor`` (KGW) and ``SynthIDTextWatermarkLogitsProcessor`` (via ``watermarking_config``);
- mmw's processor for each sampler (compiled on CUDA, the default), and for plain sampling through it.

Each configuration runs once to warm up (compilation, caches) — that run also times the processor's own work per
step with CUDA events, no sync inside the loop — then ``--rounds`` timed rounds, interleaved across
configurations; the median is reported. A short check compares every mmw scheme's tokens compiled vs eager, and a
sync-debug pass proves the processor makes no host sync.

    PYTHONPATH=. python3 bench/gpu_generate.py --batches 64,296 --new-tokens 128 --rounds 2 --out DIR

Plain sampling vs the tournament sampler vs HF's SynthID processor (same m = 30, n-gram 5), Llama-3-8B shape,
batch 296 (a CPU smoke run of the same code: ``--device cpu --hidden 64 --layers 2 --batches 4 --new-tokens 8``):

    PYTHONPATH=. python3 bench/gpu_generate.py --shape llama3-8b --batches 296 --new-tokens 128 --rounds 2 \
        --only tournament --out DIR
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
import warnings

import torch
import typer
from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, LogitsProcessorList,
                          SynthIDTextWatermarkingConfig, WatermarkingConfig)

from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

MMW_SCHEMES = {
    "mmw none (plain, via processor)": None,
    "mmw C4 distribution shift, window 1": dict(sampler="distribution_shift", delta=2.0, randomness="window",
                                               window=1, score="sum"),
    "mmw C1 exponential, window 3": dict(sampler="exponential", randomness="window", window=3, score="sum"),
    "mmw C2 inverse transform, window 1": dict(sampler="inverse_transform", randomness="window", window=1,
                                              score="sum"),
    "mmw C3 binary (huffman), window 1": dict(sampler="binary", randomness="window", window=1, score="sum"),
    "mmw C1 exponential, fixed key 256": dict(sampler="exponential", randomness="fixed", key_length=256,
                                             score="align"),
    # SynthID-Text's deployed setting, as the HF SynthID row: m = 30 layers, n-gram 5 (window 4), 2 leaves.
    "mmw tournament (SynthID), window 4": dict(sampler="tournament", layers=30, randomness="window", window=4,
                                               score="sum"),
}
HF_ROWS = ("plain sampling (HF, no processor)", "HF KGW (WatermarkLogitsProcessor)", "HF SynthID")
KEY = 1234


class EventTimed(WatermarkProcessor):
    """Records a CUDA event pair around each call (no sync): the processor's own GPU span per step; and the host
    time of each call (launch cost). Read once at the end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.host_s: list[float] = []

    def __call__(self, input_ids, scores):
        if scores.device.type != "cuda":  # CPU smoke runs of this script: host time only
            t0 = time.perf_counter()
            out = super().__call__(input_ids, scores)
            self.host_s.append(time.perf_counter() - t0)
            return out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        out = super().__call__(input_ids, scores)
        end.record()
        self.host_s.append(time.perf_counter() - t0)
        self.events.append((start, end))
        return out

    def per_step_ms(self, skip: int = 3) -> tuple[float, float]:
        """Median GPU span and host time per step (ms), after the first ``skip`` steps (compilation)."""
        sync()
        gpu = [s.elapsed_time(e) for s, e in self.events[skip:]] or [float("nan")]
        return statistics.median(gpu), 1e3 * statistics.median(self.host_s[skip:])


class SyncChecked(WatermarkProcessor):
    """Counts host syncs inside the processor (torch's sync debug mode, warn level, around each call only)."""

    syncs = 0

    def __call__(self, input_ids, scores):
        if scores.device.type != "cuda":
            return super().__call__(input_ids, scores)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = super().__call__(input_ids, scores)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        SyncChecked.syncs += sum("synchroniz" in str(w.message).lower() for w in caught)
        return out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


#: Model shapes: (MLP width per 4096 of hidden, key/value heads, vocabulary).
SHAPES = {"llama2-7b": (11008, 32, 32000), "llama3-8b": (14336, 8, 128256)}


def build_model(layers: int, hidden: int, device: str, shape: str = "llama2-7b") -> tuple[LlamaForCausalLM, LlamaConfig]:
    """Llama-2-7B's shape (hidden 4096, 32 heads, MLP 11008, vocab 32000) or Llama-3-8B's (MLP 14336, 8 key/value
    heads: GQA, vocab 128,256); ``hidden`` < 4096 only for CPU smoke runs."""
    mlp, kv_heads, vocab = SHAPES[shape]
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * mlp // 4096, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=kv_heads, vocab_size=vocab,
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model, cfg


def main(batches: str = "64,296", new_tokens: int = 128, prompt_len: int = 64, layers: int = 32, rounds: int = 2,
         out: str = "", check_tokens: int = 16, hidden: int = 4096, device: str = "cuda", only: str = "",
         shape: str = "llama2-7b") -> None:
    """``only``: comma-separated substrings; keep the mmw schemes whose name contains one (HF rows always run).
    ``shape``: llama2-7b | llama3-8b (random init)."""
    if only:
        for name in [n for n in MMW_SCHEMES if not any(k in n for k in only.split(","))]:
            del MMW_SCHEMES[name]
    if shape not in SHAPES:
        raise typer.BadParameter(f"unknown shape {shape!r}; allowed: {', '.join(SHAPES)}", param_hint="--shape")
    model, cfg = build_model(layers, hidden, device, shape)
    vocab = cfg.vocab_size
    base = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    greedy = GenerationConfig(do_sample=False, **base)
    sampling = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, **base)
    hf_configs = {
        HF_ROWS[0]: sampling,
        HF_ROWS[1]: GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, **base,
                                     watermarking_config=WatermarkingConfig(bias=2.0, greenlist_ratio=0.25)),
        HF_ROWS[2]: GenerationConfig(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, **base,
                                     watermarking_config=SynthIDTextWatermarkingConfig(
                                         ngram_len=5, keys=[654, 400, 836, 123, 340, 443, 597, 160, 57, 29, 590,
                                                            639, 13, 715, 468, 990, 966, 226, 324, 585, 118, 504,
                                                            402, 542, 104, 23, 471, 982, 341, 867])),
    }
    specs = {name: SchemeSpec.from_params(p) if p else None for name, p in MMW_SCHEMES.items()}
    result: dict = dict(gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                        shape=shape, new_tokens=new_tokens,
                        prompt_len=prompt_len, layers=layers, rounds=rounds, batches={})

    def save() -> None:
        if out:
            with open(os.path.join(out, "gpu_generate.json"), "w") as f:
                json.dump(result, f, indent=1)

    for batch in [int(b) for b in batches.split(",")]:
        torch.manual_seed(batch)
        prompts = torch.randint(0, vocab, (batch, prompt_len), device=device)
        seeds = list(range(batch))

        def run(name: str, processor=None, new: int = new_tokens) -> tuple[float, torch.Tensor]:
            if name in hf_configs:
                config, procs = hf_configs[name], []
            else:
                config, procs = greedy, [processor]
            config = copy.deepcopy(config)
            config.max_new_tokens = config.min_new_tokens = new
            sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                ids = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=config,
                                     logits_processor=LogitsProcessorList(procs))
            sync()
            return time.perf_counter() - t0, ids[:, prompt_len:]

        rows: dict[str, dict] = {}
        # Warm-up (+ per-step processor timing for mmw rows).
        for name in (*HF_ROWS, *MMW_SCHEMES):
            if name in hf_configs:
                wall, _ = run(name)
                rows[name] = dict(warmup_s=wall, walls=[])
            else:
                proc = EventTimed(specs[name], KEY, vocab, seeds, 1.0)
                wall, _ = run(name, proc)
                gpu_ms, host_ms = proc.per_step_ms()
                rows[name] = dict(warmup_s=wall, walls=[], processor_gpu_ms_per_step=gpu_ms,
                                  processor_host_ms_per_step=host_ms, compiled=proc._step.is_compiled)
            print(f"B={batch} warm-up {name}: {wall:.1f}s", flush=True)
        for r in range(rounds):
            for name in (*HF_ROWS, *MMW_SCHEMES):
                proc = None if name in hf_configs else WatermarkProcessor(specs[name], KEY, vocab, seeds, 1.0)
                wall, _ = run(name, proc)
                rows[name]["walls"].append(wall)
        plain = statistics.median(rows[HF_ROWS[0]]["walls"])
        for name, row in rows.items():
            wall = statistics.median(row["walls"])
            row.update(wall_s=wall, tokens_per_s=batch * new_tokens / wall, vs_plain=plain / wall,
                       step_ms=1e3 * wall / new_tokens)
        # Tokens: compiled == eager; and no host sync inside the processor.
        for name in MMW_SCHEMES:
            _, a = run(name, WatermarkProcessor(specs[name], KEY, vocab, seeds, 1.0), check_tokens)
            _, b = run(name, WatermarkProcessor(specs[name], KEY, vocab, seeds, 1.0, compiled=False), check_tokens)
            SyncChecked.syncs = 0
            run(name, SyncChecked(specs[name], KEY, vocab, seeds, 1.0), check_tokens)
            rows[name].update(tokens_equal_eager=float((a == b).float().mean()), host_syncs=SyncChecked.syncs)
        result["batches"][batch] = rows
        save()
        print(f"\nB={batch}, {new_tokens} new tokens, prompt {prompt_len}, {result['gpu']}")
        print(f"{'configuration':40s} {'tok/s':>8s} {'x plain':>8s} {'step ms':>8s} {'proc GPU ms':>11s} "
              f"{'proc host ms':>12s} {'=eager':>6s} {'syncs':>5s}")
        for name, row in rows.items():
            extra = (f"{row['processor_gpu_ms_per_step']:11.3f} {row['processor_host_ms_per_step']:12.3f} "
                     f"{row['tokens_equal_eager']:6.3f} {row['host_syncs']:5d} {'' if row['compiled'] else 'EAGER'}") if name in MMW_SCHEMES else ""
            print(f"{name:40s} {row['tokens_per_s']:8.0f} {row['vs_plain']:8.3f} {row['step_ms']:8.2f} {extra}",
                  flush=True)


if __name__ == "__main__":
    typer.run(main)
