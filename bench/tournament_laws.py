"""The tournament's histogram passes on real models' laws: how many shared-memory atomic adds a token costs, and
the laws' profiles that ``bench/gpu_tournament.py --law real`` replays on a GPU.

A histogram pass (``mmw.kernels.tournament.histogram32_kernel``) adds each token's fixed-point mass
v = round(mass * 2^62) to its bin as 32-bit shared atomics: the low word always (or, with ``skip_zero``, only where
v > 0), the high word where v >= 2^32 or the low add carries. How many adds a token costs depends on the law's shape:
a law spread evenly over 128k ids, as a random-init model's is, gives every token a mass above 2^-30, so two; a
trained model's law puts most ids far below that. Per pass at m = 30 (three passes of 10 layers, 2 leaves, the real
PRF and the real tables between passes), this counts the share of tokens with v = 0, 0 < v < 2^32 and v >= 2^32 on:

- real laws: the embedded models sampling from the paper's prompts (their chat template) at
  ``--temperatures`` (params-full.yaml's 0.7, and 1);
- the GPU benches' stand-ins: their random-init Llama-3-8B shape (``bench/gpu_generate.build_model`` with one layer:
  the final norm and lm_head at full width, hidden 4,096, vocab 128,256) at temperature 1
  (the decode part's), and Gaussian logits of scale 3 (the kernels and step parts');
- the real laws stretched to 128,256 ids (``law_bank``: what ``--law real`` replays): the check that the stretch
  keeps the shares.

    PYTHONPATH=. .venv/bin/python bench/tournament_laws.py [--prompts 8] [--steps 64] \
        [--temperatures 0.7,1.0] [--keep 64] [--out bench/results/tournament]

Writes OUT/laws.json (the shares) and OUT/real_laws.npz (each law's sorted log-probabilities at rank knots).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import typer

#: Llama-3's vocabulary: the width the GPU benches run at.
VOCAB = 128_256
LAYERS = 30
LEAVES = 2
#: Ranks below this keep their rank when a law is stretched to another vocabulary (the head that carries the mass);
#: the tail's ranks are stretched linearly.
HEAD = 1_024
#: Knots a stored profile has: the first EXACT ranks each, log-spaced ranks beyond (linear between knots in log
#: probability).
KNOTS = 1_024
EXACT = 128


def atomic_shares(probs: torch.Tensor, seeds: torch.Tensor, layers: int = LAYERS, leaves: int = LEAVES
                  ) -> np.ndarray:
    """float64 laws [B, V] and row seeds int64 [B] -> counts int64 [passes, 3]: per histogram pass, the tokens whose
    fixed-point mass is 0, below 2^32, and from 2^32 (the pass's law: probs times the earlier passes' tables)."""
    from mmw.watermark import prf
    from mmw.watermark.samplers.tournament import (CHUNK_BITS, FIXED_POINT, apply_tables, chunk_table,
                                                   scatter_histogram)

    hashes = prf.prf_t(seeds.unsqueeze(-1), torch.arange(probs.shape[-1]).unsqueeze(0))
    tables: list[torch.Tensor] = []
    counts = []
    for start in range(0, layers, CHUNK_BITS):
        width = min(CHUNK_BITS, layers - start)
        fixed = torch.floor(apply_tables(probs, hashes, tables) * FIXED_POINT + 0.5)
        zero, two = int((fixed == 0).sum()), int((fixed >= 2.0 ** 32).sum())
        counts.append([zero, fixed.numel() - zero - two, two])
        tables.append(chunk_table(scatter_histogram(probs, hashes, tables, start, width), width, leaves))
    return np.array(counts, dtype=np.int64)


def summary(counts: np.ndarray) -> dict:
    """Shares and adds a token per pass: today's kernel (the low add always) and with ``skip_zero``."""
    share = counts / counts.sum(1, keepdims=True)
    return dict(share_zero_one_two=share.round(4).tolist(),
                adds_per_token=(1 + share[:, 2]).round(3).tolist(),
                adds_per_token_skip_zero=(share[:, 1] + 2 * share[:, 2]).round(3).tolist(),
                tokens=int(counts[0].sum()))


