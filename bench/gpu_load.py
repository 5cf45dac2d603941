"""Loading a model folder onto the GPU, alternately in one process (the folder's files already in the page cache):
transformers' own reads (``from_pretrained(device_map=...)``, what ``mmw.engines.models.load_model`` does), the
straight-to-device reader of bench/device_reads.py, and that reader's file reads alone (no model built). The two
loaded models are compared tensor by tensor.

    PYTHONPATH=.:bench python3 bench/gpu_load.py FOLDER --rounds 2 --out result.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import typer
from device_reads import from_device_weights, read_weights  # bench/ is run as scripts, not a package
from transformers import AutoModelForCausalLM


def main(folder: Path, rounds: int = 2, out: str = "") -> None:
    device = torch.device("cuda")
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    rows: list[dict] = []
    reference = None
    for round_ in range(rounds):
        for way in ("transformers", "direct", "reads only"):
            torch.cuda.synchronize()
            start = time.perf_counter()
            if way == "transformers":
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map=device)
            elif way == "direct":
                model = from_device_weights(folder, device, torch.bfloat16)
            else:
                model = read_weights(folder, device)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            row = dict(round=round_, way=way, seconds=round(seconds, 2), gb_per_s=round(size / seconds / 1e9, 2))
            if way == "transformers" and reference is None:
                reference = {k: v.clone() for k, v in model.state_dict().items()}
            if way == "direct":
                state = model.state_dict()
                row["identical"] = sorted(state) == sorted(reference) and all(
                    torch.equal(state[k], reference[k]) for k in reference)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del model
            torch.cuda.empty_cache()
    if out:
        Path(out).write_text(json.dumps({"folder": str(folder), "bytes": size, "rows": rows}, indent=1))


if __name__ == "__main__":
    typer.run(main)
