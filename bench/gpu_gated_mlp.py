"""The judge's gated MLP up-projection on one GPU: what it runs now (two cuBLAS products, gate and up, then one
Inductor kernel for SiLU(gate) x up, whose 1.07 ms a judgement is the largest elementwise kernel of the judge's
forward) against one Triton kernel that computes both products tile by tile and applies SiLU x up in its epilogue,
so the two (M, 14,336) products never reach memory.

  cublas/two       gate = x W_g^T, up = x W_u^T (cuBLAS), then silu(gate) * up compiled (one kernel): the judge now
  cublas/one       x [W_g; W_u]^T in one cuBLAS product (N = 28,672), then the same elementwise kernel
  triton/<cfg>     mmw's fused kernel (``mmw.engines.gated_mlp``), block sizes BMxBNxBK, warps, stages, group

CUDA events over ``--repeats`` calls after a warm-up, median ms, at the row counts of a batch of 16 judge rows (texts
~1,109 positions a row, attacked ~1,260). Each variant's output against cublas/two's: the largest difference and
the share of bf16 values that are equal.

    PYTHONPATH=.:bench python3 bench/gpu_gated_mlp.py --out DIR
    TRITON_INTERPRET=1 PYTHONPATH=.:bench python bench/gpu_gated_mlp.py --check-only   # the arithmetic on a CPU
      (the interpreter needs numpy < 2.4 and Triton installed, e.g. pip install --target DIR triton numpy==2.2.6)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import triton
import typer
from gpu_judge_attention import timed  # bench/ is run as scripts

from mmw.engines import gated_mlp


CONFIGS = [(128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8), (128, 64, 64, 4, 4, 8), (128, 64, 64, 8, 5, 8),
           (64, 128, 64, 4, 4, 8), (128, 128, 32, 8, 5, 8), (256, 64, 64, 8, 3, 8), (128, 128, 64, 8, 3, 16),
           (64, 256, 64, 8, 3, 8), (64, 256, 64, 8, 4, 8)]


def agreement(got: torch.Tensor, want: torch.Tensor) -> dict:
    diff = (got.float() - want.float()).abs()
    return {"max_abs_diff": float(diff.max()),
            "max_rel_diff": float((diff / want.float().abs().clamp(min=1e-2)).max()),
            "equal_share": float((got == want).float().mean())}


def check(device: str) -> dict:
    """The kernel against ``gated_mlp.reference`` on small shapes (ragged rows, two column blocks)."""
    torch.manual_seed(0)
    m, n, k = 70, 96, 128
    # Triton's interpreter multiplies bf16 tiles as their raw bits, and it rounds float32 to bf16 towards zero: on
    # a CPU the operands are float32 and the reference rounds as the interpreter does (every value equal then)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(m, k, dtype=dtype, device=device)
    wg, wu = (torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5 for _ in range(2))
    if device == "cuda":
        want = gated_mlp.reference(x, wg, wu)
    else:
        def truncated(t: torch.Tensor) -> torch.Tensor:
            return (t.view(torch.int32) & ~0xFFFF).view(torch.float32)
        g, u = truncated(x @ wg.T), truncated(x @ wu.T)
        want = truncated(g * torch.sigmoid(g) * u).to(torch.bfloat16)
    out = {}
    try:
        out["kernel"] = agreement(gated_mlp.launch(x, wg, wu, (32, 32, 32, 4, 2, 2)), want)
    except Exception as err:  # report, don't stop: the timings below say the rest
        out["kernel"] = f"{type(err).__name__}: {str(err)[:300]}"
    return out


def main(rows: str = "17744,20160", hidden: int = 4096, inner: int = 14336, repeats: int = 30,
         check_only: bool = False, out: str = "") -> None:
    if check_only:
        print(json.dumps(check("cpu"), indent=1))
        return
    device = torch.device("cuda")
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "check": check("cuda"), "shapes": {}}
    print(json.dumps(result["check"]), flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    w_gate, w_up = (torch.randn(inner, hidden, device=device, dtype=torch.bfloat16, generator=gen) / hidden ** 0.5
                    for _ in range(2))
    w_both = torch.cat([w_gate, w_up])
    w_down = torch.randn(hidden, inner, device=device, dtype=torch.bfloat16, generator=gen) / inner ** 0.5
    silu_times = torch.compile(lambda g, u: torch.nn.functional.silu(g) * u, dynamic=False)
    for m in map(int, rows.split(",")):
        x = torch.randn(m, hidden, device=device, dtype=torch.bfloat16, generator=gen)
        g, u = x @ w_gate.T, x @ w_up.T
        want = silu_times(g, u)
        both = x @ w_both.T
        entry: dict = {
            "gemm_gate_ms": timed(lambda: x @ w_gate.T, repeats),
            "gemm_up_ms": timed(lambda: x @ w_up.T, repeats),
            "silu_times_ms": timed(lambda: silu_times(g, u), repeats),
            "gemm_down_ms": timed(lambda: want @ w_down.T, repeats),
            "cublas/two_ms": timed(lambda: silu_times(x @ w_gate.T, x @ w_up.T), repeats),
            "gemm_both_ms": timed(lambda: x @ w_both.T, repeats),
            "cublas/one_ms": timed(lambda: silu_times(*(x @ w_both.T).split(inner, -1)), repeats),
            "cublas/one_vs_two": agreement(silu_times(*both.split(inner, -1)), want),
            "variants": {}}
        flops = 2 * 2 * m * hidden * inner
        entry["cublas_tflops"] = round(flops / (entry["gemm_gate_ms"] + entry["gemm_up_ms"]) / 1e9, 1)
        for cfg in CONFIGS:
            name = "triton/" + "x".join(map(str, cfg))
            try:
                got = gated_mlp.launch(x, w_gate, w_up, cfg)
                ms = timed(lambda cfg=cfg: gated_mlp.launch(x, w_gate, w_up, cfg), repeats)
                entry["variants"][name] = {"ms": ms, "tflops": round(flops / ms / 1e9, 1), **agreement(got, want)}
            except Exception as err:
                entry["variants"][name] = f"{type(err).__name__}: {str(err)[:300]}"
            print(m, name, entry["variants"][name], flush=True)
        result["shapes"][str(m)] = entry
        print(m, {k: v for k, v in entry.items() if k != "variants"}, flush=True)
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gated_mlp.json").write_text(text)


if __name__ == "__main__":
    typer.run(main)
