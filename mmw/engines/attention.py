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

Inside the static decode loop (``mmw.engines.graph_decode``) a decoding step can instead run ``flex_attention``
(compiled: torch's split-K decoding kernel, whose partial results are combined in a fixed order) under a block mask
that lists only the cache blocks written so far (a ``DecodeWindow``'s blocks, advanced on the device by the step,
so one captured graph serves every step). On one H200 (bench/gpu_decode_kernels.py, 296 rows, a 1,087-position cache) it
repeated bit for bit over 20 calls and took 0.20 / 0.35 / 0.58 ms a layer with 192 / 576 / 1,087 positions
written, against 0.30 / 0.47 / 0.77 ms for the memory-efficient kernel over the written positions and ~0.40 ms
for cuDNN (which differed in 3-9 rows).

The judge's prompt forward on CUDA widens only its attention (``attention_at_mask_widths``): its rows are padded to
their batch's longest, its mask is built at query and key widths rounded up to ``ROUNDED_WIDTH``, and SDPA pads the
query, keys and values to the mask's widths, so cuDNN plans a kernel for few widths while the matrix products skip
the rounding's pad positions (on one H200: 34.93 -> 34.2 ms a judgement in one process, bench/results/gpu.md).

The judge's expected-mode forward on CUDA instead splits its attention (``causal_split_attention``): its rows are
padded on the right, every query runs one square causal call (cuDNN skips the masked blocks, which the dense tree
mask made it compute), and the few extra queries (each row's last token, the grade trie's inner nodes) run apart
under their own mask: one layer's attention 1.40 -> 0.71 ms on one H100 (bench/results/gpu.md).

Off the GPU nothing is changed: on a CPU the math path is what runs either way. Which decoding attention runs is
the caller's argument (params ``engine.decode_attention``); the static loop's per-step state reaches the attention
as a ``DecodeWindow`` in the forward's keyword arguments, never through this module's globals. Every change to
transformers' internals goes through :mod:`mmw.engines.transformers_patches`, which checks the installed version.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mmw.engines.transformers_patches import (DECODE_WINDOW_KWARG, gqa_rule_replaced, sdpa_function_replaced,
                                              sdpa_module)
from mmw.inductor import inductor_options

#: A decoding step's attention on CUDA (params ``engine.decode_attention``): "flex" (in the static decode loop:
#: compiled ``flex_attention`` over the written blocks; elsewhere as "efficient"), "efficient" (``decode_attention``'s
#: memory-efficient kernel; both repeat bit for bit) or "sdpa" (SDPA's own GQA choice, cuDNN on Hopper, which
#: does not repeat). A 1,024-token generation of 296 rows on one H200 (bench/results/gpu.md): flex 23.0 s,
#: sdpa 25.0 s, efficient 27.2 s (34.8 s without a key limit).
DECODE_ATTENTION_CHOICES = ("flex", "efficient", "sdpa")


@dataclass
class DecodeWindow:
    """What the static decode loop (``mmw.engines.graph_decode``) tells its decoding attention, per batch: the cache
    positions a step reads (``key_limit``, None: all of them; the positions past it are masked anyway, so reading
    them is pure cost) and the flex block mask over its cache (``blocks``, None off the flex path; a step whose keys
    span exactly its ``seq_lengths`` runs ``flex_attention`` under it). The loop owns it and passes it with every
    forward (``transformers_patches.DECODE_WINDOW_KWARG``)."""

    key_limit: int | None = None
    blocks: Any = None


