"""The judge's forward (``expected`` mode) at a given shape: the current path against alternatives, and the floor.

Variants (each gives the (batch, 1 + n_inner, vocab) logits that :meth:`mmw.judge.judge.Judge.grades_from_logits` turns
into grade probabilities):

* ``single``   every row's whole rating prompt and the grade trie's inner nodes in one forward under a dense
               (batch, 1, L+T, L+T) additive tree mask (the judge before the shared head; ``tests/judge_reference.py``);
* ``shared``   the judge now (:meth:`mmw.judge.judge.Judge.node_logits`): the rating prompt's fixed head from a key/value
               cache computed once, the rest of each row and the trie nodes in one forward;
* ``two-pass`` pass 1 over the left-padded rows with the 2-D padding mask (``use_cache``, ``logits_to_keep=1``),
               pass 2 over the T trie tokens only, on pass 1's cache, with a (batch, 1, T, L+T) mask;
* ``causal``   not a judge: one plain causal forward over the same number of tokens with no mask and no padding
               (the longest row's length for every row, ``logits_to_keep=1``): what the attention kernels' fast
               path costs, a practical floor for a forward in this framework.

Work of a judgement: 2 x (non-embedding parameters) FLOP per token of its rating prompt (attention's extra
~4 x layers x hidden x L/2 per token is listed separately); the floor is that work at the measured matmul rate
(an 8,192^3 bf16 product on CUDA, a 2,048^3 product in the model's dtype on a CPU).

Two modes:

* synthetic rows at a shape (random words around ``--context`` tokens, the rows ``--spread`` apart so a batch is
  left-padded), timed ``--repeats`` times after a warm-up on the same shapes (median reported)::

    PYTHONPATH=. python bench/judge_forward.py --config llama3-8b --tokenizer TOK --device cuda --dtype bfloat16 \\
        --batch 16 --context 1150,300 --out DIR

* real rating prompts (``--texts``: a generations parquet with ``prompt`` and ``text``; each text and its
  word-shuffled copy are rated, as the rate stage does), whole :meth:`grade_distribution` passes in the order of
  ``--variants`` repeated ``--rounds`` times (A B A B), with the expected ratings' largest difference to
  ``single``::

    PYTHONPATH=. python bench/judge_forward.py --model embedded:qwen2.5-coder-1.5b \\
        --texts data/generations/baseline.parquet --variants single,shared --rounds 2 --batch 8 --out DIR
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import typer
from transformers import AutoTokenizer, DynamicCache, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from judge_reference import single_pass_node_logits  # noqa: E402

from mmw.judge.judge import MAX_GRADE, Judge, shuffle_words  # noqa: E402

CONFIGS = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096),
}


@torch.inference_mode()
def two_pass_node_logits(judge: Judge, sequences: list[list[int]]) -> torch.Tensor:
    """Pass 1: the padded rows, 2-D mask, cache kept; pass 2: the trie tokens on that cache, small tree mask."""
    batch = judge._pad(sequences, judge.pad_multiple)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    n_rows, context_len = ids.shape
    device = ids.device
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = judge.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                      past_key_values=DynamicCache(), logits_to_keep=1)
    tree_tokens = judge._tree_tokens.to(device)
    n_tree = tree_tokens.shape[0]
    allowed = torch.cat([mask.bool()[:, None, :].expand(n_rows, n_tree, context_len),
                         judge._tree_ancestors.to(device)[None].expand(n_rows, n_tree, n_tree)], -1)[:, None]
    additive = torch.zeros(allowed.shape, dtype=judge.model.dtype, device=device)
    additive.masked_fill_(~allowed, torch.finfo(judge.model.dtype).min)
    tree = judge.model(input_ids=tree_tokens.expand(n_rows, n_tree), attention_mask=additive,
                       position_ids=positions[:, -1:] + judge._tree_depth.to(device),
                       past_key_values=out.past_key_values, use_cache=True).logits
    return torch.cat([out.logits[:, -1:], tree], 1)


@torch.inference_mode()
def causal_forward(judge: Judge, sequences: list[list[int]]) -> torch.Tensor:
    """Not a judgement: a plain causal forward over len(longest row) tokens a row, no mask, no padding."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([s[:1] * (width - len(s)) + list(s) for s in sequences], device=judge.model.device)
    return judge.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits


VARIANTS = {"single": single_pass_node_logits, "shared": Judge.node_logits, "two-pass": two_pass_node_logits,
            "causal": causal_forward}


def logit_diff(logits: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(logits, reference, strict=True))


