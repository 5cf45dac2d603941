"""The CPU's matmul ceiling and the default run's judge floor: what no judge implementation on this CPU beats.

Times an n x n x n matmul in float32 and bfloat16 with torch (the threads torch uses by default) and turns the
faster rate into the judge's floor for the default run: ``--judgements`` (135) x ``--tflop-per-judgement`` (0.8:
~1.5e9 parameters x 2 FLOP x ~270 tokens of prompt, response and grade trie).

    python bench/cpu_floor.py
"""

from __future__ import annotations

import json
import time

import torch
import typer


def rate(dtype: torch.dtype, n: int, repeats: int) -> float:
    a, b = (torch.randn(n, n).to(dtype) for _ in range(2))
    a @ b  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return repeats * 2 * n**3 / (time.perf_counter() - start) / 1e9


def main(n: int = 2048, repeats: int = 5, judgements: int = 135, tflop_per_judgement: float = 0.8) -> None:
    rates = {str(dtype).removeprefix("torch."): round(rate(dtype, n, repeats), 1)
             for dtype in (torch.float32, torch.bfloat16)}
    best = max(rates.values())
    print(json.dumps(dict(threads=torch.get_num_threads(), n=n, gflops=rates,
                          judge_floor_s=round(judgements * tflop_per_judgement * 1e3 / best))))


if __name__ == "__main__":
    typer.run(main)
