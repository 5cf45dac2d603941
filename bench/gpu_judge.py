"""The judge and the model load on one GPU: judgements per second against the card's matmul rate, and load time.

Random-init Llama-3-8B shape (bf16) as the judge, ``--texts`` responses of about ``--words`` words each, rated in
``expected`` mode (one forward pass per batch, ``mmw.judge.judge.Judge``) at each of ``--batches``. The work of a
judgement is ~2 x 7.5e9 FLOP per token (the non-embedding parameters) over its tokens; against the card's bf16
matmul rate (measured here on an 8,192^3 product) that gives the floor.

``--load``: saves the model as an HF folder and times ``mmw.engines.models.load_model`` on it (what every stage
does at start).

    PYTHONPATH=. python3 bench/gpu_judge.py --tokenizer DIR --texts 160 --batches 16,32 --load --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from mmw.judge.judge import Judge

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192)


def matmul_tflops() -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 20 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12


def main(tokenizer: Path = Path(".gpu/tokenizer"), texts: int = 160, words: int = 700, batches: str = "16,32",
         pad_multiples: str = "128", load: bool = False, out: str = "") -> None:
    """``pad_multiples``: the judge's ``CUDA_PAD_MULTIPLE`` values to time at each batch size (0 = no rounding,
    every batch its own width)."""
    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = LlamaConfig(**LLAMA3_8B, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.set_attn_implementation("sdpa")
    result: dict = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, matmul_tflops=round(matmul_tflops()),
                        runs=[])
    rng = np.random.default_rng(0)
    lexicon = [w for w in (tok.decode([i]).strip() for i in range(1000, 9000)) if w.isalpha()]
    responses = [" ".join(rng.choice(lexicon, size=int(rng.integers(words // 2, words + 1)))) for _ in range(texts)]
    prompts = [f"Write a book report about Book {i}, written by Author {i}." for i in range(texts)]
    flop_per_token = 2 * sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n)

    def save() -> None:
        if out:
            Path(out, "gpu_judge.json").write_text(json.dumps(result, indent=1))

    for batch, multiple in [(int(b), int(m)) for b in batches.split(",") if b for m in pad_multiples.split(",")]:
        judge = Judge(tok, model, batch_size=batch)
        judge.pad_multiple = multiple or None
        # warm-up on other texts than the timed ones (their lengths, hence shapes, differ)
        judge.grade_distribution(prompts[:batch], [r[: len(r) // 3] for r in responses[:batch]])
        chats = [judge._chat(p, r) for p, r in zip(prompts, responses, strict=True)]
        n_tokens = sum(len(ids) for ids in tok(chats, add_special_tokens=False)["input_ids"])
        torch.cuda.synchronize()
        start = time.perf_counter()
        judge.grade_distribution(prompts, responses)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        row = dict(batch=batch, pad_multiple=multiple, texts=texts, tokens=n_tokens, wall_s=round(wall, 2),
                   ms_per_judgement=round(1e3 * wall / texts, 1),
                   achieved_tflops=round(n_tokens * flop_per_token / wall / 1e12),
                   floor_ms_per_judgement=round(
                       1e3 * n_tokens * flop_per_token / texts / (result["matmul_tflops"] * 1e12), 1))
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        save()

    if load:
        from mmw.engines.models import load_model

        folder = Path("/tmp/gpu_judge_model")
        start = time.perf_counter()
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        result["save_s"] = round(time.perf_counter() - start, 1)
        del model, judge
        torch.cuda.empty_cache()
        for attempt in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            _, loaded = load_model(str(folder), "cuda", "auto")
            torch.cuda.synchronize()
            result[f"load_model_s_{attempt}"] = round(time.perf_counter() - start, 1)
            print("load_model", attempt, result[f"load_model_s_{attempt}"], loaded.device, loaded.dtype, flush=True)
            del loaded
            torch.cuda.empty_cache()
        save()


if __name__ == "__main__":
    typer.run(main)