def rating_diff(judge: Judge, logits: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Largest difference of the expected ratings (renormalised over grades 0..100, whatever their mass)."""
    def ratings(batch: torch.Tensor) -> torch.Tensor:
        probs = judge.grades_from_logits(batch).double()
        return probs @ torch.arange(MAX_GRADE + 1, dtype=torch.float64, device=probs.device) / probs.sum(-1)

    return max(float((ratings(a) - ratings(b)).abs().max()) for a, b in zip(logits, reference, strict=True))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_tflops(device: torch.device, dtype: torch.dtype) -> float:
    n, repeats = (8192, 20) if device.type == "cuda" else (2048, 5)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(2):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return repeats * 2 * n**3 / (time.perf_counter() - start) / 1e12


def load(model: str, config: str, tokenizer: Path | None, device: str, dtype: str, attention: str):
    torch_dtype = getattr(torch, dtype)
    if model:
        from mmw.engines.models import load_model

        tok, lm = load_model(model, device, torch_dtype)
    else:
        tok = AutoTokenizer.from_pretrained(tokenizer)
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        cfg = LlamaConfig(**CONFIGS[config], tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id)
        if "vocab_size" not in CONFIGS[config]:
            cfg.vocab_size = len(tok)
        torch.manual_seed(0)
        with torch.device(device):
            lm = LlamaForCausalLM(cfg).to(torch_dtype).eval()
    lm.set_attn_implementation(attention)
    return tok, lm


def synthetic_rows(judge: Judge, n_rows: int, context: int, spread: int, seed: int) -> list[list[int]]:
    """``n_rows`` rating prompts of about ``context`` tokens (``spread`` tokens apart), random words as texts."""
    tok = judge.tokenizer
    rng = np.random.default_rng(seed)
    lexicon = [w for w in (tok.decode([i]).strip() for i in range(min(1000, len(tok) // 4), min(9000, len(tok))))
               if w.isalpha()]
    rows = []
    for i in range(n_rows):
        target = context - (i * spread) // max(n_rows - 1, 1)
        words: list[str] = []
        ids: list[int] = []
        while True:
            chat = judge._chat(f"Write a book report about Book {i}, written by Author {i}.", " ".join(words))
            ids = tok.encode(chat + judge.trie.prefill, add_special_tokens=False)
            if len(ids) >= target:
                break
            words += list(rng.choice(lexicon, size=max(1, (target - len(ids)) // 2)))
        rows.append(ids)
    return rows


def main(
    model: str = typer.Option("", help="a model spec for mmw.engines.models.load_model (folder, embedded:...)"),
    config: str = typer.Option("llama3-8b", help=f"random-init Llama config when no --model: {sorted(CONFIGS)}"),
    tokenizer: Path | None = typer.Option(None, help="tokenizer folder for a random-init model"),
    device: str = "cpu",
    dtype: str = "float32",
    attention: str = "sdpa",
    batch: int = 16,
    context: str = typer.Option("1150,300", help="synthetic rows: longest row of each shape, in tokens"),
    spread: int = typer.Option(60, help="synthetic rows: tokens between the longest and shortest row of a batch"),
    batches: int = typer.Option(2, help="synthetic rows: batches timed per repeat"),
    repeats: int = 5,
    texts: Path | None = typer.Option(None, help="real texts: a parquet with prompt and text columns"),
    rounds: int = typer.Option(2, help="real texts: passes of each variant, interleaved"),
    variants: str = "single,shared,two-pass,causal",
    pad_multiple: int = typer.Option(-1, help="the judge's width rounding (-1: its default for the device)"),
    compile: bool = typer.Option(False, help="wrap the model in torch.compile (every variant runs compiled)"),
    out: Path | None = None,
) -> None:
    tok, lm = load(model, config, tokenizer, device, dtype, attention)
    judge = Judge(tok, lm, batch_size=batch)
    if compile:
        judge.model = torch.compile(lm)
    if pad_multiple >= 0:
        judge.pad_multiple = pad_multiple or None
    dev = lm.device
    names = [v for v in variants.split(",") if v]
    non_embedding = sum(p.numel() for n, p in lm.named_parameters() if "embed" not in n and "lm_head" not in n)
    cfg = lm.config
    rate = matmul_tflops(dev, lm.dtype)
    result: dict = dict(device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                        torch=torch.__version__, threads=torch.get_num_threads(), dtype=str(lm.dtype),
                        attention=attention, model=model or config, compiled=compile,
                        non_embedding_params=non_embedding,
                        head_tokens=len(judge.head), trie_tokens=len(judge.trie.inner),
                        matmul_tflops=round(rate, 3), pad_multiple=judge.pad_multiple, runs=[])

    def save() -> None:
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / "judge_forward.json").write_text(json.dumps(result, indent=1))

    def work(sequences: list[list[int]]) -> tuple[float, float]:
        """(matmul FLOP, extra attention FLOP) of judging these rows: every token of every rating prompt."""
        tokens = sum(len(s) for s in sequences)
        attention_flop = sum(4 * cfg.num_hidden_layers * cfg.hidden_size * len(s) * len(s) / 2 for s in sequences)
        return 2 * non_embedding * tokens, attention_flop

    if texts is None:
        for length in [int(c) for c in context.split(",") if c]:
            sets = [synthetic_rows(judge, batch, length, spread, seed) for seed in range(batches)]
            n_judgements = batch * batches
            matmul_flop, attention_flop = (sum(x) for x in zip(*(work(s) for s in sets), strict=True))
            floor_ms = 1e3 * matmul_flop / (rate * 1e12) / n_judgements
            reference = [VARIANTS["single"](judge, s).float() for s in sets] if "single" in names else None
            if reference is not None and not compile:  # (compiled: another width would be another compilation)
                # The old judge's own spread: the same rows under another padding width (batch composition).
                other = judge.pad_multiple
                judge.pad_multiple = None if other else 128
                noise = [VARIANTS["single"](judge, s).float() for s in sets]
                judge.pad_multiple = other
                result.setdefault("padding_noise", []).append(dict(
                    context=length, max_abs_logit_diff=logit_diff(noise, reference),
                    max_abs_rating_diff=rating_diff(judge, noise, reference)))
            for name in names:
                function = VARIANTS[name]
                for s in sets:  # warm-up on the timed shapes (kernel plans, caches)
                    function(judge, s)
                times = []
                for _ in range(repeats):
                    sync(dev)
                    start = time.perf_counter()
                    for s in sets:
                        function(judge, s)
                    sync(dev)
                    times.append(time.perf_counter() - start)
                wall = statistics.median(times)
                row = dict(variant=name, context=length, batch=batch, judgements=n_judgements,
                           tokens=sum(len(r) for s in sets for r in s),
                           ms_per_judgement=round(1e3 * wall / n_judgements, 2),
                           spread_ms=[round(1e3 * t / n_judgements, 2) for t in (min(times), max(times))],
                           achieved_tflops=round(matmul_flop / wall / 1e12, 3),
                           floor_ms_per_judgement=round(floor_ms, 2), over_floor=round(1e3 * wall / n_judgements /
                                                                                        floor_ms, 2),
                           attention_share_of_work=round(attention_flop / matmul_flop, 3))
                if reference is not None and name in ("shared", "two-pass"):
                    logits = [function(judge, s).float() for s in sets]
                    row["max_abs_logit_diff"] = logit_diff(logits, reference)
                    row["max_abs_rating_diff"] = rating_diff(judge, logits, reference)
                result["runs"].append(row)
                print(json.dumps(row), flush=True)
                save()
        return

    import polars as pl

    frame = pl.read_parquet(texts)
    rng = np.random.default_rng(0)
    prompts = list(frame["prompt"]) * 2
    rated = list(frame["text"]) + [shuffle_words(t, rng) for t in frame["text"]]
    sequences = [s for _, rows in judge._batches(prompts, rated, judge.trie.prefill, "") for s in rows]
    matmul_flop, attention_flop = work(sequences)
    floor_ms = 1e3 * matmul_flop / (rate * 1e12) / len(rated)
    result.update(texts=str(texts), judgements=len(rated), tokens=sum(map(len, sequences)),
                  floor_ms_per_judgement=round(floor_ms, 1))
    expected: dict[str, np.ndarray] = {}
    for round_ in range(rounds):
        for name in names:
            function = VARIANTS[name]
            probs = np.zeros((len(rated), MAX_GRADE + 1))
            start = time.perf_counter()
            for rows, batch_rows in judge._batches(prompts, rated, judge.trie.prefill, ""):
                probs[rows] = judge.grades_from_logits(function(judge, batch_rows)).cpu().numpy()
            wall = time.perf_counter() - start
            ratings = probs @ np.arange(MAX_GRADE + 1) / probs.sum(-1)
            if round_ == 0:
                expected[name] = ratings
            row = dict(variant=name, round=round_, wall_s=round(wall, 1),
                       ms_per_judgement=round(1e3 * wall / len(rated), 1),
                       achieved_tflops=round(matmul_flop / wall / 1e12, 4), over_floor=round(1e3 * wall / len(rated) /
                                                                                           floor_ms, 2),
                       identical_to_round_0=bool(np.array_equal(ratings, expected[name])))
            if "single" in expected and name != "single":
                row["max_abs_rating_diff_vs_single"] = float(np.abs(ratings - expected["single"]).max())
            result["runs"].append(row)
            print(json.dumps(row), flush=True)
            save()


if __name__ == "__main__":
    typer.run(main)
