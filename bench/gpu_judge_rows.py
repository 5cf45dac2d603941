"""The judge's set-up and its rows, on one GPU: (1) loading the stand-in tokenizer (Llama-3's 128,256 ids, 79,104 of
them added tokens) through ``from_pretrained`` against ``mmw.engines.models._direct_tokenizer``, interleaved
rounds in one process; (2) the compiled judge on a rate stage's kinds of rows, texts against their attacked
copies: tokens a row, ms a judgement, ms per 1,000 row tokens, and where a batch's device time goes (torch
profiler: matrix products, attention, compiled elementwise kernels, the rest; device busy against wall time).

Rows: ``--texts`` random-token texts of ``--tokens`` tokens decoded through the widened tokenizer (what the random-init
generator writes) and, for the first third, one copy per attack of params-full.yaml's list that changes a text
(``bench/gpu_judge_plan.py``). Judge: a random-init Llama-3-8B shape in bf16, batch 16, compiled as on CUDA.

    PYTHONPATH=.:bench python3 bench/gpu_judge_rows.py --tokenizer /tmp/tok --out DIR
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import torch
import typer
from gpu_judge_plan import ATTACKS, stand_in_judge_model, stand_in_rows  # bench/ is run as scripts
from transformers import PreTrainedTokenizerFast

from mmw.engines.models import _direct_tokenizer, _padding_left
from mmw.judge.backends import TransformersBackend
from mmw.judge.judge import Judge


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tokenizer_loads(folder: Path, rounds: int) -> dict:
    """Seconds of each load, ``from_pretrained`` and direct interleaved (the order alternates by round), and
    whether the two build the same backend and special tokens."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    loaders = {"from_pretrained": lambda: PreTrainedTokenizerFast.from_pretrained(str(folder)),
               "direct": lambda: _direct_tokenizer(PreTrainedTokenizerFast, str(folder), config)}
    times: dict[str, list[float]] = {name: [] for name in loaders}
    built = {}
    for r in range(rounds):
        for name in (("from_pretrained", "direct") if r % 2 == 0 else ("direct", "from_pretrained")):
            gc.collect()
            start = time.perf_counter()
            built[name] = loaders[name]()
            times[name].append(round(time.perf_counter() - start, 3))
    a, b = built["from_pretrained"], built["direct"]
    same = (a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str() and len(a) == len(b)
            and a.all_special_ids == b.all_special_ids and a.chat_template == b.chat_template)
    return {"seconds": times, "same_tokenizer": same}


def categories(profile) -> dict:
    """Device ms by kernel kind over a profiled region."""
    kinds = {"gemm": 0.0, "attention": 0.0, "triton": 0.0, "other": 0.0}
    top: dict[str, float] = {}
    for event in profile.key_averages():
        ms = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0)) / 1000
        if ms <= 0 or event.key.startswith(("ProfilerStep", "aten::", "cuda", "Torch-Compiled", "CompiledFunction")):
            continue
        name = event.key
        low = name.lower()
        # attention first: cuDNN's fused attention kernel's name holds "sm90_" too
        kind = ("triton" if name.startswith("triton")
                else "attention" if any(k in low for k in ("sdpa", "fmha", "flash", "attention"))
                else "gemm" if any(k in low for k in ("nvjet", "gemm", "cutlass", "xmma", "sm90_", "matmul"))
                else "other")
        kinds[kind] += ms
        top[name] = top.get(name, 0.0) + ms
    return {"ms": {k: round(v, 2) for k, v in kinds.items()},
            "top": sorted(((round(v, 2), k[:110]) for k, v in top.items()), reverse=True)[:12]}


def main(tokenizer: Path = typer.Option(...), texts: int = 96, tokens: int = 1024, batch: int = 16,
         rounds: int = 3, tiny: bool = False, out: str = "") -> None:
    result: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__}
    result["tokenizer_load"] = tokenizer_loads(tokenizer, rounds)
    print(json.dumps(result["tokenizer_load"]), flush=True)

    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    _padding_left(tok)
    model = stand_in_judge_model(tok, tiny)
    model.set_attn_implementation("sdpa")
    sync()
    start = time.perf_counter()
    judge = Judge(tok, model, batch_size=batch)
    sync()
    result["judge_build_s"] = round(time.perf_counter() - start, 2)
    result["compiled"] = judge._compiled is not None
    backend = TransformersBackend(judge, "stand-in")
    kinds = {"texts": list(range(texts)), "attacked": list(range(texts, len(rows)))}
    row_tokens = judge.token_counts(rows)
    list(backend.rate_units([([prompts[i] for i in u], [rows[i] for i in u])
                             for u in backend.plan(rows[:2 * batch])], "expected"))  # warm-up
    result["kinds"] = {}
    for kind, members in kinds.items():
        kind_rows, kind_prompts = [rows[i] for i in members], [prompts[i] for i in members]
        plan = backend.plan(kind_rows)
        units = [([kind_prompts[i] for i in u], [kind_rows[i] for i in u]) for u in plan]
        seconds = []
        for _ in range(rounds):
            sync()
            start = time.perf_counter()
            for _ in backend.rate_units(iter(units), "expected"):
                pass
            sync()
            seconds.append(time.perf_counter() - start)
        n_tokens = sum(row_tokens[i] for i in members)
        positions = sum(max(row_tokens[members[i]] for i in u) * len(u) for u in plan)
        activity = torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available() else \
            torch.profiler.ProfilerActivity.CPU
        with torch.profiler.profile(activities=[activity]) as profile:
            for _ in backend.rate_units(iter(units[:4]), "expected"):
                pass
            sync()
        profiled = sum(len(u) for u in plan[:4])
        split = categories(profile)
        result["kinds"][kind] = {
            "rows": len(members), "text_tokens_per_row": round(n_tokens / len(members), 1),
            "padded_text_positions_per_row": round(positions / len(members), 1),
            "ms_per_judgement": [round(1000 * s / len(members), 2) for s in seconds],
            "ms_per_1000_text_tokens": round(1e6 * min(seconds) / n_tokens, 3),
            "device_ms_per_judgement_profiled": {k: round(v / profiled, 2) for k, v in split["ms"].items()},
            "top_kernels_ms": split["top"]}
        print(kind, json.dumps(result["kinds"][kind]), flush=True)
    result["attacks"] = ATTACKS
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_judge_rows.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
