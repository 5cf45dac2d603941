"""The watermark step alone on a GPU: time per decoding step for every scheme, eager vs compiled vs CUDA graphs.

No model: logits are random float32 [B, V] (V = 32000, Llama-2's vocabulary), fresh for each of ``--inputs``
rotating buffers so the L2 cache does not flatter the numbers. Per configuration: the GPU time per step (CUDA events
around ``--iters`` steps, one sync at the end), the host time per step (what the step costs a launch-bound decoding
loop), and whether the compiled step chooses the tokens the eager one does. Compilation errors are printed.

    PYTHONPATH=. python3 bench/gpu_step.py --batches 64,296 --out DIR
"""

from __future__ import annotations

import json
import os
import time

import torch
import typer

from bench.gpu_generate import KEY, MMW_SCHEMES
from mmw.watermark.processor import WatermarkStep, row_state
from mmw.watermark.scheme import SchemeSpec


def main(batches: str = "64,296", vocab: int = 32000, iters: int = 50, inputs: int = 4, out: str = "",
         modes: str = "eager,default,reduce-overhead", device: str = "cuda") -> None:
    cuda = device == "cuda"
    results = []
    for batch in [int(b) for b in batches.split(",")]:
        g = torch.Generator(device=device).manual_seed(batch)
        logits = [torch.randn(batch, vocab, device=device, generator=g) * 2 for _ in range(inputs)]
        context = torch.randint(0, vocab, (batch, 3), device=device, generator=g)
        for name, params in MMW_SCHEMES.items():
            spec = SchemeSpec.from_params(params) if params else None
            state = {k: v.to(device) for k, v in row_state(spec, list(range(batch))).items()}
            reference = None
            for mode in modes.split(","):
                step = WatermarkStep(spec, KEY, vocab, 1.0, compiled=mode != "eager",
                                     mode=None if mode == "eager" else mode)
                ctx = context[:, context.shape[1] - step.context_len:] if step.context_len else context[:, :0]
                steps = torch.zeros(batch, dtype=torch.int64, device=device)
                t0 = time.perf_counter()
                chosen = [step(logits[i % inputs], ctx, steps + i, **state)[0].clone() for i in range(inputs)]
                compile_s = time.perf_counter() - t0
                if reference is None:
                    reference = chosen
                same = float(torch.stack([(a == b).float().mean() for a, b in zip(chosen, reference)]).mean())
                for i in range(5):  # warm-up (CUDA-graph recording happens on the first replays)
                    step(logits[i % inputs], ctx, steps + i, **state)
                if cuda:
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter()
                for i in range(iters):
                    step(logits[i % inputs], ctx, steps + i, **state)
                host = (time.perf_counter() - t0) / iters
                if cuda:
                    end.record()
                    torch.cuda.synchronize()
                gpu = start.elapsed_time(end) / iters if cuda else float("nan")
                row = dict(batch=batch, scheme=name, mode=mode, ms_per_step=gpu, host_ms_per_step=1e3 * host,
                           compile_s=compile_s, tokens_equal_eager=same,
                           compiled=step.is_compiled or mode == "eager", error=step.compile_error)
                results.append(row)
                print(f"B={batch:4d} {name:38s} {mode:16s} {gpu:8.3f} ms/step  host {1e3 * host:7.3f} ms  "
                      f"={same:.3f}  compile {compile_s:5.1f}s {'' if row['compiled'] else 'FELL BACK TO EAGER'}",
                      flush=True)
                if step.compile_error:
                    err = step.compile_error
                    print("   ", err[:1500], "\n    ...\n", err[-1500:], flush=True)
                if out:
                    with open(os.path.join(out, "gpu_step.json"), "w") as f:
                        json.dump(results, f, indent=1)


if __name__ == "__main__":
    typer.run(main)