#: Cache positions per block of a ``DecodeWindow``'s block mask (flex_attention's default tile).
FLEX_BLOCK = 128
#: ``flex_decode`` is compiled per batch and cache shape: compiled for dynamic shapes it took 68.3 s for the
#: 1,024-token generation of 296 rows on one H200 that takes 23.0 s compiled for its shape (bench/results/gpu.md).
FLEX_DYNAMIC = False
#: Shapes ``flex_decode`` is compiled for in one process. Past torch's own limit (8) it would run later shapes
#: eagerly, with other rounding than a fresh process gives the same batch (texts depending on the process's
#: history); so the limit is raised, and reaching it raises instead of falling back.
FLEX_SHAPES = 64
#: ``flex_attention``'s kernel options for a decoding step, by the GPU's compute capability ({} or absent: torch's
#: own choice). For this step on Hopper torch 2.11 picks BLOCK_N 64, 2 warps and one pipeline stage, one program per
#: (row, K/V head) walking its blocks without overlapping loads; 4 warps and 3 stages keep the same split (SPLIT_KV
#: 1, so the same summation order per block) and prefetch. On one H200 (bench/gpu_decode_kernels.py --sweep, 296
#: rows, CUDA-graph replays of one layer): 0.120 / 0.275 / 0.453 -> 0.095 / 0.197 / 0.315 ms at 192 / 576 / 1,087
#: written positions, bit-for-bit repeatable over 20 runs, the same largest error against float32 attention; whole
#: 296 x 1,024 generations (bench/gpu_repeat.py, 4 interleaved rounds each): 22.18 -> 19.65-19.93 ms of GPU time a
#: step. Three stages need ~96 KB of shared memory a program: measured on Hopper only, so other cards keep torch's.
FLEX_DECODE_OPTIONS: dict[tuple[int, int], dict[str, Any]] = {(9, 0): {"num_warps": 4, "num_stages": 3}}
#: The kernels a decoding step may use: both repeat bit for bit; cuDNN's did not.
DECODE_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
#: Query and key widths a prompt forward's attention is rounded up to by ``rounded_width`` (cuDNN
#: builds a plan per width; the judge's widths rounded to 128 took 25.7 ms a judgement where its own widths took
#: 47.5, on one H100, bench/results/cost_per_configuration.md).
ROUNDED_WIDTH = 128


def checked_decode_attention(choice: str) -> str:
    """``choice`` if it is one of ``DECODE_ATTENTION_CHOICES``, else ValueError naming the param."""
    if choice not in DECODE_ATTENTION_CHOICES:
        raise ValueError(f"engine.decode_attention: expected one of {', '.join(DECODE_ATTENTION_CHOICES)}, "
                         f"got {choice!r}")
    return choice


_compiled_flex: Any = None


def flex_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, blocks: Any,
                scaling: float | None) -> torch.Tensor:
    """``flex_attention`` of one decoding step under ``blocks``, compiled per shape on CUDA (up to ``FLEX_SHAPES``
    in a process; its decoding kernel exists only compiled, eager flex materializes the scores; the CPU runs it
    eagerly). [B, H, 1, D] with K/V [B, H_kv, L, D] -> [B, H, 1, D]."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if not query.is_cuda:
        return flex_attention(query, key, value, block_mask=blocks, enable_gqa=True, scale=scaling)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=FLEX_DYNAMIC, options=inductor_options())
    limits = {name: setting for name, setting in (("recompile_limit", FLEX_SHAPES),
                                                  ("fail_on_recompile_limit_hit", True))
              if hasattr(torch._dynamo.config, name)}  # the names of torch >= 2.7
    options = FLEX_DECODE_OPTIONS.get(torch.cuda.get_device_capability(query.device)) or None
    with torch._dynamo.config.patch(**limits):
        return _compiled_flex(query, key, value, block_mask=blocks, enable_gqa=True, scale=scaling,
                              kernel_options=options)


def decode_blocks(mask2d: torch.Tensor, listed: torch.Tensor) -> Any:
    """A flex block mask over a static cache: row b may attend position j iff ``mask2d[b, j]``, and only its first
    ``listed[b, 0, 0]`` blocks of ``FLEX_BLOCK`` positions are read (the caller keeps every later position masked
    and updates both tensors in place). ``mask2d`` bool [B, L], ``listed`` int32 [B, 1, 1]."""
    from torch.nn.attention.flex_attention import BlockMask

    rows, length = mask2d.shape
    block = FLEX_BLOCK
    n = -(-length // block)
    order = torch.arange(n, dtype=torch.int32, device=mask2d.device).expand(rows, 1, 1, n).contiguous()

    def attendable(b, h, q_idx, kv_idx):
        return mask2d[b, kv_idx]

    return BlockMask.from_kv_blocks(listed, order, BLOCK_SIZE=block, mask_mod=attendable,
                                    seq_lengths=(1, length))


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None,
                     window: DecodeWindow | None = None) -> tuple[torch.Tensor, None]:
    """One decoding step's attention, as transformers' attention functions return it.

    ``query`` [B, H, 1, D], ``key``/``value`` [B, H_kv, L, D] (H a multiple of H_kv: query head h reads K/V head
    h // (H / H_kv), as transformers' ``repeat_kv`` pairs them), ``attention_mask`` boolean or additive,
    broadcastable to [B, 1, 1, L]; with a ``window``, only its first ``key_limit`` positions are read when it is set
    (every later one must be masked), and under its ``blocks`` (keys spanning their length) it is ``flex_decode``'s.
    Returns ([B, 1, H, D], None)."""
    b, heads, _, dim = query.shape
    blocks = window.blocks if window is not None else None
    limit = window.key_limit if window is not None else None
    if blocks is not None and key.shape[-2] == blocks.seq_lengths[1]:
        out = flex_decode(query, key, value, blocks, scaling)
        return out.transpose(1, 2).contiguous(), None
    if limit is not None and limit < key.shape[-2]:
        key, value = key[:, :, :limit], value[:, :, :limit]
    kv_heads = key.shape[1]
    grouped = query.reshape(b, kv_heads, heads // kv_heads, dim)  # each group's query heads as its queries
    mask = attention_mask[..., : key.shape[-2]] if attention_mask is not None else None
    with sdpa_kernel(DECODE_BACKENDS):
        out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


def _with_decode_path(prompt_attention: Any) -> Any:
    """transformers' SDPA attention function, with decoding steps sent to ``decode_attention``."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        window = kwargs.pop(DECODE_WINDOW_KWARG, None)
        if query.shape[2] == 1 and not dropout and kwargs.get("position_bias") is None \
                and query.shape[1] % key.shape[1] == 0 and kwargs.get("cache") is None:
            return decode_attention(module, query, key, value, attention_mask, scaling, window)
        return prompt_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)

    attention.mmw_decode_path = True
    return attention