def knot_ranks(vocab: int = VOCAB, knots: int = KNOTS) -> np.ndarray:
    """Rank knots 0 .. vocab - 1 (int64, increasing): ranks 0 .. EXACT - 1, log-spaced ranks beyond."""
    return np.unique(np.concatenate([np.arange(EXACT), np.geomspace(EXACT, vocab - 1, knots - EXACT).round(),
                                     [vocab - 1]]).astype(np.int64))


def profile(logprobs: torch.Tensor, knots: np.ndarray, vocab: int = VOCAB) -> np.ndarray:
    """Laws' log-probabilities [B, V'] -> float32 [B, len(knots)]: each row sorted descending, read at the knots of
    a vocab-wide rank axis; rank r < HEAD reads the source's rank r, the tail's ranks map linearly onto the
    source's tail (linear interpolation between its ranks)."""
    src = torch.sort(logprobs.to(torch.float64), dim=-1, descending=True).values
    width = src.shape[-1]
    r = torch.as_tensor(knots, dtype=torch.float64)
    head = min(HEAD, width, vocab)
    pos = torch.where(r < head, r, head + (r - head) * (width - 1 - head) / max(vocab - 1 - head, 1))
    lo = pos.floor().long().clamp(max=width - 1)
    hi = (lo + 1).clamp(max=width - 1)
    frac = (pos - lo).unsqueeze(0)
    return (src[:, lo] * (1 - frac) + src[:, hi] * frac).to(torch.float32).numpy()


