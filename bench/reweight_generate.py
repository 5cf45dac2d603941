"""Watermarked generations for bench/reweight.py's power table, on any device, with only torch, transformers (+ gguf)
and mmw's watermark step imported (no polars or DVC: this is what runs on a GPU machine that lacks them).

Input: a JSON of tokenized chat prompts and the generator's vocabulary size (``bench/reweight.py prompts``); output:
per scheme and temperature, every row's generated token ids, cut at the first end-of-sequence token, as
``mmw.engines.generate`` does (left-padded batch, greedy decoding of the processor's choice, the same row seeds).

    python bench/reweight_generate.py --prompts prompts.json --gguf DIR/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --device cuda --out tokens.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import typer
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessorList

from mmw.watermark.prf import key_from_string
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

SCHEMES = {
    "C4 shift + SelfHash 4": dict(sampler="distribution_shift", delta=2.0, randomness="selfhash", window=4,
                                  score="sum"),
    "DiPmark a=0.5 (gamma-reweight), window 1": dict(sampler="reweight", reweight_alpha=0.5, randomness="window",
                                                     window=1, score="sum"),
    "DiPmark a=0.25, window 1": dict(sampler="reweight", reweight_alpha=0.25, randomness="window", window=1,
                                     score="sum"),
}
KEY = key_from_string("bench-reweight-power")


def main(prompts: Path = typer.Option(...), gguf: Path = typer.Option(...), out: Path = typer.Option(...),
         device: str = "cpu", tokens: int = 200,
         temperatures: str = "0.7,1.0", alpha: float = 0.02, only: str = "") -> None:
    """``--only``: the schemes whose name contains this text (a row can be added to an earlier run's table)."""
    spec_in = json.loads(prompts.read_text())
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to(device).eval()
    ids, vocab, pad, eos = spec_in["input_ids"], spec_in["vocab"], spec_in["pad_token_id"], spec_in["eos_token_ids"]
    width = max(len(row) for row in ids)
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in ids], device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], device=device)
    config = GenerationConfig(max_new_tokens=tokens, do_sample=False, num_beams=1, eos_token_id=eos,
                              pad_token_id=pad, use_cache=True)
    model.generation_config = GenerationConfig()
    record = {"device": device, "torch": torch.__version__, "tokens": tokens, "rows": []}
    for temperature in (float(t) for t in temperatures.split(",")):
        for name, params in SCHEMES.items():
            if only not in name:
                continue
            t0 = time.perf_counter()
            spec = SchemeSpec.from_params({**params, "alpha": alpha})
            processor = WatermarkProcessor(spec, KEY, vocab, spec_in["row_seeds"], temperature, compiled=False)
            with torch.inference_mode():
                output = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config,
                                        logits_processor=LogitsProcessorList([processor]))
            rows = []
            for row in output[:, width:].tolist():
                cut = next((i for i, t in enumerate(row) if t in eos), len(row))
                rows.append(row[:cut])
            record["rows"].append({"scheme": name, "temperature": temperature, "tokens": rows,
                                   "seconds": time.perf_counter() - t0})
            print(f"{name} T={temperature:g}: {len(rows)} rows, {time.perf_counter() - t0:.1f} s", flush=True)
            out.write_text(json.dumps(record))


if __name__ == "__main__":
    typer.run(main)
