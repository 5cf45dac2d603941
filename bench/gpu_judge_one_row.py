"""A one-row batch through the compiled judge on one GPU: does it compile the layers again, and what does that cost?

Rows and judge as bench/gpu_judge_compile.py (bench/gpu_judge_plan.py: random-token texts and their attacked copies, a
random-init Llama-3-8B judge in bf16). After the judge's set-up (its layers compiled on two rows) and one batch of
``--batch`` rows as the rate stage cuts them, one row goes through ``Judge.node_logits`` (which runs a lone row
twice and keeps one, so the shared graph serves it) and then through the layout a lone row took before
(``Judge._split_node_logits`` with the one row: Dynamo fixes the batch dimension of size 1, a new graph). Each step
reports its seconds and Dynamo's graph count; the lone row's grade probabilities are compared with the same row's in
the batch (their last bits may differ: another batch shape, other kernels).

    PYTHONPATH=.:bench python3 bench/gpu_judge_one_row.py --tokenizer DIR --out DIR
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import typer
from gpu_judge_plan import stand_in_judge_model, stand_in_rows, sync  # bench/ is run as scripts, not a package

from mmw.judge.judge import Judge


def main(tokenizer: Path = typer.Option(...), texts: int = 16, tokens: int = 1024, batch: int = 16,
         tiny: bool = False, out: str = ".") -> None:
    from torch._dynamo.utils import counters

    tok, rows, prompts = stand_in_rows(tokenizer, texts, tokens)
    model = stand_in_judge_model(tok, tiny)
    result = {"torch": torch.__version__, "batch": batch,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}

    def step(name: str, run):
        sync()
        start = time.perf_counter()
        value = run()
        sync()
        result[name] = {"s": round(time.perf_counter() - start, 3), "graphs": counters["stats"]["unique_graphs"]}
        print(name, result[name], flush=True)
        return value

    judge = step("setup", lambda: Judge(tok, model, batch_size=batch, compiled=True))
    result["compiled"] = judge._compiled is not None
    _, sequences = next(judge._batches(prompts[:batch], rows[:batch], prefill=judge.trie.prefill, desc=""))
    in_batch = step("batch_of_rows", lambda: judge.grades_from_logits(judge.node_logits(sequences)))
    lone = sequences[:1]
    alone = step("one_row", lambda: judge.grades_from_logits(judge.node_logits(lone)))
    step("one_row_again", lambda: judge.grades_from_logits(judge.node_logits(lone)))
    head = len(judge.head)
    if judge._splits:  # the layout a lone row took before: the batch dimension of size 1 in the graph
        with torch.inference_mode():
            step("one_row_as_before", lambda: judge.grades_from_logits(judge._split_node_logits(lone, head)))
    result["one_row_vs_batch_max_abs"] = float(np.abs(alone.cpu().numpy() - in_batch[:1].cpu().numpy()).max())
    print(json.dumps(result), flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "judge_one_row.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
