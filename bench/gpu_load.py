"""Loading a model folder onto the GPU: through host memory (``from_pretrained`` then ``.to``) against straight
to the device (``device_map``), alternately, in one process (the folder's files already in the page cache).

    PYTHONPATH=. python3 bench/gpu_load.py FOLDER --rounds 2
"""

from __future__ import annotations

import json
import time

import torch
import typer
from transformers import AutoModelForCausalLM


def main(folder: str, rounds: int = 2) -> None:
    rows = []
    for round_ in range(rounds):
        for way in ("host-then-device", "device_map"):
            torch.cuda.synchronize()
            start = time.perf_counter()
            if way == "device_map":
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map="cuda")
            else:
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to("cuda")
            torch.cuda.synchronize()
            rows.append(dict(round=round_, way=way, seconds=round(time.perf_counter() - start, 2)))
            print(json.dumps(rows[-1]), flush=True)
            del model
            torch.cuda.empty_cache()


if __name__ == "__main__":
    typer.run(main)
