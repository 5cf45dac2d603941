"""The judge's set-up (its compiled layers traced and compiled) and its expected-mode judging, for whichever
``mmw/judge/judge.py`` is on the path: one process, one variant. bench/gpu_judge_trace_ab_h200.sh runs it for
main's judge and the changed one, each with its own Inductor cache (cold, then warm), and compares the grade
probabilities bit for bit.

Rows and judge as bench/gpu_judge_compile.py (bench/gpu_judge_plan.py: random-token texts and their attacked
copies, a random-init Llama-3-8B judge in bf16, batches as the rate stage cuts them on CUDA).

    PYTHONPATH=.:bench python3 bench/gpu_judge_trace_ab.py --tokenizer DIR --label before_cold --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from gpu_judge_plan import stand_in_judge_model, stand_in_rows  # bench/ is run as scripts, not a package

from mmw.judge.backends import TransformersBackend
from mmw.judge.judge import MAX_GRADE, Judge


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(tokenizer: Path = typer.Option(...), texts: int = 96, tokens: int = 1024, batch: int = 16,
         tiny: bool = False, label: str = "", out: str = ".") -> None:
    t0 = time.perf_counter()
    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    model = stand_in_judge_model(tok, tiny)
    sync()
    result = {"label": label, "rows": len(rows), "batch": batch, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "rows_and_model_s": round(time.perf_counter() - t0, 2)}
    from torch._dynamo.utils import counters

    t0 = time.perf_counter()
    judge = Judge(tok, model, batch_size=batch, compiled=True)
    sync()
    result["setup_s"] = round(time.perf_counter() - t0, 2)  # the layers traced and compiled on two rows
    result["compiled"] = judge._compiled is not None
    result["arithmetic"] = judge.arithmetic
    plan = TransformersBackend(judge, "stand-in").plan(rows)
    for name in ("pass1", "pass2"):
        sync()
        start = time.perf_counter()
        probs = np.zeros((len(rows), MAX_GRADE + 1))
        groups = (([prompts[i] for i in unit], [rows[i] for i in unit]) for unit in plan)
        for unit, block in zip(plan, judge.grade_distributions(groups), strict=True):  # as the rate stage
            probs[unit] = block
        sync()
        seconds = time.perf_counter() - start
        result[name] = {"s": round(seconds, 2), "ms_per_judgement": round(1000 * seconds / len(rows), 2)}
        print(label, name, result[name], flush=True)
    result["graphs"] = int(counters["stats"]["unique_graphs"])
    Path(out).mkdir(parents=True, exist_ok=True)
    np.save(Path("/tmp", f"judge_probs_{label}.npy"), probs)
    Path(out, f"gpu_judge_trace_{label}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    typer.run(main)
