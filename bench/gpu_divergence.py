"""Where do two GPU generations of the same batch part? The step, the rows, and whether the model's logits or
the watermark step's choice differ first.

The same batch as bench/gpu_repeat.py (296 rows, C4 at T = 1, random-init Llama-3-8B shape in bf16) is generated
twice in this process through the stage's decode loop without any CUDA graph (``engine.graph_decode: false``,
``engine.compile_step: false``), keeping every step's float32 logits on the GPU (~152 MB a step). Then:

* the first step whose logits differ between the two runs, the rows involved, the largest difference, and whether
  those rows had chosen the same tokens until then (identical inputs, different logits: the forward is not
  deterministic);
* the first step whose tokens differ, and whether the logits of that step were identical (identical logits,
  different choice: the watermark step is not);
* the watermark step re-run 8 times on the first run's logits of that step (is it deterministic on fixed input?);
* the full teacher-forced forward (no cache, one pass over prompt + generated tokens) twice: logits identical?

Then the same two runs through the captured graph (the stage's default), tokens only.

    PYTHONPATH=.:bench python3 bench/gpu_divergence.py --out DIR
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import typer
from gpu_repeat import KEY, stand_in_batch  # bench/ is run as scripts, not a package

from mmw.watermark import processor as processors
from mmw.engines import generate as engine
from mmw.engines import graph_decode
from mmw.params import EngineParams
from mmw.watermark.processor import WatermarkProcessor



def first_token_difference(a: list[list[int]], b: list[list[int]]) -> tuple[int | None, list[int]]:
    """(first step at which any row's tokens differ, the rows that differ there)."""
    first, rows = None, []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        n = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), None if len(x) == len(y) else min(len(x), len(y)))
        if n is None:
            continue
        if first is None or n < first:
            first, rows = n, [i]
        elif n == first:
            rows.append(i)
    return first, rows


def main(rows: int = 296, new_tokens: int = 128, smoke: bool = False, graph_runs: bool = True,
         out: str = "") -> None:
    model, cfg, tok, prompts, spec = stand_in_batch(rows, smoke)
    device = model.device.type
    report: dict = {"rows": rows, "new_tokens": new_tokens, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name() if not smoke else "cpu"}

    traced: list[torch.Tensor] = []
    inputs: list[tuple[torch.Tensor, torch.Tensor]] = []  # the watermark step's other inputs: context, steps
    choose = graph_decode._Decoder.choose

    def tracing_choose(self, scores):  # eager loop only: a capture would record the append once
        traced.append(scores.clone())
        inputs.append((self.context.clone(), self.processor._steps.clone()))
        return choose(self, scores)

    def run(graph: bool, trace: bool) -> tuple[list[list[int]], list[torch.Tensor], WatermarkProcessor]:
        settings = EngineParams(graph_decode=graph, compile_step=graph)  # params engine:
        processors.watermark_step.cache_clear()
        traced.clear()
        inputs.clear()
        graph_decode._Decoder.choose = tracing_choose if trace else choose
        proc = WatermarkProcessor(spec, KEY, cfg.vocab_size, list(range(rows)), 1.0, None if graph else False)
        try:
            cols = engine.generate_batch(model, tok, prompts, proc, new_tokens, settings)
        finally:
            graph_decode._Decoder.choose = choose
        return cols["tokens"], list(traced), proc

    tokens_a, logits_a, proc = run(graph=False, trace=True)
    inputs_a = list(inputs)
    tokens_b, logits_b, _ = run(graph=False, trace=True)
    first_tok, tok_rows = first_token_difference(tokens_a, tokens_b)
    eager = {"first_token_step": first_tok, "rows_at_first_token_step": tok_rows[:20],
             "rows_differing": sum(x != y for x, y in zip(tokens_a, tokens_b, strict=True))}
    first_logit = next((s for s, (x, y) in enumerate(zip(logits_a, logits_b)) if not torch.equal(x, y)), None)
    eager["first_logit_step"] = first_logit
    if first_logit is not None:
        x, y = logits_a[first_logit], logits_b[first_logit]
        diff_rows = (x != y).any(-1).nonzero().flatten().tolist()
        same_prefix = [r for r in diff_rows if tokens_a[r][:first_logit] == tokens_b[r][:first_logit]]
        eager |= {"rows_with_logit_difference": len(diff_rows), "example_rows": diff_rows[:20],
                  "of_which_same_tokens_before": len(same_prefix),
                  "max_abs_logit_difference": float((x - y).abs().max()),
                  "positions_differing": int((x != y).sum())}
        # Per step after the first: how many rows' logits differ (does it spread, or come and go?).
        eager["rows_differing_per_step"] = [int((p != q).any(-1).sum()) for p, q in zip(logits_a, logits_b)]
    if first_tok is not None and first_tok < len(logits_a):
        s = first_tok
        eager["logits_identical_at_first_token_step"] = bool(torch.equal(logits_a[s][tok_rows], logits_b[s][tok_rows]))
        # The watermark step alone, 8 times on run A's inputs of that step: one choice?
        context, steps = inputs_a[s]
        step = proc._step
        choices = [step._step(logits_a[s], context, steps, **proc._state)[0] for _ in range(8)]
        eager["watermark_step_repeats_identical"] = all(torch.equal(c, choices[0]) for c in choices)
        eager["watermark_step_matches_run_a"] = [int(choices[0][r]) == tokens_a[r][s] for r in tok_rows[:20]
                                                  if len(tokens_a[r]) > s]
    report["eager"] = eager
    print("eager:", json.dumps({k: v for k, v in eager.items() if k != "rows_differing_per_step"}), flush=True)

    # The teacher-forced forward of run A's full sequences, twice (no cache, one pass).
    full = [p + t for p, t in zip(prompts, tokens_a, strict=True)]
    batch = tok.pad({"input_ids": full}, padding=True, padding_side="left", return_tensors="pt")
    batch = {k: v.to(device) for k, v in batch.items()}
    with torch.inference_mode():
        outs = []
        for _ in range(2):
            chunks = []
            for lo in range(0, rows, 37):  # 8 chunks: ~10 GB of float32 logits each is too much at once
                o = model(input_ids=batch["input_ids"][lo:lo + 37], attention_mask=batch["attention_mask"][lo:lo + 37],
                          logits_to_keep=new_tokens)
                chunks.append(o.logits.float().sum(-1).double())
            outs.append(torch.cat(chunks))
    report["teacher_forced_identical"] = bool(torch.equal(outs[0], outs[1]))
    print("teacher-forced forward identical:", report["teacher_forced_identical"], flush=True)
    del logits_a, logits_b, outs
    torch.cuda.empty_cache() if not smoke else None

    if graph_runs:
        ga, _, _ = run(graph=True, trace=False)
        gb, _, _ = run(graph=True, trace=False)
        first, grows = first_token_difference(ga, gb)
        report["graph"] = {"first_token_step": first, "rows_at_first_token_step": grows[:20],
                           "rows_differing": sum(x != y for x, y in zip(ga, gb, strict=True)),
                           "graph_vs_eager_first_token_step": first_token_difference(ga, tokens_a)[0]}
        print("graph:", json.dumps(report["graph"]), flush=True)
    print(json.dumps(report), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_divergence.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    typer.run(main)