def _gqa_with_mask_too(attention_mask: Any, key: Any, value: Any) -> bool:
    """transformers' ``use_gqa_in_sdpa`` with the mask condition dropped: the head-size condition it applies in the
    unmasked case. One module-level function, so a compiled layer that calls it keeps its graph."""
    return key.shape[-1] == value.shape[-1] <= 256


def rounded_width(width: int) -> int:
    """``width`` rounded up to the next multiple of ``ROUNDED_WIDTH``, one more block when it is one already (a
    compiled layer would otherwise guard on "no padding" and compile a second graph for those widths)."""
    return width + ROUNDED_WIDTH - width % ROUNDED_WIDTH


def _mask_width_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """transformers' SDPA attention over the additive mask's widths: ``query`` [B, H, Q, D] and ``key``/``value``
    [B, H_kv, K, D] padded at the end up to ``attention_mask`` [B, 1, Q', K'] (Q' >= Q, K' >= K; the mask hides
    the pad keys from every real query, whose attention is then the same: a pad key adds exp(min) = 0). Returns
    ([B, Q, H, D], weights). The padded query is laid out [B, H, Q', D]: padded in the projections' layout
    ([B, Q', H, D], which would spare the output's transposition) the compiled layer's rotary-and-pad kernel took
    0.89 ms a judgement instead of 0.34 on one H200, more than the transposition costs. One module-level function,
    so a compiled layer that calls it keeps its graph."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    queries, keys = query.shape[2], key.shape[2]
    query_pad, key_pad = attention_mask.shape[-2] - queries, attention_mask.shape[-1] - keys
    pad = torch.nn.functional.pad
    out, weights = sdpa_attention_forward(module, pad(query, (0, 0, 0, query_pad)), pad(key, (0, 0, 0, key_pad)),
                                          pad(value, (0, 0, 0, key_pad)), attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
    return out[:, :queries], weights


@contextmanager
def attention_at_mask_widths(model: Any, active: bool = True) -> Iterator[None]:
    """While the block runs (and ``active``), ``model``'s SDPA attention runs at its additive 4-D mask's widths,
    which the caller makes wider than the forward's query and key widths (``rounded_width`` of each).

    Why: torch's cuDNN attention builds an execution plan for every new sequence length (~0.4 s on an H100), so
    batches of assorted widths must share a few shapes; widening only the attention, not the batch's rows, spares
    the matrix products the pad positions (on one H200, the judge's rows rounded to 128 tokens forwarded ~5 %
    pad positions). Not for decoding steps (one query a row): they keep their own path."""
    if not active or getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa":
        yield
        return
    with sdpa_function_replaced(lambda _: _mask_width_attention):
        yield


def _causal_split_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The judge's expected-mode attention split in two (``causal_split_attention``). ``query`` [B, H, C + X, D]:
    C right-padded context positions, then X extra positions (each row's last token and the grade trie's inner
    nodes); ``key``/``value`` [B, H_kv, P + C + X, D] (P: the shared head's positions before them);
    ``attention_mask`` [B, 1, X, W]: the extra queries' additive mask over the keys widened to W (a multiple of
    ``ROUNDED_WIDTH``).

    The context queries see the head and their row's tokens up to their own: causal, since their row's pads come
    after them. Every query, front-padded by P zero rows and padded at the end to W, runs one square causal SDPA
    call (so the top-left causal mask is the head-plus-causal one), on whichever fused kernel SDPA picks (cuDNN on
    Hopper), which skips the masked half of the blocks; the pads are the same copy the rounded dense call made,
    fused with the rotary embedding. The X extra queries of each K/V head are then folded into its queries (no K/V
    copies) and read every key under their mask; the two outputs are concatenated in the kernel that transposes them
    (writing the extra rows over the causal call's output instead made the compiler copy that output whole: 0.4-0.5
    ms more a judgement on one H100, the same bits; bench/results/gpu.md). Returns ([B, C + X, H, D], None). One
    module-level function, so a compiled layer that calls it keeps its graph."""
    pad = torch.nn.functional.pad
    batch, heads, queries, dim = query.shape
    kv_heads, keys, width = key.shape[1], key.shape[2], attention_mask.shape[-1]
    groups = heads // kv_heads
    extra = attention_mask.shape[-2]
    context, head = queries - extra, keys - queries
    key, value = pad(key, (0, 0, 0, width - keys)), pad(value, (0, 0, 0, width - keys))
    out = torch.nn.functional.scaled_dot_product_attention(
        pad(query, (0, 0, head, width - keys)), key, value, is_causal=True, scale=scaling, enable_gqa=groups > 1)
    nodes = extra_query_attention(query[:, :, context:], key, value, attention_mask, scaling)
    out = torch.cat([out[:, :, head:head + context], nodes], 2)
    return out.transpose(1, 2).contiguous(), None


