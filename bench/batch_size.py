"""Generation batch size on the CPU: time, and whether the texts change, for the default board's prompts.

Runs the generate stage's engine (``mmw.engines.generate.generate``, the board's generator, scheme, key, seed,
temperature and token budget) once per ``--batches`` entry on the same prompts, baseline (no scheme) and
watermarked, and compares every row's tokens with the first entry's. Left padding makes a row's numbers depend on
its batch, so identical tokens are a measurement here, not a guarantee.

    python bench/batch_size.py --params params.yaml --batches 8,24 --out bench/results/batch_size_cpu.json
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from mmw.engines.generate import generate
from mmw.engines.models import load_model
from mmw.keys import resolve_key
from mmw.params import load_params
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec
from mmw.stages.common import generator_vocab_size
from mmw.tasks import build_prompts, render_chat


def main(params: Path = Path("params.yaml"), batches: str = "8,24", out: str = "") -> None:
    board = load_params(params, ("seed", "prompts", "model", "scheme", "key"), models={"scheme": SchemeSpec})
    tokenizer, model = load_model(board.model.name, board.model.device, board.model.dtype)
    vocab_size = generator_vocab_size(tokenizer, model)
    prompts = build_prompts(board.prompts.tasks, board.prompts.per_task, offset=board.prompts.offset)
    chats = render_chat(tokenizer, prompts["prompt"].to_list())
    ids = prompts["prompt_id"].to_list()
    key = resolve_key(board.key)
    result: dict = {"params": str(params), "rows": len(ids), "max_new_tokens": board.model.max_new_tokens, "runs": []}
    reference: dict[str, list] = {}
    for batch in [int(b) for b in batches.split(",")]:
        for which, spec in (("baseline", None), ("watermarked", board.scheme)):
            def factory(seeds: list[int], spec=spec) -> WatermarkProcessor:
                return WatermarkProcessor(spec, key if spec is not None else None, vocab_size, seeds,
                                          board.model.temperature)

            t0 = time.perf_counter()
            table = generate(model, tokenizer, chats, factory, board.model.max_new_tokens, batch, prompt_ids=ids,
                             seed=board.seed, progress=False)
            wall = time.perf_counter() - t0
            tokens = table["tokens"].to_list()
            reference.setdefault(which, tokens)
            same = sum(a == b for a, b in zip(tokens, reference[which], strict=True))
            n_tokens = int(table["n_tokens"].sum())
            row = {"batch": batch, "which": which, "wall_s": round(wall, 1), "tokens": n_tokens,
                   "tokens_per_s": round(n_tokens / wall, 1), "rows_identical_to_first": same}
            result["runs"].append(row)
            print(json.dumps(row), flush=True)
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
