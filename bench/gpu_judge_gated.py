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
from gpu_judge_rows import sync
from gpu_judge_split import brief, numbers_apart, timed_kinds, write_result

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
    if pick and Path(pick).is_file():  # absent where the kernel bench did not finish: the module's own setting
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
            for kind, (measured, got) in timed_kinds(judge, backend, rows, prompts, kinds, passes, batch,
                                                     profiled=round_ == 0).items():
                run["kinds"][kind] = measured
                if round_ == 0:
                    probs.setdefault(kind, {})[name] = got
            result["runs"].append(run)
            print(brief(run), flush=True)
            del judge, backend
    result["gated_against_unfused"] = {}
    for kind, by_variant in probs.items():
        result["gated_against_unfused"][kind] = numbers_apart(by_variant["unfused"], by_variant["gated"])
    print(json.dumps(result["gated_against_unfused"]), flush=True)
    write_result(out, "gpu_judge_gated.json", result)


if __name__ == "__main__":
    typer.run(main)
