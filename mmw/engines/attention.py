"""Grouped-query attention through SDPA under a padding mask, on CUDA.

transformers' SDPA path passes ``enable_gqa=True`` only when there is no attention mask (it fears a fallback to
the math kernel); with the left padding of a batched ``generate`` there always is one, so every layer copies its
K/V to all query heads on every step (``repeat_kv``). Measured on one H100 (bench/gpu_kv_cache.py, random-init
Llama-3-8B shape, 296 rows x 1,024 new tokens): those copies were 42% of the GPU time of a decode step, and
allowing GQA with the mask (torch dispatches it to cuDNN's fused attention there) made the whole generation
1.9x faster (215.6 s -> 112.5 s). The result is the same attention (each query head reads its group's K/V
instead of a copy of it); only the kernel changes.

Off the GPU nothing is changed: on a CPU the math path is what runs either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


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

    sdpa_attention.use_gqa_in_sdpa = with_mask_too
    try:
        yield
    finally:
        sdpa_attention.use_gqa_in_sdpa = original
