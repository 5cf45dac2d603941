"""The three sizes on real watermarked text: the embedded SmolLM2 generator writes ``--per-task`` x 3 tasks texts of
``--tokens`` tokens per sum scheme and temperature; each text's E (first crossing), checkpoint size and anytime size
are computed by the detector (medians with distribution-free 95% intervals; the share of texts whose anytime size
is below the checkpoint size), and the unwatermarked generations of the same prompts (generated after each
temperature's watermarked rows; ``--no-baseline`` skips them) give the three any-prefix false-positive counts on
real model text. Prints Markdown tables for bench/RESULTS.md; ``--out`` keeps every text's sizes as JSON.

    nice -n 19 python bench/anytime_real.py --per-task 10 --tokens 200 --temperatures 0.7,1.0 --batch-size 30 \\
        --out bench/results/anytime_real_cpu.json

Generations are stored under ``--parts`` (resumable: rerunning skips finished batches).
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import numpy as np
import torch
import typer

from mmw.watermark.detector import Detector
from mmw.engines.generate import generate
from mmw.engines.models import load_model
from mmw.io import write_json
from mmw.watermark.prf import key_from_string
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec
from mmw.stages.common import generator_vocab_size
from mmw.sweep.race_bounds import median_bounds
from mmw.tasks import build_prompts, render_chat

from fpr import SCHEMES as FPR_SCHEMES  # noqa: E402  (bench/ is the script's directory)

#: The sum schemes of bench/fpr.py with text-dependent randomness of window >= 1, one per sampler.
SCHEMES = {name.removesuffix(", sum"): params for name, params in FPR_SCHEMES.items()
           if params["score"] == "sum" and params["randomness"] == "window" and params["window"] >= 1}


def _sizes(values: list[int | None]) -> np.ndarray:
    return np.array([np.inf if v is None else v for v in values], dtype=float)


def _median_cell(values: list[int | None]) -> tuple[str, list[float]]:
    """Median with its distribution-free 95% interval (order statistics, ``mmw.sweep.race_bounds.median_bounds`` at
    2.5% a side), undetected = inf."""
    median, low, high = (float(v) for v in median_bounds(_sizes(values), 0.025))
    return f"{median:g} [{low:g}, {high:g}]", [median, low, high]


def main(per_task: int = 8, tokens: int = 200, temperatures: str = "0.7,1.0", alpha: float = 0.02,
         parts: Path = Path("/tmp/mmw-anytime-real"), batch_size: int = 8, only: str = "",
         baseline: bool = True, out: Path | None = None) -> None:
    """``--no-baseline``: skip the unwatermarked generations (the baseline FPR table). ``--out``: a JSON record
    (every text's three sizes per row), rewritten after each row."""
    tokenizer, model = load_model("embedded:smollm2-135m", "cpu", "float32")
    vocab = generator_vocab_size(tokenizer, model)
    prompts = build_prompts(["book_report", "story", "fake_news"], per_task=per_task)
    chats = render_chat(tokenizer, prompts["prompt"].to_list())
    ids = prompts["prompt_id"].to_list()
    key = key_from_string("bench-anytime-real")
    record = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "alpha": alpha,
              "tokens": tokens, "prompts": len(ids), "batch_size": batch_size, "torch_threads": torch.get_num_threads(),
              "rows": [], "baseline": []}
    print(f"alpha={alpha}, {len(ids)} prompts x {tokens} new tokens, SmolLM2-135M (embedded), CPU; medians with "
          "their 95% order-statistic intervals, undetected = inf\n")
    print("| scheme | T | texts | mean tokens | detected: E / valid / anytime | median E | median valid | "
          "median anytime | median anytime / E (per text) | anytime < valid (texts) | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for temperature in (float(t) for t in temperatures.split(",")):
        detectors = {}
        for name, params in SCHEMES.items():
            if only not in name:
                continue
            t0 = time.perf_counter()
            spec = SchemeSpec.from_params({**params, "alpha": alpha})
            table = generate(model, tokenizer, chats,
                             lambda s, spec=spec: WatermarkProcessor(spec, key, vocab, s, temperature),
                             tokens, batch_size, prompt_ids=ids, seed=1,
                             parts_dir=parts / f"{name.split(',')[0].replace(' ', '-')}-T{temperature:g}",
                             progress=False)
            detectors[name] = detector = Detector(spec, key, vocab, device="cpu")
            marked = detector.detect([np.asarray(t, dtype=np.int64) for t in table["tokens"].to_list()])
            first = [r.size for r in marked]
            valid = [r.size_valid for r in marked]
            anytime = [r.size_anytime for r in marked]
            ratio = [a / f for f, a in zip(first, anytime, strict=True) if f is not None and a is not None]
            below = int(np.sum(_sizes(anytime) < _sizes(valid)))
            detected = " / ".join(f"{np.mean([s is not None for s in sizes]):.2f}" for sizes in (first, valid,
                                                                                               anytime))
            cells = [_median_cell(sizes) for sizes in (first, valid, anytime)]
            seconds = time.perf_counter() - t0
            print(f"| {name} | {temperature:g} | {len(marked)} | {table['n_tokens'].mean():.0f} | {detected} | "
                  + " | ".join(c[0] for c in cells) + f" | {np.median(ratio) if ratio else float('nan'):.2f} | "
                  f"{below}/{len(marked)} | {seconds:.0f} |", flush=True)
            record["rows"].append({
                "scheme": name, "temperature": temperature, "texts": len(marked),
                "mean_tokens": float(table["n_tokens"].mean()), "size_E": first, "size_valid": valid,
                "size_anytime": anytime, "median_E": cells[0][1], "median_valid": cells[1][1],
                "median_anytime": cells[2][1], "anytime_below_valid": below,
                "anytime_above_valid": int(np.sum(_sizes(anytime) > _sizes(valid))),
                "median_ratio_anytime_E": float(np.median(ratio)) if ratio else None, "seconds": seconds})
            if out is not None:
                write_json(record, out)
        if not baseline or not detectors:
            continue
        t0 = time.perf_counter()
        table = generate(model, tokenizer, chats, lambda s: WatermarkProcessor(None, None, vocab, s, temperature),
                         tokens, batch_size, prompt_ids=ids, seed=1, parts_dir=parts / f"baseline-T{temperature:g}",
                         progress=False)
        texts = [np.asarray(t, dtype=np.int64) for t in table["tokens"].to_list()]
        for name, detector in detectors.items():
            null = detector.detect(texts)
            counts = [int(sum(getattr(r, attr) is not None for r in null))
                      for attr in ("size", "size_valid", "size_anytime")]
            record["baseline"].append({"scheme": name, "temperature": temperature, "texts": len(null),
                                       "E": counts[0], "valid": counts[1], "anytime": counts[2],
                                       "seconds": time.perf_counter() - t0})
            print(f"| {name} | {temperature:g} | baseline: any-prefix detections E / valid / anytime = "
                  f"{counts[0]} / {counts[1]} / {counts[2]} of {len(null)} |", flush=True)
        if out is not None:
            write_json(record, out)


if __name__ == "__main__":
    typer.run(main)
