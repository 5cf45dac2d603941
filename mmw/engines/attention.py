"""Grouped-query attention through SDPA under a padding mask, on CUDA.

transformers' SDPA path passes ``enable_gqa=True`` only when there is no attention mask (it fears a fallback to
the math kernel); with the left padding of a batched ``generate`` there always is one, so every layer copies its
K/V to all query heads on every step (``repeat_kv``). Measured on one H100 (bench/gpu_kv_cache.py, random-init
Llama-3-8B shape, 296 rows x 1,024 new tokens): those copies were 42% of the GPU time of a decode step, and
allowing GQA with the mask (torch dispatches it to cuDNN's fused attention there) made the whole generation
1.9x faster (215.6 s -> 112.5 s). The result is the same attention (each query head reads its group's K/V
instead of a copy of it); only the kernel changes.

Decoding steps (one query per row) take a second path: cuDNN's fused attention is not deterministic there. On
one H200 (torch 2.11, bench/gpu_decode_determinism.py: 296 rows, random-init Llama-3-8B in bf16), the first decode
forward repeated from the same cache gave different logits in 21-30 of 296 rows (up to 0.23 apart) once the cache
held more than 128 positions, with GQA or without, boolean or additive mask; the math kernel repeated exactly, and
so whole generations of 128 tokens never repeated. A decoding step therefore folds each group's query heads into
its queries (query [B, H, 1, D] -> [B, H_kv, H/H_kv, D] against the group's own K/V [B, H_kv, L, D]: the same
attention, no K/V copy, no GQA flag needed) and runs it on the memory-efficient kernel (math as its fallback),
never cuDNN. Prompt forwards (many queries a row) keep the path above; they repeat exactly.

Off the GPU nothing is changed: on a CPU the math path is what runs either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

#: A decoding step's attention on CUDA (``MMW_DECODE_ATTENTION``): "efficient" (``decode_attention``, repeats bit
#: for bit) or "sdpa" (SDPA's own GQA choice, cuDNN on Hopper: 1.39x faster over a 1,024-token generation on one
#: H200, 25.0 s against 34.8 s for 296 rows, bench/results/gpu.md, but not reproducible).
DECODE_ATTENTION_CHOICES = ("efficient", "sdpa")
#: Cache positions a decoding step's attention reads (None: all of them). A decode loop over a pre-allocated cache
#: sets it per step to a bound on the positions written so far (``mmw.engines.graph_decode``): the positions past
#: it are masked out anyway, so reading them is pure cost.
KEY_LIMIT: int | None = None
#: The kernels a decoding step may use: both repeat bit for bit; cuDNN's did not.
DECODE_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_attention_choice() -> str:
    """``MMW_DECODE_ATTENTION``, checked: "efficient" unless set."""
    choice = os.environ.get("MMW_DECODE_ATTENTION", "efficient")
    if choice not in DECODE_ATTENTION_CHOICES:
        raise ValueError(f"MMW_DECODE_ATTENTION: expected one of {', '.join(DECODE_ATTENTION_CHOICES)}, "
                         f"got {choice!r}")
    return choice


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None) -> tuple[torch.Tensor, None]:
    """One decoding step's attention, as transformers' attention functions return it.

    ``query`` [B, H, 1, D], ``key``/``value`` [B, H_kv, L, D] (H a multiple of H_kv: query head h reads K/V head
    h // (H / H_kv), as transformers' ``repeat_kv`` pairs them), ``attention_mask`` boolean or additive,
    broadcastable to [B, 1, 1, L]; only the first ``KEY_LIMIT`` positions are read when it is set (every later one
    must be masked). Returns ([B, 1, H, D], None)."""
    b, heads, _, dim = query.shape
    if KEY_LIMIT is not None and KEY_LIMIT < key.shape[-2]:
        key, value = key[:, :, :KEY_LIMIT], value[:, :, :KEY_LIMIT]
    kv_heads = key.shape[1]
    grouped = query.reshape(b, kv_heads, heads // kv_heads, dim)  # each group's query heads as its queries
    mask = attention_mask[..., : key.shape[-2]] if attention_mask is not None else None
    with sdpa_kernel(DECODE_BACKENDS):
        out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


def _with_decode_path(prompt_attention: Any) -> Any:
    """transformers' SDPA attention function, with decoding steps sent to ``decode_attention``."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if query.shape[2] == 1 and not dropout and kwargs.get("position_bias") is None \
                and query.shape[1] % key.shape[1] == 0 and kwargs.get("cache") is None:
            return decode_attention(module, query, key, value, attention_mask, scaling)
        return prompt_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)

    attention.mmw_decode_path = True
    return attention


@contextmanager
def grouped_query_sdpa(model: Any) -> Iterator[None]:
    """While the block runs, let transformers' SDPA attention use grouped-query attention with a mask when
    ``model`` is on CUDA (no-op elsewhere, or when transformers has no such switch)."""
    device = getattr(model, "device", None)
    if getattr(device, "type", None) != "cuda":
        yield
        return
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        yield
        return
    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if original is None:
        yield
        return

    def with_mask_too(attention_mask: Any, key: Any, value: Any) -> bool:
        # the head-size condition transformers applies in the unmasked case
        return key.shape[-1] == value.shape[-1] <= 256

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping  # transformers' own per-instance override slot
    saved = local.get("sdpa")
    fold_decoding = decode_attention_choice() == "efficient"
    sdpa_attention.use_gqa_in_sdpa = with_mask_too
    if fold_decoding:
        local["sdpa"] = _with_decode_path(ALL_ATTENTION_FUNCTIONS["sdpa"])
    try:
        yield
    finally:
        sdpa_attention.use_gqa_in_sdpa = original
        if saved is None:
            local.pop("sdpa", None)
        else:
            local["sdpa"] = saved