def law_bank(knots: np.ndarray, values: np.ndarray, rows: int, vocab: int = VOCAB, seed: int = 0,
             device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``rows`` logits rows [rows, vocab] from stored profiles (knots [K], values float32 [N, K]: log-probabilities
    at the knots): law ``i mod N``'s log-probability at every rank (linear between knots), given to the ids in a
    random order of its own (seeded). A row's softmax is that law, renormalized."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ranks = torch.arange(vocab, dtype=torch.float64)
    k = torch.as_tensor(knots, dtype=torch.float64)
    right = torch.searchsorted(k, ranks).clamp(1, len(k) - 1)
    left = right - 1
    frac = ((ranks - k[left]) / (k[right] - k[left])).to(torch.float32)
    out = torch.empty(rows, vocab, dtype=dtype, device=device)
    for i in range(rows):
        v = torch.as_tensor(values[i % len(values)])
        sorted_logits = v[left] * (1 - frac) + v[right] * frac
        out[i] = sorted_logits[torch.randperm(vocab, generator=gen)].to(device=device, dtype=dtype)
    return out


def model_laws(spec: str, temperature: float, n_prompts: int, steps: int, seed: int) -> tuple[list, np.ndarray]:
    """The embedded model ``spec`` sampling plainly from the paper's first prompts (every task in turn): each
    step's law (float64 [n_prompts, V] log-probabilities at temperature) and the atomic counts summed over steps."""
    from mmw.engines.models import load_model
    from mmw.tasks import build_prompts, render_chat

    tokenizer, model = load_model(spec, device="cpu")  # padding on the left, as the loader sets it
    per_task = math.ceil(n_prompts / 3)
    table = build_prompts(["book_report", "story", "fake_news"], per_task)
    prompts = [table["prompt"][i * per_task + j] for j in range(per_task) for i in range(3)][:n_prompts]
    enc = tokenizer(render_chat(tokenizer, prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    gen = torch.Generator().manual_seed(seed)
    mask = enc.attention_mask
    laws, counts = [], np.zeros((3, 3), dtype=np.int64)
    with torch.no_grad():
        out = model(input_ids=enc.input_ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
        for _ in range(steps):
            logprobs = torch.log_softmax(out.logits[:, -1].to(torch.float64) / temperature, -1)
            laws.append(logprobs)
            seeds = torch.randint(-2**62, 2**62, (n_prompts,), generator=gen)
            counts += atomic_shares(logprobs.exp(), seeds)
            token = torch.multinomial(logprobs.exp(), 1, generator=gen)
            mask = torch.cat([mask, torch.ones_like(token)], 1)
            out = model(input_ids=token, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True,
                        logits_to_keep=1)
    return laws, counts


def random_init_laws(rows: int, seed: int) -> torch.Tensor:
    """Logits float64 [rows, 128,256] of the GPU benches' random-init Llama-3-8B shape at its last position
    (``bench/gpu_generate.build_model`` with one layer: the final norm sets the hidden state's scale, and the
    lm_head's init sets the logits'), its bf16 weights run in float32 on the CPU."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_generate import build_model

    model, _ = build_model(1, 4096, "cpu", "llama3-8b")
    ids = torch.randint(3, VOCAB, (rows, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model.float()(input_ids=ids, logits_to_keep=1).logits[:, -1].to(torch.float64)


def main(prompts: int = 8, steps: int = 64, temperatures: str = "0.7,1.0", seed: int = 0,
         models: str = "embedded:smollm2-135m,embedded:qwen2.5-coder-1.5b", out: str = "bench/results/tournament",
         bank_rows: int = 64, keep: int = 64) -> None:
    """``--temperatures``: the real laws' (the first is the profiles'); ``--keep``: laws a model stores in the
    profile file (evenly spaced over its steps and rows); ``--bank-rows``: rows of the stretch check."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed + 1)
    knots = knot_ranks()
    temps = [float(t) for t in temperatures.split(",")]
    result: dict = dict(date=time.strftime("%F"), layers=LAYERS, leaves=LEAVES, profile_temperature=temps[0],
                        prompts=prompts, steps=steps, rows={})
    profiles, names = [], []
    for spec in models.split(","):
        for temperature in temps:
            t0 = time.perf_counter()
            laws, counts = model_laws(spec, temperature, prompts, steps, seed)
            name = f"{spec}, T = {temperature}"
            result["rows"][name] = dict(vocab=laws[0].shape[-1], **summary(counts))
            print(f"{name}: {result['rows'][name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
            if temperature != temps[0]:
                continue
            values = np.concatenate([profile(lp, knots) for lp in laws])
            values = values[np.linspace(0, len(values) - 1, min(keep, len(values))).round().astype(np.int64)]
            profiles.append(values)
            names += [spec] * len(values)
            bank = law_bank(knots, values, bank_rows, seed=seed, dtype=torch.float64)
            stretched = atomic_shares(torch.softmax(bank, -1),
                                      torch.randint(-2**62, 2**62, (bank_rows,), generator=gen))
            result["rows"][f"{name}, stretched to {VOCAB:,} ids ({bank_rows} rows of the profile file)"] = dict(
                vocab=VOCAB, **summary(stretched))
    logits = random_init_laws(16, seed)
    for label, rows_logits in [("random-init Llama-3-8B shape, T = 1 (the decode part's law)", logits),
                               ("Gaussian logits, scale 3, T = 1 (the kernels and step parts')",
                                torch.randn(16, VOCAB, generator=gen, dtype=torch.float64) * 3)]:
        counts = atomic_shares(torch.softmax(rows_logits, -1), torch.randint(-2**62, 2**62, (16,), generator=gen))
        result["rows"][label] = dict(vocab=VOCAB, logit_std=round(float(rows_logits.std(-1).mean()), 3),
                                     **summary(counts))
        print(f"{label}: {result['rows'][label]}", flush=True)
    (out_dir / "laws.json").write_text(json.dumps(result, indent=1) + "\n")
    np.savez_compressed(out_dir / "real_laws.npz", knots=knots, values=np.concatenate(profiles).astype(np.float16),
                        models=np.array(names), temperature=temps[0], vocab=VOCAB)
    print(f"\n{'law':78s} adds a token per pass: today / skipping zeros")
    for name, row in result["rows"].items():
        print(f"{name:78s} {row['adds_per_token']} / {row['adds_per_token_skip_zero']}")


if __name__ == "__main__":
    typer.run(main)
