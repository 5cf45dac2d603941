"""Generation throughput with each watermark sampler on a GPU (random-weight model of a real architecture).

The GPU machine cannot receive real 7B weights, so the model is a randomly initialised Llama-2-7B-shaped network in
bf16: timings hold, text quality does not. Measures tokens/s of HF ``generate`` with the WatermarkProcessor for each
sampler against plain sampling, and the processor's own share of the step time.

    python bench/gpu_generate.py --batch 32 --new-tokens 256
"""

from __future__ import annotations

import json
import os
import time

import torch
import typer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, LogitsProcessorList

from mmw.processor import WatermarkProcessor
from mmw.scheme import SchemeSpec

SCHEMES = {
    "none (plain sampling)": None,
    "C4 shift, window 1": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1, score="sum"),
    "C1 exponential, window 3": dict(sampler="exponential", randomness="window", window=3, score="sum"),
    "C2 inverse, window 1": dict(sampler="inverse_transform", randomness="window", window=1, score="sum"),
    "C3 binary (huffman), window 1": dict(sampler="binary", randomness="window", window=1, score="sum"),
    "C1 exponential, fixed 256": dict(sampler="exponential", randomness="fixed", key_length=256, score="align"),
}


class Timed(WatermarkProcessor):
    """Accumulates the processor's own wall time (synchronised), to separate it from the model's."""

    seconds = 0.0

    def __call__(self, input_ids, scores):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = super().__call__(input_ids, scores)
        torch.cuda.synchronize()
        Timed.seconds += time.perf_counter() - t0
        return out


def main(batch: int = 32, new_tokens: int = 256, prompt_len: int = 64, layers: int = 32, out: str = "") -> None:
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device="cuda")
    gen = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
                           pad_token_id=0)
    rows = []
    name_gpu = torch.cuda.get_device_name()
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params(params) if params else None
        for rep in range(2):  # first repetition warms up kernels and caches
            proc = Timed(spec, 1234, cfg.vocab_size, list(range(batch)), temperature=1.0)
            Timed.seconds = 0.0
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(prompts, generation_config=gen, logits_processor=LogitsProcessorList([proc]))
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        rows.append(dict(scheme=name, tokens_per_s=batch * new_tokens / wall, wall_s=wall,
                         processor_s=Timed.seconds, processor_share=Timed.seconds / wall))
        print(f"{name:32s} {batch * new_tokens / wall:9.1f} tok/s  wall {wall:6.2f}s  "
              f"processor {Timed.seconds:5.2f}s ({100 * Timed.seconds / wall:4.1f}%)", flush=True)
    result = dict(gpu=name_gpu, batch=batch, new_tokens=new_tokens, prompt_len=prompt_len, layers=layers, rows=rows)
    if out:
        with open(os.path.join(out, "gpu_generate.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    typer.run(main)
