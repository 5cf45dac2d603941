"""The three sizes on real watermarked text: the embedded SmolLM2 generator writes ``--per-task`` x 3 tasks texts of
``--tokens`` tokens per sum scheme and temperature; each text's E (first crossing), checkpoint size and anytime size
are computed by the detector, and the unwatermarked generations of the same prompts give the three any-prefix
false-positive rates on real model text. Prints a Markdown table for bench/RESULTS.md.

    nice -n 19 python bench/anytime_real.py --per-task 8 --tokens 200 --temperatures 0.7,1.0

Generations are stored under ``--parts`` (resumable: rerunning skips finished batches).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import typer

from mmw.detector import Detector
from mmw.engines.generate import generate
from mmw.engines.models import load_model
from mmw.prf import key_from_string
from mmw.processor import WatermarkProcessor
from mmw.scheme import SchemeSpec
from mmw.stages.common import generator_vocab_size
from mmw.tasks import build_prompts, render_chat

from fpr import SCHEMES as FPR_SCHEMES, _median  # noqa: E402  (bench/ is the script's directory)

#: The sum schemes of bench/fpr.py with text-dependent randomness of window >= 1, one per sampler.
SCHEMES = {name.removesuffix(", sum"): params for name, params in FPR_SCHEMES.items()
           if params["score"] == "sum" and params["randomness"] == "window" and params["window"] >= 1}


def main(per_task: int = 8, tokens: int = 200, temperatures: str = "0.7,1.0", alpha: float = 0.02,
         parts: Path = Path("/tmp/mmw-anytime-real"), batch_size: int = 8, only: str = "") -> None:
    tokenizer, model = load_model("embedded:smollm2-135m", "cpu", "float32")
    vocab = generator_vocab_size(tokenizer, model)
    prompts = build_prompts(["book_report", "story", "fake_news"], per_task=per_task)
    chats = render_chat(tokenizer, prompts["prompt"].to_list())
    ids = prompts["prompt_id"].to_list()
    key = key_from_string("bench-anytime-real")
    print(f"alpha={alpha}, {len(ids)} prompts x {tokens} new tokens, SmolLM2-135M (embedded), CPU\n")
    print("| scheme | T | texts | mean tokens | detected: E / valid / anytime | median E | median valid | "
          "median anytime | median anytime / E (per text) | anytime < valid (texts) | baseline any-prefix FPR: "
          "E / valid / anytime | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for temperature in (float(t) for t in temperatures.split(",")):
        baseline = None
        for name, params in SCHEMES.items():
            if only not in name:
                continue
            t0 = time.perf_counter()
            spec = SchemeSpec.from_params({**params, "alpha": alpha})
            if baseline is None:  # unwatermarked generations of the same prompts (plain sampling, same seeds)
                baseline = generate(model, tokenizer, chats, lambda s: WatermarkProcessor(None, None, vocab, s,
                                                                                          temperature),
                                    tokens, batch_size, prompt_ids=ids, seed=1,
                                    parts_dir=parts / f"baseline-T{temperature:g}", progress=False)
            table = generate(model, tokenizer, chats,
                             lambda s, spec=spec: WatermarkProcessor(spec, key, vocab, s, temperature),
                             tokens, batch_size, prompt_ids=ids, seed=1,
                             parts_dir=parts / f"{name.split(',')[0].replace(' ', '-')}-T{temperature:g}",
                             progress=False)
            detector = Detector(spec, key, vocab, device="cpu")
            marked = detector.detect([np.asarray(t, dtype=np.int64) for t in table["tokens"].to_list()])
            null = detector.detect([np.asarray(t, dtype=np.int64) for t in baseline["tokens"].to_list()])
            first = [r.size for r in marked]
            valid = [r.size_valid for r in marked]
            anytime = [r.size_anytime for r in marked]
            ratio = [a / f for f, a in zip(first, anytime, strict=True) if f is not None and a is not None]
            below = sum(a is not None and (v is None or a < v) for v, a in zip(valid, anytime, strict=True))
            rate = [np.mean([getattr(r, attr) is not None for r in null]) for attr in
                    ("size", "size_valid", "size_anytime")]
            detected = " / ".join(f"{np.mean([s is not None for s in sizes]):.2f}" for sizes in (first, valid,
                                                                                               anytime))
            print(f"| {name} | {temperature:g} | {len(marked)} | {table['n_tokens'].mean():.0f} | {detected} | "
                  f"{_median(first):g} | {_median(valid):g} | {_median(anytime):g} | "
                  f"{np.median(ratio) if ratio else float('nan'):.2f} | {below}/{len(marked)} | "
                  f"{rate[0]:.3f} / {rate[1]:.3f} / {rate[2]:.3f} (n={len(null)}) | {time.perf_counter() - t0:.0f} |",
                  flush=True)


if __name__ == "__main__":
    typer.run(main)