def extra_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
                          scaling: float | None) -> torch.Tensor:
    """The judge's X extra queries [B, H, X, D] over ``key``/``value`` [B, H_kv, K, D] under their additive mask
    [B, 1, X, W] (W >= K: the keys are padded to it) -> [B, H, X, D]. The queries of each K/V head are folded into
    one row block of its group (no K/V copies), the mask's rows repeated once per query head of a group."""
    batch, heads, extra, dim = query.shape
    kv_heads, keys, width = key.shape[1], key.shape[2], attention_mask.shape[-1]
    groups = heads // kv_heads
    if keys < width:
        pad = torch.nn.functional.pad
        key, value = pad(key, (0, 0, 0, width - keys)), pad(value, (0, 0, 0, width - keys))
    nodes = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, kv_heads, groups * extra, dim), key, value,
        attn_mask=attention_mask.repeat(1, 1, groups, 1), scale=scaling)
    return nodes.reshape(batch, heads, extra, dim)


@contextmanager
def causal_split_attention(model: Any, active: bool = True) -> Iterator[None]:
    """While the block runs (and ``active``), ``model``'s SDPA attention is :func:`_causal_split_attention`: the
    judge's forward over right-padded rows followed by its extra positions, with the extra positions' mask as the
    attention mask.

    Why: under the dense tree mask (``attention_at_mask_widths``) the fused kernel computes every block of the
    query-by-key matrix, half of which the causal mask then discards. On one H100 (bench/gpu_judge_attention.py,
    one layer, 16 rows, 57 head positions, 11 extra) the dense call took 1.40 / 2.23 ms at 1,070 / 1,400 context
    positions, the square causal call 0.71 / 1.04 ms, with the same largest difference from a float32
    reference."""
    if not active or getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa":
        yield
        return
    with sdpa_function_replaced(lambda _: _causal_split_attention):
        yield


def _gqa_switch(model: Any) -> Any:
    """transformers' sdpa_attention module when ``model`` is on CUDA and transformers has the GQA switch, else None."""
    if getattr(getattr(model, "device", None), "type", None) != "cuda":
        return None
    return sdpa_module()


@contextmanager
def grouped_query_prompts(model: Any) -> Iterator[None]:
    """While the block runs, SDPA attention on CUDA reads each K/V head for its group of query heads under a mask
    too (no ``repeat_kv`` copies); decoding steps are left as they are. For compiled forwards (the judge's): every
    entry installs the same function objects."""
    if _gqa_switch(model) is None:
        yield
        return
    with gqa_rule_replaced(_gqa_with_mask_too):
        yield


@contextmanager
def grouped_query_sdpa(model: Any, decode: str = "flex") -> Iterator[None]:
    """:func:`grouped_query_prompts`, and decoding steps sent to :func:`decode_attention` unless ``decode`` (params
    ``engine.decode_attention``) is "sdpa" (no-op off CUDA, or when transformers has no such switch)."""
    fold_decoding = checked_decode_attention(decode) != "sdpa"
    if _gqa_switch(model) is None:
        yield
        return
    with grouped_query_prompts(model), \
            sdpa_function_replaced(_with_decode_path) if fold_decoding else nullcontext():
        yield
