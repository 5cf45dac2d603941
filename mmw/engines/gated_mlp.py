"""A gated MLP's up-projection in one kernel: ``silu(x W_gate^T) * (x W_up^T)`` computed tile by tile, its two
products never written to memory (``mmw::gated_up``; Triton on Hopper GPUs).

Why: in the judge's forward (1,100-1,300 positions a row, batches of 16) the products run on cuBLAS near the card's
matrix rate, and what is left beside them is memory traffic. The largest piece of it is the kernel that reads both
(M, 14,336) products back and writes SiLU(gate) x up: 1.07 ms of a ~27 ms judgement on one H100
(bench/results/gpu.md). Here both products of a tile are accumulated in registers and the epilogue writes only the
result. What it costs: the products run on Triton's matrix code instead of cuBLAS's. Whether that pays is a
measurement (``bench/gpu_gated_mlp.py``: the kernel alone against cuBLAS on the judge's shapes;
``bench/gpu_judge_gated.py``: the judge with and without it), so the judge uses it only when asked
(``Judge(fused_mlp=True)``).

The arithmetic is the unfused path's up to the order of each product's sum: each product rounded to the weights'
dtype, then SiLU and the product in float32, rounded once (as Inductor's fused elementwise kernel computes it).
cuBLAS sums in another order, so some values differ in their last bit: a judge that uses this kernel says so in its
arithmetic (``Judge.arithmetic``) and its judgements are cached apart.

Off a CUDA device of compute capability 9.0, without Triton, or for a module this kernel does not cover (biases, an
activation other than SiLU, a reduction width not a multiple of the block) :func:`usable` is False and the model
runs its own code.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

#: Block sizes and launch settings (BM, BN, BK, warps, stages, group of row blocks) for compute capability 9.0: the
#: shape of Triton's fast Hopper matrix products (128 x 256 a tile: here two 128 x 128 accumulators, 128 registers a
#: thread at 8 warps); ``bench/gpu_gated_mlp.py`` times the alternatives.
CONFIG = (128, 128, 64, 8, 3, 8)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, compiled on first use (Triton is imported only where a GPU runs it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def gated_up_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        # Row blocks grouped so consecutive programs share them (their x tiles stay in L2).
        pid = tl.program_id(0)
        per_group = GROUP_M * tl.cdiv(N, BN)
        first_m = (pid // per_group) * GROUP_M
        size_m = tl.minimum(tl.cdiv(M, BM) - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % size_m
        pid_n = (pid % per_group) // size_m
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        ks = tl.arange(0, BK)
        # rows and columns past the end read valid memory (wrapped) and are never stored
        x_ptrs = x_ptr + (rows % M)[:, None] * stride_xm + ks[None, :]
        wg_ptrs = wg_ptr + (cols % N)[None, :] * stride_wn + ks[:, None]
        wu_ptrs = wu_ptr + (cols % N)[None, :] * stride_wn + ks[:, None]
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, tl.cdiv(K, BK)):
            a = tl.load(x_ptrs)
            acc_g = tl.dot(a, tl.load(wg_ptrs), acc_g)
            acc_u = tl.dot(a, tl.load(wu_ptrs), acc_u)
            x_ptrs += BK
            wg_ptrs += BK
            wu_ptrs += BK
        g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)
        u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
        out = (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], out,
                 mask=(rows[:, None] < M) & (cols[None, :] < N))

    return gated_up_kernel


def reference(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic on any device: (M, N) from x (M, K), W_gate and W_up (N, K)."""
    g = (x @ w_gate.T).float()
    u = (x @ w_up.T).float()
    return (g * torch.sigmoid(g) * u).to(x.dtype)


@torch.library.custom_op("mmw::gated_up", mutates_args=())
def gated_up(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """``silu(x W_gate^T) * (x W_up^T)``: x (M, K) and the weights (N, K) contiguous; (M, N) in x's dtype. The
    Triton kernel on CUDA, :func:`reference` elsewhere. Opaque to the compiler: a compiled layer calls it as it is."""
    # The kernel's offsets are 32-bit: an output of 2^31 values or more (or none) takes the reference's cuBLAS path.
    if not x.is_cuda or not 0 < x.shape[0] * w_gate.shape[0] < 2**31:
        return reference(x, w_gate, w_up)
    return launch(x.contiguous(), w_gate, w_up, CONFIG)


def launch(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, config: tuple[int, ...]) -> torch.Tensor:
    """The Triton kernel under launch settings ``config`` (as :data:`CONFIG`): x (M, K), the weights (N, K), all
    contiguous on one CUDA device (or under Triton's interpreter), K a multiple of the block's BK."""
    import triton

    bm, bn, bk, warps, stages, group = config
    (m, k), n = x.shape, w_gate.shape[0]
    # float32 operands only in the interpreter's check (bench/gpu_gated_mlp.py): a bf16 result, as on the GPU
    out = torch.empty(m, n, device=x.device, dtype=torch.bfloat16 if x.dtype == torch.float32 else x.dtype)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _kernel()[grid](x, w_gate, w_up, out, m, n, k, x.stride(0), w_gate.stride(0), out.stride(0),
                        BM=bm, BN=bn, BK=bk, GROUP_M=group, num_warps=warps, num_stages=stages)
    return out


@gated_up.register_fake
def _(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w_gate.shape[0])


@functools.cache
def _triton_runs() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def usable(mlp: torch.nn.Module) -> bool:
    """Whether :func:`forward` computes ``mlp``'s own function on its device: a gated MLP (``gate_proj``,
    ``up_proj``, ``down_proj``, ``act_fn``) without biases, with SiLU, bf16 or fp16 weights contiguous on a CUDA
    device of compute capability 9.0 (what :data:`CONFIG` is for), its hidden size a multiple of the block."""
    parts = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if any(not isinstance(p, torch.nn.Linear) or p.bias is not None for p in parts):
        return False
    act = getattr(mlp, "act_fn", None)
    if not (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"):
        return False
    gate, up = parts[0].weight, parts[1].weight
    return (gate.is_cuda and gate.dtype in (torch.bfloat16, torch.float16) and gate.shape == up.shape
            and gate.is_contiguous() and up.is_contiguous() and gate.shape[1] % CONFIG[2] == 0
            and torch.cuda.get_device_capability(gate.device) == (9, 0) and _triton_runs())


def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A gated MLP's forward through :func:`gated_up` (set as the class's ``forward`` where :func:`usable`)."""
    hidden = torch.ops.mmw.gated_up(x.reshape(-1, x.shape[-1]), self.gate_proj.weight, self.up_proj.weight)
    return self.down_proj(hidden.reshape(*x.shape[:-1], hidden.shape[-1]))
