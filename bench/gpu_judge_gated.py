"""The compiled judge with its MLPs' up-projection fused (``mmw.engines.gated_mlp``: both products and SiLU x up in
one Triton kernel) against the judge as it was (two cuBLAS products, then Inductor's elementwise kernel), on one GPU:
ms a judgement on the stage's two kinds of rows, interleaved rounds (each variant a fresh compilation each round),
the device time by kernel kind (torch profiler, 4 batches, first round), and how far the fused judge's numbers are
from the unfused one's.

Rows as ``bench/gpu_judge_split.py``: ``--texts`` random-token texts of ``--tokens`` tokens and, for the first third,
one copy per attack of params-full.yaml's list; the judge a random-init Llama-3-8B shape in bf16, batch 16.
``--config BM,BN,BK,WARPS,STAGES,GROUP`` sets the kernel's launch (default: ``gated_mlp.CONFIG``); ``--pick FILE``
takes the fastest pointer configuration of ``bench/gpu_gated_mlp.py``'s JSON at its first row count instead.

    PYTHONPATH=.:bench python3 bench/gpu_judge_gated.py --tokenizer /tmp/tokq --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from gpu_judge_plan import stand_in_judge_model, stand_in_rows  # bench/ is run as scripts
from gpu_judge_rows import categories, sync

from mmw.engines import gated_mlp
from mmw.engines.models import _padding_left
from mmw.judge.backends import TransformersBackend
from mmw.judge.judge import Judge

VARIANTS = {"unfused": False, "gated": True}


def picked(path: Path) -> tuple[int, ...]:
    """The fastest pointer-kernel configuration in a ``gpu_gated_mlp.py`` result, at its first row count."""
    shapes = json.loads(path.read_text())["shapes"]
    variants = next(iter(shapes.values()))["variants"]
    timed = {name: v["ms"] for name, v in variants.items() if isinstance(v, dict) and name.startswith("triton/")}
    return tuple(int(p) for p in min(timed, key=timed.get).split("/")[1].split("x"))


def main(tokenizer: Path = typer.Option(...), texts: int = 96, tokens: int = 1024, batch: int = 16,
         passes: int = 2, rounds: int = 2, config: str = "", pick: str = "", out: str = "") -> None:
    if pick:
        gated_mlp.CONFIG = picked(Path(pick))
    elif config:
        gated_mlp.CONFIG = tuple(int(p) for p in config.split(","))
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "passes": passes,
                    "rounds": rounds, "batch": batch, "config": list(gated_mlp.CONFIG), "runs": []}
    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    _padding_left(tok)
    model = stand_in_judge_model(tok, False)
    model.set_attn_implementation("sdpa")
    kinds = {"texts": list(range(texts)), "attacked": list(range(texts, len(rows)))}
    probs: dict[str, dict[str, np.ndarray]] = {}
    for round_ in range(rounds):
        for name, fused in VARIANTS.items():
            torch._dynamo.reset()  # a fresh compilation each round
            sync()
            start = time.perf_counter()
            judge = Judge(tok, model, batch_size=batch, fused_mlp=fused)
            sync()
            run: dict = {"round": round_, "variant": name, "judge_build_s": round(time.perf_counter() - start, 2),
                         "arithmetic": judge.arithmetic, "compile_error": judge.compile_error, "kinds": {}}
            backend = TransformersBackend(judge, "stand-in")
            row_tokens = judge.token_counts(rows)
            list(judge.grade_distributions([([prompts[i] for i in u], [rows[i] for i in u])
                                            for u in backend.plan(rows[:2 * batch])]))  # warm-up
            for kind, members in kinds.items():
                kind_rows, kind_prompts = [rows[i] for i in members], [prompts[i] for i in members]
                units = [([kind_prompts[i] for i in u], [kind_rows[i] for i in u]) for u in backend.plan(kind_rows)]
                seconds = []
                for _ in range(passes):
                    sync()
                    start = time.perf_counter()
                    got = np.concatenate(list(judge.grade_distributions(units)))
                    sync()
                    seconds.append(time.perf_counter() - start)
                entry = {"rows": len(members),
                         "text_tokens_per_row": round(sum(row_tokens[i] for i in members) / len(members), 1),
                         "ms_per_judgement": [round(1000 * s / len(members), 2) for s in seconds]}
                if round_ == 0:
                    probs.setdefault(kind, {})[name] = got
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                        list(judge.grade_distributions(units[:4]))
                        sync()
                    split = categories(profile)
                    profiled = sum(len(u[1]) for u in units[:4])
                    entry["device_ms_per_judgement_profiled"] = {k: round(v / profiled, 2)
                                                                 for k, v in split["ms"].items()}
                    entry["top_kernels_ms"] = split["top"][:12]
                run["kinds"][kind] = entry
            result["runs"].append(run)
            print(json.dumps({k: v if k != "kinds" else {kk: {x: y for x, y in vv.items() if x != "top_kernels_ms"}
                                                          for kk, vv in v.items()} for k, v in run.items()}),
                  flush=True)
            del judge, backend
    result["gated_against_unfused"] = {}
    for kind, by_variant in probs.items():
        a, b = by_variant["unfused"], by_variant["gated"]
        grades = np.arange(a.shape[1])
        mean_a, mean_b = (p @ grades / np.maximum(p.sum(-1), 1e-30) for p in (a, b))
        result["gated_against_unfused"][kind] = {
            "probability_max_abs_diff": float(np.abs(a - b).max()),
            "expected_grade_max_abs_diff": round(float(np.abs(mean_a - mean_b).max()), 5),
            "expected_grade_mean_abs_diff": round(float(np.abs(mean_a - mean_b).mean()), 6)}
    print(json.dumps(result["gated_against_unfused"]), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_judge_gated.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
