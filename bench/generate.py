"""Throughput of the transformers engine with the embedded model on CPU, model load times, and (``--judge``) the
judge's seconds per text for each rating mode on the generated texts.

Generates ``--new-tokens`` tokens for ``--batch`` benchmark prompts in one left-padded batch through the
WatermarkProcessor (plain sampling, or a scheme), as the generate stage does. EOS is masked so every row runs the
full length and tokens/s counts exactly batch x new_tokens. Load time is measured from the HF-format cache and,
with ``--cold``, from the GGUF into an empty cache (dequantize + save).

    python bench/generate.py --batch 8 --new-tokens 200 --threads 2 [--cold] [--judge] [--out bench.json]
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import torch
import typer

from mmw.engines.generate import generate
from mmw.engines.models import DEFAULT_MODEL, load_model
from mmw.io import write_json
from mmw.judge.judge import Judge
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec
from mmw.tasks import build_prompts, render_chat

SCHEMES = {
    "none": None,
    "distribution_shift": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1, score="sum"),
    "exponential": dict(sampler="exponential", randomness="window", window=3, score="sum"),
}


class NoEos(WatermarkProcessor):
    """Masks EOS before the processor chooses, so every row generates the full length."""

    eos_ids: list[int] = []

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.eos_ids] = float("-inf")
        return super().__call__(input_ids, scores)


def main(
    batch: int = 8,
    new_tokens: int = 200,
    threads: int = 2,
    scheme: str = typer.Option("none", help=f"one of {', '.join(SCHEMES)}"),
    model_name: str = DEFAULT_MODEL,
    cold: bool = typer.Option(False, help="also time a load from the GGUF into an empty cache"),
    judge: bool = typer.Option(False, help="also time the judge (same model) on the generated texts"),
    out: str = "",
) -> None:
    if scheme not in SCHEMES:
        raise typer.BadParameter(f"--scheme: unknown {scheme!r}; allowed: {', '.join(SCHEMES)}")
    torch.set_num_threads(threads)
    result: dict = {"model": model_name, "threads": threads, "cpus": os.cpu_count(), "batch": batch,
                    "new_tokens": new_tokens, "scheme": scheme, "loadavg_before": os.getloadavg()[0]}
    if cold:
        with tempfile.TemporaryDirectory() as empty_cache:
            t0 = time.perf_counter()
            load_model(model_name, device="cpu", cache_dir=Path(empty_cache))
            result["load_cold_s"] = round(time.perf_counter() - t0, 2)
    load_model(model_name, device="cpu")  # make sure the default cache is built before timing a warm load
    t0 = time.perf_counter()
    tokenizer, model = load_model(model_name, device="cpu")
    result["load_cached_s"] = round(time.perf_counter() - t0, 2)

    prompts = build_prompts(["book_report", "story", "fake_news"], -(-batch // 3)).head(batch)
    chats = render_chat(tokenizer, prompts["prompt"].to_list())
    spec = SchemeSpec.from_params(SCHEMES[scheme]) if SCHEMES[scheme] else None
    vocab_size = min(len(tokenizer), int(model.config.vocab_size))
    NoEos.eos_ids = [tokenizer.eos_token_id]

    def factory(row_seeds: list[int]) -> NoEos:
        return NoEos(spec, 12345 if spec else None, vocab_size, row_seeds, 1.0)

    t0 = time.perf_counter()
    table = generate(model, tokenizer, chats, factory, new_tokens, batch, prompt_ids=prompts["prompt_id"].to_list(),
                     progress=False)
    seconds = time.perf_counter() - t0
    tokens = int(table["n_tokens"].sum())
    result.update(seconds=round(seconds, 2), tokens=tokens, tokens_per_s=round(tokens / seconds, 1),
                  loadavg_after=os.getloadavg()[0], sample=table["text"][0][:200])
    if judge:
        rater = Judge(tokenizer, model, batch_size=batch)
        for mode, rate in (("greedy", rater.rate_greedy), ("expected", rater.rate_expected)):
            t0 = time.perf_counter()
            ratings = rate(prompts["prompt"].to_list(), table["text"].to_list())
            result[f"judge_{mode}_s_per_text"] = round((time.perf_counter() - t0) / table.height, 2)
            result[f"judge_{mode}_ratings"] = [None if r is None else round(r, 1) for r in ratings]
    print(json.dumps(result, indent=2))
    if out:
        write_json(result, out)


if __name__ == "__main__":
    typer.run(main)
