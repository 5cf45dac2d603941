"""Seconds per judgement: the in-process judge (transformers) vs the same GGUF behind llama.cpp's OpenAI-compatible
server (xllamacpp), in both rating modes, and how far the server's expected ratings are from the in-process ones.

    python bench/judge_backends.py --judge embedded:smollm2-135m --texts 8 --threads 2 [--concurrency 2]
                                   [--table data/generations/baseline.parquet]

Texts: the first ``--texts`` rows of a generations table (default: this run's baseline) if there is one, else a
few fixed paragraphs (each made unique, so the cache's de-duplication does not flatter the server). Each backend rates the same texts with a fresh judgement cache, so nothing is
reused. The in-process judge runs with ``--threads`` torch threads; the server with ``--threads`` CPU threads
and ``--concurrency`` slots (the client keeps that many requests in flight). Prints one JSON object.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch
import typer

from mmw.attacks.llm_server import LocalLLMServer
from mmw.engines.models import load_model
from mmw.judge.judge import Judge
from mmw.judge.backends import CachedRater, JudgementCache, ServerBackend

FALLBACK = [
    ("Write a story about a cat.", "The cat sat on the mat. It was a sunny day and the cat was happy. Then it slept."),
    ("Write a book report about Dune, written by Frank Herbert.",
     "Dune is a novel about Paul Atreides, whose family takes control of the desert planet Arrakis. The book "
     "explores politics, religion and ecology."),
    ("Write a news article about the president's visit to Paris.",
     "visit the a president news the capital city yesterday was on met ministers and Paris"),
]


def _texts(n: int, path: Path) -> tuple[list[str], list[str]]:
    if path.is_file():
        table = pl.read_parquet(path).head(n)
        return table["prompt"].to_list(), table["text"].to_list()
    rows = (FALLBACK * n)[:n]
    return [p for p, _ in rows], [f"{t} ({i})" for i, (_, t) in enumerate(rows)]


def main(
    judge: str = typer.Option("embedded:smollm2-135m", help="embedded:<name> or a .gguf (served and in process)"),
    texts: int = typer.Option(8, help="texts to rate"),
    threads: int = typer.Option(2, help="torch threads in process; CPU threads of the server"),
    concurrency: int = typer.Option(2, help="server slots and client requests in flight"),
    dtype: str = typer.Option("float32", help="in-process dtype"),
    table: Path = typer.Option(Path("data/generations/baseline.parquet"), help="generations to rate"),
) -> None:
    prompts, items = _texts(texts, table)
    result: dict = {"judge": judge, "texts": len(items), "threads": threads, "concurrency": concurrency,
                    "dtype_in_process": dtype}
    torch.set_num_threads(threads)
    tokenizer, model = load_model(judge, "cpu", dtype)
    local = Judge(tokenizer, model, batch_size=8, max_new_tokens=8)
    local_ratings = {}
    for mode in ("expected", "greedy"):
        started = time.perf_counter()
        local_ratings[mode] = local.rate(prompts, items, [mode])[mode]
        result[f"in_process_{mode}_s_per_text"] = round((time.perf_counter() - started) / len(items), 3)
    del local, model
    with LocalLLMServer(judge, parallel=concurrency, ctx=4096 * concurrency, threads=threads) as server:
        backend = ServerBackend(server.base_url, judge, "OPENAI_API_KEY", 300, 1, concurrency, 8)
        backend.probe(want_expected=True)
        result["server_expected_via"] = backend.expected_via
        for mode in ("expected", "greedy"):
            with tempfile.TemporaryDirectory() as cache:
                rater = CachedRater(backend, JudgementCache(Path(cache)))
                started = time.perf_counter()
                ratings = rater.rate(prompts, items, [mode])[mode]
                result[f"server_{mode}_s_per_text"] = round((time.perf_counter() - started) / len(items), 3)
                result[f"server_{mode}_failed"] = rater.stats.failed
            pairs = [(a, b) for a, b in zip(ratings, local_ratings[mode], strict=True)
                     if a is not None and b is not None]
            if mode == "expected":
                result["expected_max_abs_difference"] = round(max(abs(a - b) for a, b in pairs), 2) if pairs else None
                result["expected_mean_server"] = round(float(np.mean([a for a, _ in pairs])), 2) if pairs else None
                result["expected_mean_in_process"] = round(float(np.mean([b for _, b in pairs])), 2) if pairs else None
            else:
                same = sum(a == b for a, b in zip(ratings, local_ratings[mode], strict=True))
                result["greedy_same_grade"] = f"{same}/{len(items)}"
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
