"""One decoding step's attention, kernel by kernel: time, run-to-run repeatability and error, at the full-scale
decode shape (Llama-3-8B: 32 query heads over 8 K/V heads of 128; 296 rows; a static cache of 1,087 positions of
which ``written`` hold tokens, left padding of 0-15 positions a row).

Kernels:
  cudnn         SDPA with ``enable_gqa`` and the boolean mask, cuDNN only (what SDPA picks on Hopper);
  efficient     the stage's: query heads folded into each group's queries, SDPA's memory-efficient kernel
                (``mmw.engines.attention.decode_attention``) over the whole cache;
  efficient-cut the same over the written positions rounded up to 128 (``graph_decode.KEY_BUCKET = 128``);
  flex          ``flex_attention`` compiled (its split-K decoding kernel), GQA, a block mask whose blocks all read
                the boolean mask: the whole cache;
  flex-cut      the same block mask with only the written blocks listed (unwritten blocks are never read).
Each kernel runs ``--repeats`` times on the same inputs: "rows differing" counts rows whose output is not bit-equal
to the first run's; "max error" is against float32 math attention. Times are CUDA-event medians of ``--timed``
calls after warm-up, per layer call; x 32 layers x 1,024 steps gives a generation's attention time.

    PYTHONPATH=.:bench python3 bench/gpu_decode_kernels.py --out DIR
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
import typer

B, H, HKV, D, L = 296, 32, 8, 128, 1087
BLOCK = 128  # mmw.engines.attention.FLEX_BLOCK


def inputs(written: int, device: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(written)
    q = torch.randn(B, H, 1, D, generator=gen).to(device, torch.bfloat16)
    k = torch.randn(B, HKV, L, D, generator=gen).to(device, torch.bfloat16)
    v = torch.randn(B, HKV, L, D, generator=gen).to(device, torch.bfloat16)
    pad = torch.randint(0, 16, (B,), generator=gen).to(device)
    pos = torch.arange(L, device=device)
    valid = (pos[None, :] >= pad[:, None]) & (pos[None, :] < written)
    return q, k, v, valid


def reference(q, k, v, valid) -> torch.Tensor:
    """float32 math attention, [B, H, 1, D]."""
    g = H // HKV
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    scores = (q.float() @ kf.transpose(-1, -2)) / D ** 0.5
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.softmax(scores, -1) @ vf


def kernels(written: int):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mmw.engines import attention

    nblocks = -(-L // BLOCK)
    cut = -(-written // BLOCK) * BLOCK

    def cudnn(q, k, v, valid):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :],
                                                                    enable_gqa=True)

    def efficient(q, k, v, valid):
        return attention.decode_attention(None, q, k, v, valid[:, None, None, :], None)[0].transpose(1, 2)

    def efficient_cut(q, k, v, valid):
        window = attention.DecodeWindow(key_limit=cut)
        return attention.decode_attention(None, q, k, v, valid[:, None, None, :], None, window)[0].transpose(1, 2)

    masks = {}

    def flex_with(listed: int):
        """The stage's flex path (``attention.decode_blocks`` + ``attention.flex_decode``), ``listed`` blocks read."""
        def run(q, k, v, valid):
            key = (listed, valid.data_ptr())
            if key not in masks:
                masks[key] = attention.decode_blocks(valid, torch.full((B, 1, 1), listed, dtype=torch.int32,
                                                                       device=valid.device))
            return attention.flex_decode(q, k, v, masks[key], None)
        return run

    return {"cudnn": cudnn, "efficient": efficient, "efficient-cut": efficient_cut,
            "flex": flex_with(nblocks), "flex-cut": flex_with(-(-written // BLOCK))}


def main(writtens: str = "192,576,1087", repeats: int = 20, timed: int = 30, only: str = "", out: str = "") -> None:
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "shape": {"rows": B, "heads": H, "kv_heads": HKV, "head_dim": D, "cache": L}, "kernels": {}}
    for written in [int(w) for w in writtens.split(",")]:
        q, k, v, valid = inputs(written, "cuda")
        ref = reference(q, k, v, valid)
        for name, fn in kernels(written).items():
            if only and name not in only.split(","):
                continue
            try:
                first = fn(q, k, v, valid)
                torch.cuda.synchronize()
                differing = 0
                for _ in range(repeats):
                    again = fn(q, k, v, valid)
                    differing = max(differing, int((again != first).flatten(1).any(1).sum()))
                times = []
                for _ in range(timed):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn(q, k, v, valid)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e))
                row = {"ms": round(statistics.median(times), 4), "rows_differing": differing,
                       "max_error": float((first.float() - ref).abs().max()),
                       "generation_s_at_this_length": round(statistics.median(times) * 32 * 1024 / 1000, 2)}
            except Exception as err:  # a kernel the installed torch cannot run is a result, not a crash
                row = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            result["kernels"].setdefault(name, {})[written] = row
            print(f"written {written:5d}  {name:14s} {row}", flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_decode_kernels.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
