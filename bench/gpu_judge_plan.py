"""The judge's batch plan at full scale: batches cut by characters vs by tokens, on one GPU.

A rate stage's rows are the texts and their attacked copies; attacks that keep a text's characters change its
tokens (a word swap, a typo), so batches cut by characters mix short and long rows and pad the short ones. This
times :class:`mmw.judge.backends.TransformersBackend` rating the same rows in both plans, alternating, and counts
the padded positions each plan forwards.

Rows: ``--texts`` random-token texts of ``--tokens`` tokens (decoded through ``--tokenizer``, widened to the
model's vocabulary: what the random-init stand-in of bench/gpu_fullscale.py writes) and, for the first third, one
copy per attack of params-full.yaml's list that changes the text. Judge: a random-init Llama-3-8B shape in bf16.

    PYTHONPATH=. python3 bench/gpu_judge_plan.py --tokenizer DIR --texts 160 --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from gpu_judge import LLAMA3_8B  # bench/ is run as scripts, not a package

from mmw.attacks import build_attack
from mmw.judge.judge import Judge
from mmw.judge.backends import TransformersBackend

#: params-full.yaml's attacks that change a text (contraction and expansion leave random-token text as it is).
ATTACKS = [{"name": "swap", "p": 0.05}, {"name": "swap", "p": 0.1}, {"name": "swap", "p": 0.2},
           {"name": "misspelling", "p": 0.25}, {"name": "typo", "p": 0.05}, {"name": "typo", "p": 0.1},
           {"name": "lowercase"}]


#: For a CPU smoke run of this script.
TINY = dict(LLAMA3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def stand_in_rows(tokenizer: Path, texts: int, tokens: int) -> tuple:
    """(tokenizer widened to Llama-3's vocabulary, rows, prompts): ``texts`` random-token texts and, for the first
    third, one copy per attack in :data:`ATTACKS`."""
    tok = AutoTokenizer.from_pretrained(tokenizer)
    if len(tok) < LLAMA3_8B["vocab_size"]:
        tok.add_tokens([f"<x{i}>" for i in range(LLAMA3_8B["vocab_size"] - len(tok))])
    tok.padding_side = "left"
    rng = np.random.default_rng(0)
    rows = [tok.decode(rng.integers(0, LLAMA3_8B["vocab_size"], tokens).tolist()) for _ in range(texts)]
    for spec in ATTACKS:
        attack = build_attack(spec)
        rows += [attack(text, i) for i, text in enumerate(rows[:texts // 3])]
    return tok, rows, ["Write a short story about a lighthouse keeper."] * len(rows)


def stand_in_judge_model(tok, tiny: bool) -> LlamaForCausalLM:
    """A random-init Llama-3-8B shape (bf16 on CUDA; ``tiny``: a 2-layer one for a CPU smoke run)."""
    cfg = LlamaConfig(**(TINY if tiny else LLAMA3_8B), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        return LlamaForCausalLM(cfg).to(torch.bfloat16 if device == "cuda" else torch.float32).eval()


def main(tokenizer: Path = typer.Option(...), texts: int = 96, tokens: int = 1024, batch: int = 16,
         rounds: int = 1, tiny: bool = False, out: str = "") -> None:
    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = stand_in_judge_model(tok, tiny)
    judge = Judge(tok, model, batch_size=batch, compiled=False)  # the plan's effect alone
    judge.pad_multiple = 128  # as on CUDA (the CPU smoke run pads the same way)
    backend = TransformersBackend(judge, "stand-in")
    counts = judge.token_counts(rows)
    by_tokens = judge.token_counts

    # Each row's rating prompt less the shared head (what node_logits forwards per row), and the padded width of a
    # batch: its longest row rounded up to the CUDA width class.
    row_len = [len(ids) - len(judge.head) for ids in tok([judge._chat(p, t) + judge.trie.prefill
                                                         for p, t in zip(prompts, rows)],
                                                        add_special_tokens=False)["input_ids"]]

    def padded(plan: list[list[int]]) -> int:
        return sum(-(-max(row_len[i] for i in unit) // 128) * 128 * len(unit) for unit in plan)

    def run(kind: str, upto: int | None = None) -> float:
        judge.token_counts = by_tokens if kind == "tokens" else (lambda texts: [len(t) for t in texts])
        sync()
        start = time.perf_counter()
        for _ in backend.rate_stream(prompts[:upto], rows[:upto], "expected"):
            pass
        sync()
        return time.perf_counter() - start

    plans = {}
    for kind in ("characters", "tokens"):
        judge.token_counts = by_tokens if kind == "tokens" else (lambda texts: [len(t) for t in texts])
        plans[kind] = backend.plan(rows)
    result = {"rows": len(rows), "text_tokens": int(sum(counts)), "row_positions": int(sum(row_len)), "batch": batch,
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "padded_positions": {k: padded(p) for k, p in plans.items()}, "runs": []}
    result["warmup_s"] = round(run("tokens", upto=3 * batch), 2)  # kernels, the judge's head cache
    for r in range(rounds):
        for kind in (("characters", "tokens") if r % 2 == 0 else ("tokens", "characters")):
            seconds = run(kind)
            result["runs"].append({"plan": kind, "s": round(seconds, 2),
                                   "ms_per_judgement": round(1000 * seconds / len(rows), 1)})
            print(result["runs"][-1], flush=True)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_judge_plan.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
