"""One decoder layer's attention in the judge's expected-mode forward, on one GPU: the dense tree mask as the judge
ran it (cuDNN through SDPA, query and key widths rounded to 128) against the causal split (the rows' own tokens under
a causal kernel that skips the masked blocks, the few trie-node queries apart under a small mask), per kernel:

  dense          SDPA(q [B,H,Q',D], k/v [B,Hkv,K',D], additive mask [B,1,Q',K'], enable_gqa): what the judge ran
  square/<be>    SDPA(is_causal) over [head | context] with the query front-padded by the head's length (square, so
                 top-left causal is the causal mask), widths rounded to 128, enable_gqa; <be>: SDPA's own choice,
                 cudnn, flash
  flash_br       torch's flash kernel called directly, its causal mask aligned bottom-right (query = context,
                 keys = head + context), no padding, K/V heads read by group
  nodes/<how>    the trie-node queries against every key under their mask: SDPA with enable_gqa (rounded keys), or
                 the query heads folded into their K/V head's queries on the memory-efficient kernel

CUDA events over ``--repeats`` calls after a warm-up, median ms; each variant's largest difference from a float32
reference on the real query positions.

    python3 bench/gpu_judge_attention.py --out DIR
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
import typer
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import pad, scaled_dot_product_attention as sdpa


def rounded(width: int, multiple: int = 128) -> int:
    return width + multiple - width % multiple


def timed(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(batch: int = 16, head: int = 57, contexts: str = "1070,1400", nodes: int = 11, heads: int = 32,
         kv_heads: int = 8, dim: int = 128, repeats: int = 30, out: str = "") -> None:
    device = torch.device("cuda")
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": batch,
                    "head": head, "nodes": nodes, "shapes": {}}
    gen = torch.Generator(device=device).manual_seed(0)
    for context in map(int, contexts.split(",")):
        q_len, k_len = context + nodes, head + context + nodes
        q = torch.randn(batch, heads, q_len, dim, device=device, dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, kv_heads, k_len, dim, device=device, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(batch, kv_heads, k_len, dim, device=device, dtype=torch.bfloat16, generator=gen)
        # rows right-padded: row r has context - 13 * r real tokens (its last ones pads)
        real = torch.tensor([context - 13 * r for r in range(batch)], device=device)
        kidx = torch.arange(k_len, device=device)
        allowed = torch.zeros(batch, q_len, k_len, dtype=torch.bool, device=device)
        qi = torch.arange(context, device=device)
        allowed[:, :context, :head + context] = (kidx[None, :head + context] <= head + qi[:, None])[None]
        ancestors = torch.tril(torch.ones(nodes, nodes, dtype=torch.bool, device=device))
        allowed[:, context:, :head] = True
        allowed[:, context:, head:head + context] = (kidx[None, :context] < real[:, None])[:, None, :]
        allowed[:, context:, head + context:] = ancestors
        rows_real = [torch.cat([torch.arange(int(n), device=device), torch.arange(context, q_len, device=device)])
                     for n in real]
        # float32 reference (math), GQA by repetition
        group = heads // kv_heads
        kf, vf = (t.float().repeat_interleave(group, 1) for t in (k, v))
        scores = (q.float() @ kf.transpose(-1, -2)) * dim ** -0.5
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        reference = torch.softmax(scores, -1) @ vf  # [B, H, Q, D]

        def error(outputs: torch.Tensor) -> float:
            return max(float((outputs[r, :, rows_real[r]].float() - reference[r, :, rows_real[r]]).abs().max())
                       for r in range(batch))

        minimum = torch.finfo(torch.bfloat16).min
        q_wide, k_wide = rounded(q_len), rounded(k_len)
        additive = torch.zeros(batch, 1, q_wide, k_wide, dtype=torch.bfloat16, device=device)
        wide_allowed = torch.zeros(batch, q_wide, k_wide, dtype=torch.bool, device=device)
        wide_allowed[:, :q_len, :k_len] = allowed
        wide_allowed[:, q_len:, :head] = True
        additive.masked_fill_(~wide_allowed[:, None], minimum)

        def dense():
            return sdpa(pad(q, (0, 0, 0, q_wide - q_len)), pad(k, (0, 0, 0, k_wide - k_len)),
                        pad(v, (0, 0, 0, k_wide - k_len)), attn_mask=additive, enable_gqa=True)[:, :, :q_len]

        square = rounded(head + context)

        def causal_square():
            qq = pad(q[:, :, :context], (0, 0, head, square - head - context))
            kk = pad(k[:, :, :head + context], (0, 0, 0, square - head - context))
            vv = pad(v[:, :, :head + context], (0, 0, 0, square - head - context))
            return sdpa(qq, kk, vv, is_causal=True, enable_gqa=True)[:, :, head:head + context]

        def flash_br():
            qq = q[:, :, :context].transpose(1, 2).contiguous().transpose(1, 2)
            return torch.ops.aten._scaled_dot_product_flash_attention(
                qq, k[:, :, :head + context], v[:, :, :head + context], 0.0, True)[0]

        node_keys = rounded(k_len)
        node_mask = torch.zeros(batch, 1, nodes, node_keys, dtype=torch.bfloat16, device=device)
        node_allowed = torch.zeros(batch, nodes, node_keys, dtype=torch.bool, device=device)
        node_allowed[:, :, :k_len] = allowed[:, context:]
        node_mask.masked_fill_(~node_allowed[:, None], minimum)
        folded_mask = node_mask.repeat(1, 1, group, 1)

        def nodes_gqa():
            return sdpa(q[:, :, context:], pad(k, (0, 0, 0, node_keys - k_len)), pad(v, (0, 0, 0, node_keys - k_len)),
                        attn_mask=node_mask, enable_gqa=True)

        def nodes_folded():
            qf = q[:, :, context:].reshape(batch, kv_heads, group * nodes, dim)
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                o = sdpa(qf, pad(k, (0, 0, 0, node_keys - k_len)), pad(v, (0, 0, 0, node_keys - k_len)),
                         attn_mask=folded_mask)
            return o.reshape(batch, heads, nodes, dim)

        shape: dict = {"context": context, "ms": {}, "error_vs_fp32": {}}
        contexts_out = {}
        variants = {"dense": (dense, None), "square/sdpa": (causal_square, None),
                    "square/cudnn": (causal_square, [SDPBackend.CUDNN_ATTENTION]),
                    "square/flash": (causal_square, [SDPBackend.FLASH_ATTENTION]),
                    "flash_br": (flash_br, None)}
        for name, (fn, backends) in variants.items():
            def run(fn=fn, backends=backends):
                if backends is None:
                    return fn()
                with sdpa_kernel(backends):
                    return fn()
            try:
                shape["ms"][name] = round(timed(run, repeats), 4)
                contexts_out[name] = run()
            except Exception as err:  # a kernel that refuses these shapes
                shape["ms"][name] = f"{type(err).__name__}: {str(err)[:200]}"
        for name, fn in {"nodes/gqa": nodes_gqa, "nodes/folded": nodes_folded}.items():
            try:
                shape["ms"][name] = round(timed(fn, repeats), 4)
                node_out = fn()
                for ctx_name, ctx in contexts_out.items():
                    if ctx_name != "dense":
                        shape["error_vs_fp32"][f"{ctx_name}+{name}"] = round(error(torch.cat([ctx, node_out], 2)), 5)
            except Exception as err:
                shape["ms"][name] = f"{type(err).__name__}: {str(err)[:200]}"
        if "dense" in contexts_out:
            shape["error_vs_fp32"]["dense"] = round(error(contexts_out["dense"]), 5)
        result["shapes"][str(context)] = shape
        print(json.dumps(shape), flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_judge_attention.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
