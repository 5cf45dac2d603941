"""Where the judge's construction goes (``mmw.judge.judge.Judge(...)`` on a loaded random-init Llama-3-8B), under cProfile:
the grade trie, the digit mask over the vocabulary, and the compilation of its decoder layers on two rows. Run it
twice with one ``TORCHINDUCTOR_CACHE_DIR`` to see a cold and a warm compilation cache (each run a fresh process).

    PYTHONPATH=.:bench python3 bench/gpu_judge_load.py --tokenizer DIR --out result.json
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
import typer
from gpu_judge_plan import stand_in_judge_model  # bench/ is run as scripts, not a package
from transformers import AutoTokenizer

from mmw.judge.judge import Judge, digit_start_mask, grade_trie


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(tokenizer: Path = typer.Option(...), tiny: bool = False, out: str = "", top: int = 30) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer)
    model = stand_in_judge_model(tok, tiny)
    sync()
    parts = {}
    t0 = time.perf_counter()
    grade_trie(tok)
    parts["grade_trie_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    digit_start_mask(tok, model.get_output_embeddings().weight.shape[0])
    parts["digit_mask_s"] = time.perf_counter() - t0
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    judge = Judge(tok, model, batch_size=16)
    sync()
    profiler.disable()
    parts["judge_s"] = time.perf_counter() - t0
    parts["compiled"] = judge._compiled is not None
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in parts.items()}))
    print(text.getvalue())
    if out:
        Path(out).write_text(json.dumps({**parts, "profile": text.getvalue()}, indent=1))


if __name__ == "__main__":
    typer.run(main)
