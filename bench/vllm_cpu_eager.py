"""vLLM engines on a CPU, compiled (vLLM's default) against eager (``enforce_eager``): engine start-up, then one
judging call (8 ratings in MODE: greedy or expected), in interleaved rounds, each start in a fresh process.

    .venv-vllm/bin/python bench/vllm_cpu_eager.py [ROUNDS] [MODE]

Each measurement runs in its own process (vLLM's compile caches live in the process and in ~/.cache/vllm, which a
round clears first, so every compiled start is what a fresh machine pays). Prints one JSON line per run and a
summary; mmw starts every CPU engine eagerly (mmw.engines.models.vllm_enforce_eager).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
import torch
torch.set_num_threads(2)
from mmw.judge.backends import VLLMBackend
eager = sys.argv[1] == "eager"
prompts = ["Write a story about a cat.", "Write a book report about Dune, written by Frank Herbert."] * 4
texts = ["The cat sat on the mat. It was a sunny day and the cat was happy. Then it slept by the fire.",
         "Dune follows Paul Atreides, whose family takes over the desert planet Arrakis."] * 4
started = time.perf_counter()
engine = VLLMBackend("embedded:smollm2-135m", "float32", 8, max_model_len=2048, enforce_eager=eager)
up = time.perf_counter()
ratings = dict(engine.rate_stream(prompts, texts, sys.argv[2]))
done = time.perf_counter()
shown = [r if r is None or isinstance(r, float) else str(r) for r in (ratings[i] for i in range(len(texts)))]
print(json.dumps({"mode": sys.argv[1], "start_s": round(up - started, 1), "rate_8_s": round(done - up, 2),
                  "rated": sys.argv[2], "ratings": shown}))
"""


def main(rounds: int, rating_mode: str) -> None:
    if rating_mode not in ("greedy", "expected"):
        raise SystemExit(f"MODE: {rating_mode!r}; allowed: greedy, expected")
    runs: dict[str, list[float]] = {"compiled": [], "eager": []}
    for index in range(rounds):
        for mode in (("compiled", "eager") if index % 2 == 0 else ("eager", "compiled")):
            shutil.rmtree(Path.home() / ".cache/vllm", ignore_errors=True)
            done = subprocess.run([sys.executable, "-c", CHILD, mode, rating_mode], capture_output=True, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "2"}, check=False)
            line = [x for x in done.stdout.splitlines() if x.startswith("{")]
            if done.returncode != 0 or not line:
                print(done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{mode} run failed ({done.returncode})")
            record = json.loads(line[-1])
            print(json.dumps({"round": index + 1, **record}), flush=True)
            runs[mode].append(record["start_s"])
    print(json.dumps({mode: {"start_s": values, "median": statistics.median(values)} for mode, values in runs.items()}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2, sys.argv[2] if len(sys.argv) > 2 else "expected")
