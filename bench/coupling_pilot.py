"""Coupled baselines, a pilot: how much within-prompt correlation between baseline and watermarked ratings does
shared randomness buy, with both laws left exact?

The confirmation's quality test pairs each watermarked text with the same prompt's baseline text of the same seed.
Its per-prompt variance of ``w - q b`` is ``var w + q^2 var b - 2 q rho sd_w sd_b``; generation noise is ~98 % of it
and today ``rho`` (within a prompt) is ~0.01. A coupling that raises ``rho`` divides the prompts a cell needs by
``var(w - q b) coupled / var(w - q b) independent``. Three couplings, each leaving both laws exact:

* **today** (``inv``): baseline and distribution-shift watermark sample by inverse CDF from the same per-step
  uniform (the pipeline's ``plain_u`` of one seed);
* **shared Gumbel noise** (``gumbel``): both take ``argmax(logits / T + G)`` with the same per-step Gumbel vector
  ``G`` (the watermark adds ``delta`` to its green logits); ``G`` is fresh at every step, so each is an exact sample
  of its own law given its past;
* **same key, fresh repeated contexts** (``exp``; the exponential / Gumbel-max watermark, window 4): the watermark
  draws ``argmax u_i^(1/p_i)`` with ``u`` keyed by the last 4 tokens; the baseline draws the same keyed ``u`` but
  fresh uniforms whenever a context repeats within its text, so it is an exact sample of the model (the key is
  random and no keyed ``u`` is read twice). Uncoupled reference: the watermark against today's baseline.

Within-prompt correlation is estimated free of prompt effects from two runs per prompt: the correlation over
prompts of ``w_1 - w_2`` and ``b_1 - b_2`` (each run its own seed and key). Ratings: the pipeline's judge
(expected mode). Scale: SmolLM2-135M, ``--prompts`` per task from ``--offset`` of the three tasks, 48 tokens,
T = 0.7, distribution shift delta 2.5 / gamma 0.5 / window 1. Writes a JSON of per-prompt ratings and the summary.

    nice -n 10 .venv/bin/python bench/coupling_pilot.py --prompts 8 --out bench/results/coupling_pilot.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch

TASKS = ("book_report", "story", "fake_news")
VARIANTS = ("b_inv", "ds_inv", "b_gum", "ds_gum", "exp", "b_exp")
#: (watermarked, baseline) pairs compared: the coupling and its uncoupled reference.
PAIRS = {"today: inverse CDF, same uniforms (distribution shift)": ("ds_inv", "b_inv"),
         "shared Gumbel noise (distribution shift)": ("ds_gum", "b_gum"),
         "same key, fresh repeated contexts (exponential)": ("exp", "b_exp"),
         "uncoupled (exponential vs today's baseline)": ("exp", "b_inv")}


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") & (2**63 - 1)


def _rand(vocab: int, *parts: object) -> torch.Tensor:
    return torch.rand(vocab, generator=torch.Generator().manual_seed(_seed(*parts)), dtype=torch.float64)


def generate(model, tokenizer, chats: list[str], run: int, key: int, tokens: int, temperature: float,
             delta: float, gamma: float) -> dict[str, list[str]]:
    """Texts of every variant for one run (seed ``run``, key ``key``), one per chat."""
    vocab = model.get_output_embeddings().weight.shape[0]
    encoded = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in chats]
    eos = tokenizer.eos_token_id
    out: dict[str, list[str]] = {}
    for variant in VARIANTS:
        texts = []
        for row, ids in enumerate(encoded):
            context = list(ids)
            generated: list[int] = []
            seen: set[tuple[int, ...]] = set()
            past = None
            step_input = torch.tensor([context])
            plain = np.random.default_rng(_seed("plain", run, row))
            with torch.inference_mode():
                for step in range(tokens):
                    result = model(input_ids=step_input, past_key_values=past, use_cache=True)
                    past = result.past_key_values
                    logits = result.logits[0, -1].to(torch.float64)[:vocab]
                    u_plain = float(plain.random())
                    if variant in ("ds_inv", "ds_gum"):
                        green = _rand(vocab, "green", key, context[-1]) < gamma
                        logits = logits + delta * green
                    if variant in ("b_inv", "ds_inv"):
                        probs = torch.softmax(logits / temperature, -1)
                        token = int(torch.searchsorted(torch.cumsum(probs, -1), torch.tensor([u_plain],
                                                                                             dtype=torch.float64)))
                        token = min(token, vocab - 1)
                    elif variant in ("b_gum", "ds_gum"):
                        gumbel = -torch.log(-torch.log(_rand(vocab, "gumbel", run, row, step).clamp_min(1e-300)))
                        token = int((logits / temperature + gumbel).argmax())
                    else:
                        probs = torch.softmax(logits / temperature, -1)
                        window = tuple(context[-4:])
                        fresh = variant == "b_exp" and window in seen
                        u = _rand(vocab, "fresh", run, row, step) if fresh else _rand(vocab, "exp", key, window)
                        seen.add(window)
                        token = int((torch.log(u.clamp_min(1e-300)) / probs).argmax())
                    if token == eos:
                        break
                    generated.append(token)
                    context.append(token)
                    step_input = torch.tensor([[token]])
            texts.append(tokenizer.decode(generated, skip_special_tokens=True))
        out[variant] = texts
    return out


def summary(ratings: dict[str, np.ndarray], q: float, resamples: int = 2000) -> dict[str, dict[str, float]]:
    """Per pair: within-prompt correlation (run differences) with a percentile-bootstrap 95 % interval over prompts,
    and the within-prompt variance of ``w - q b`` relative to what independent draws would give."""
    rng = np.random.default_rng(0)
    out = {}
    for name, (w_name, b_name) in PAIRS.items():
        w, b = ratings[w_name], ratings[b_name]  # (2, n)
        keep = ~(np.isnan(w).any(0) | np.isnan(b).any(0))
        dw, db = (w[0] - w[1])[keep], (b[0] - b[1])[keep]
        n = dw.size

        def corr(idx: np.ndarray) -> float:
            return float(np.corrcoef(dw[idx], db[idx])[0, 1])

        def ratio(idx: np.ndarray) -> float:
            paired = np.mean((dw[idx] - q * db[idx]) ** 2)
            independent = np.mean(dw[idx] ** 2) + q**2 * np.mean(db[idx] ** 2)
            return float(paired / independent)

        boots = [rng.integers(0, n, n) for _ in range(resamples)]
        cs = np.array([corr(i) for i in boots])
        rs = np.array([ratio(i) for i in boots])
        everything = np.arange(n)
        out[name] = {"prompts": n, "rho": corr(everything), "rho_low": float(np.nanquantile(cs, 0.025)),
                     "rho_high": float(np.nanquantile(cs, 0.975)), "variance_ratio": ratio(everything),
                     "variance_ratio_low": float(np.quantile(rs, 0.025)),
                     "variance_ratio_high": float(np.quantile(rs, 0.975)),
                     "identical_texts": float(np.mean(np.array(
                         [a == c for a, c in zip(ratings[f"{w_name}:text"].ravel(), ratings[f"{b_name}:text"].ravel(),
                                                 strict=True)])))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per task")
    parser.add_argument("--offset", type=int, default=0, help="first prompt per task")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--delta", type=float, default=2.5)
    parser.add_argument("--gamma", type=float, default=0.5)
    parser.add_argument("--q", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=Path("bench/results/coupling_pilot.json"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 beside other work on 2 cores)")
    args = parser.parse_args()

    from mmw.engines.models import load_model
    from mmw.judge.judge import Judge
    from mmw.tasks import build_prompts, render_chat

    torch.set_num_threads(args.threads)
    started = time.time()
    prompts = build_prompts(list(TASKS), per_task=args.prompts, offset=args.offset)
    tokenizer, model = load_model("embedded:smollm2-135m", "cpu", "auto")
    chats = render_chat(tokenizer, prompts["prompt"].to_list())
    texts = {v: [] for v in VARIANTS}
    for run in (0, 1):
        key = _seed("key", run, time.time_ns())
        made = generate(model, tokenizer, chats, run, key, args.tokens, args.temperature, args.delta, args.gamma)
        for variant in VARIANTS:
            texts[variant].append(made[variant])
        print(f"run {run}: generated ({time.time() - started:.0f} s)", flush=True)
    generated_s = time.time() - started
    del model
    judge_tokenizer, judge_model = load_model("embedded:qwen2.5-coder-1.5b", "cpu", "auto")
    judge = Judge(judge_tokenizer, judge_model, batch_size=4)
    questions = prompts["prompt"].to_list()
    ratings: dict[str, np.ndarray] = {}
    for variant in VARIANTS:
        rated = [judge.rate_expected(questions, texts[variant][run]) for run in (0, 1)]
        ratings[variant] = np.array([[np.nan if r is None else r for r in row] for row in rated], dtype=float)
        ratings[f"{variant}:text"] = np.array(texts[variant], dtype=object)
        print(f"rated {variant} ({time.time() - started:.0f} s)", flush=True)
    result = {"scale": {"prompts_per_task": args.prompts, "offset": args.offset, "tokens": args.tokens,
                        "temperature": args.temperature, "delta": args.delta, "gamma": args.gamma, "q": args.q,
                        "generator": "embedded:smollm2-135m", "judge": "embedded:qwen2.5-coder-1.5b (expected)"},
              "wall_s": {"generate": round(generated_s, 1), "total": round(time.time() - started, 1)},
              "summary": summary(ratings, args.q),
              "ratings": {v: ratings[v].tolist() for v in VARIANTS},
              "prompt_ids": prompts["prompt_id"].to_list()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
