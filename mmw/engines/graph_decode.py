"""Batched decoding over a static KV cache with the whole decode step captured as one CUDA graph.

``generate_batch`` on CUDA with the pre-allocated cache used transformers' ``generate`` loop: per step, Python of
the loop, of 32 decoder layers and of the mask builder, ~1,500 kernel launches, for ~19 ms of GPU work in ~39 ms
of wall time at batch 296 (bench/results/gpu.md, H200 profile). Here the same computation is run by a loop of
our own:

* prefill: the model's forward over the left-padded prompts, transformers' own mask, exactly as ``generate``
  calls it (2-D padding mask, positions from the mask's cumulative sum, ``logits_to_keep=1``);
* decode step (one function, ``_Decoder.step``): the model's forward of the last token against the static cache
  with a pre-built 4-D boolean mask (the value transformers' SDPA mask builder gives: the row's real prompt
  positions and every generated position up to the current one), float32 logits of the last position, the
  processor's ``static_step`` (the watermark step: seeds, sampler, entropies, the row history), finished rows
  forced to the pad token, EOS bookkeeping, and the token written into a pre-allocated output table. Every
  input of the step lives in a fixed device buffer and every counter (cache position, RoPE positions, step
  index) is a device tensor advanced by the step itself, so the step has no host synchronisation and no
  data-dependent shape: on CUDA it is recorded (``torch.cuda.CUDAGraph``) after ``WARMUP_STEPS`` eager steps
  (which build cuBLAS / cuDNN plans and compile the watermark step) and replayed, once per bound of the
  positions the decoding attention reads (``key_limit``: the written positions rounded up to ``KEY_BUCKET``, since
  the rest of the pre-allocated cache is masked). With ``flex_attention`` as the decoding attention (the CUDA
  default, ``mmw.engines.attention``) the bound is instead a device tensor of the step (the blocks of its block
  mask), and one graph serves every step. The bound and the block mask live in the batch's ``DecodeWindow``,
  passed with every forward (``mmw.engines.transformers_patches.DECODE_WINDOW_KWARG``).
* stopping: the host reads "is any row unfinished" every ``STOP_CHECK_EVERY`` steps (one sync per check), so up
  to that many extra steps run after every row has ended; their tokens come after each row's EOS and are
  dropped by ``strip_after_eos`` like transformers' padding.

The eager path (``graph=False``, and the fallback if capturing fails) runs the same step function, so both
compute the same tokens; tests/test_graph_decode.py compares it with transformers' ``generate`` token for token.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, StaticCache

from mmw.engines import ahead, attention
from mmw.engines.attention import DecodeWindow, checked_decode_attention, decode_blocks
from mmw.engines.transformers_patches import DECODE_WINDOW_KWARG

#: Eager decode steps before the capture: cuBLAS/cuDNN plans and the compiled watermark step are built there, and
#: every allocation the step makes has been seen once.
WARMUP_STEPS = 2
#: Steps between two host reads of "is any row still unfinished".
STOP_CHECK_EVERY = 16
#: Cache positions per key bound of the memory-efficient decoding attention (``key_limit``): the steps of one
#: bucket share a graph; None: one bound, the whole cache. Bounding it skips the positions not yet written (about
#: half of them over a generation): on one H200 (bench/gpu_repeat.py, 296 rows x 1,024 new tokens, graph loop)
#: 27.2 s against 34.8 s, the same tokens (one digest), as the CPU test also checks.
KEY_BUCKET: int | None = 128
#: Benches set a list here: a (start, end) CUDA event pair is appended around every decode step (no sync).
STEP_EVENTS: list | None = None


def graph_default(device: torch.device, graph_decode: bool = True) -> bool:
    """Capture the decode step on CUDA when ``graph_decode`` (params ``engine.graph_decode``)."""
    return device.type == "cuda" and graph_decode


def flex_default(device: torch.device, decode: str = "flex") -> bool:
    """Decode with ``flex_attention`` over the written blocks on CUDA when ``decode`` (params
    ``engine.decode_attention``) is "flex"."""
    return device.type == "cuda" and checked_decode_attention(decode) == "flex"


class _Decoder:
    """The state of one batch's decoding: fixed buffers read and advanced by ``step``."""

    def __init__(self, model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, processor,
                 max_new_tokens: int, eos_ids: Sequence[int], pad_id: int, flex: bool = False):
        self.model, self.processor = model, processor
        device = input_ids.device
        b, p = input_ids.shape
        self.prompt_len, self.max_new = p, max_new_tokens
        length = p + max_new_tokens - 1  # as generate sizes it: the last token is never fed back
        self.cache_len = length
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.int64, device=device)
        self.pad = int(pad_id)
        mask = attention_mask.to(torch.bool)
        # Attendable positions: the row's real prompt tokens, every generated position; ``step`` ands in "<= now".
        self.base = torch.ones(b, length, dtype=torch.bool, device=device)
        self.base[:, :p] = mask
        self.kv_index = torch.arange(length, dtype=torch.int64, device=device)
        self.mask2d = torch.zeros(b, length, dtype=torch.bool, device=device)
        self.mask4d = self.mask2d[:, None, None, :]
        # flex path: the blocks of FLEX_BLOCK positions the step's attention reads, advanced by the step
        self.listed = torch.ones(b, 1, 1, dtype=torch.int32, device=device) if flex else None
        self.window = DecodeWindow(blocks=decode_blocks(self.mask2d, self.listed) if flex else None)
        # RoPE positions as generate computes them: cumsum of the padding mask - 1 (prompt), then +1 a step.
        self.prompt_positions = attention_mask.long().cumsum(-1) - 1
        self.prompt_positions.masked_fill_(attention_mask == 0, 1)
        self.position = self.prompt_positions[:, -1:].clone()  # [B, 1], advanced before each decode forward
        self.now = torch.full((1,), p - 1, dtype=torch.int64, device=device)  # cache position of the fed token
        self.t = torch.zeros(1, dtype=torch.int64, device=device)  # index of the token being chosen
        self.token = input_ids[:, -1:].clone()  # [B, 1], the token fed to the next forward
        self.unfinished = torch.ones(b, dtype=torch.int64, device=device)
        self.out = torch.full((b, max_new_tokens), self.pad, dtype=torch.int64, device=device)
        n = processor.window_context
        self.context = input_ids[:, p - n:].clone() if n else input_ids.new_zeros(b, 0)
        self.input_ids, self.attention_mask = input_ids, attention_mask

    def prefill_scores(self) -> torch.Tensor:
        """The prompt's forward; float32 [B, V] logits of its last position. Eager whatever is compiled around it
        (params ``engine.fuse_layers``): it runs once a batch, and compiling the fused pieces for its shape cost
        more than they could save (one H100, bench/results/gpu.md: the first prefill of a process took 3.4 s warm
        and 9.6 s with cold caches against 0.45 s for a later one)."""
        with _eager():
            out = self.model(input_ids=self.input_ids, attention_mask=self.attention_mask,
                             position_ids=self.prompt_positions, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1)
        return out.logits[:, -1].to(copy=True, dtype=torch.float32)

    def choose(self, scores: torch.Tensor) -> None:
        """The token choice of one step from its logits, and everything that follows it (device only)."""
        chosen = self.processor.static_step(self.context, scores, self.t)
        chosen = chosen * self.unfinished + self.pad * (1 - self.unfinished)
        self.unfinished.mul_((~torch.isin(chosen, self.eos)).to(torch.int64))
        self.out.index_copy_(1, self.t, chosen.unsqueeze(-1))
        self.t.add_(1)
        self.token.copy_(chosen.unsqueeze(-1))
        if self.context.shape[1]:
            self.context.copy_(torch.cat([self.context[:, 1:], chosen.unsqueeze(-1)], dim=1))

    def step(self) -> None:
        """One decode step: the forward of the last chosen token, then ``choose``."""
        self.now.add_(1)
        self.position.add_(1)
        torch.logical_and(self.base, self.kv_index <= self.now, out=self.mask2d)
        if self.listed is not None:  # the blocks up to the fed token's position
            block = attention.FLEX_BLOCK
            self.listed.copy_(torch.div(self.now + block, block, rounding_mode="floor").view(1, 1, 1))
        out = self.model(input_ids=self.token, attention_mask=self.mask4d, position_ids=self.position,
                         past_key_values=self.cache, use_cache=True, **{DECODE_WINDOW_KWARG: self.window})
        self.choose(out.logits[:, -1].to(copy=True, dtype=torch.float32))

    def any_unfinished(self) -> bool:
        return bool(self.unfinished.any())


def _eager() -> contextlib.AbstractContextManager:
    """Compiled functions run as their eager selves inside (``torch.compiler.set_stance``, torch >= 2.6; with an
    older torch nothing changes: the prefill then runs the fused pieces too, the same computation)."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


def key_limit(prompt_len: int, done: int, cache_len: int, bounded: bool = True) -> int:
    """The attention's key bound for the decoding step after ``done`` chosen tokens: its fed token sits at cache
    position ``prompt_len - 1 + done``, rounded up to a multiple of ``KEY_BUCKET`` (one captured graph a bucket);
    the whole cache when ``KEY_BUCKET`` is None or not ``bounded`` (flex bounds its reads itself; SDPA's own kernel
    reads the whole cache, so a bound would only cost captures)."""
    if KEY_BUCKET is None or not bounded:
        return cache_len
    return min(cache_len, -(-(prompt_len + done) // KEY_BUCKET) * KEY_BUCKET)


def static_decode(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, processor,
                  max_new_tokens: int, eos_ids: Sequence[int], pad_id: int, graph: bool | None = None,
                  flex: bool | None = None, decode: str = "flex") -> torch.Tensor:
    """Generated ids int64 [B, steps] (steps <= max_new_tokens; pad after a row's EOS, like ``generate``).

    ``processor`` has ``window_context``, ``begin_static(batch, steps, device)`` and ``static_step(context, scores,
    t)`` (``mmw.watermark.processor.WatermarkProcessor``). ``graph`` None: capture on CUDA (``graph_default``). ``flex``
    None: ``flex_default(device, decode)``; then each step's decoding attention is ``flex_attention`` over the cache
    blocks written so far (the window's ``blocks``) and one graph is captured. Otherwise it reads the cache only up
    to ``key_limit`` (the window's ``key_limit``) and the graph is captured once per limit, the captures sharing
    one memory pool (they replay one at a time). ``decode``: params ``engine.decode_attention``; the caller installs
    the matching attention (``mmw.engines.attention.grouped_query_sdpa``)."""
    device = input_ids.device
    graph = graph_default(device) if graph is None else graph
    flex = flex_default(device, decode) if flex is None else flex
    bounded = not flex and checked_decode_attention(decode) != "sdpa"
    processor.begin_static(input_ids.shape[0], max_new_tokens, device, graph=graph)
    dec = _Decoder(model, input_ids, attention_mask, processor, max_new_tokens, eos_ids, pad_id, flex=flex)
    dec.choose(dec.prefill_scores())
    try:
        done = _loop(dec, graph, flex, bounded, max_new_tokens)
    finally:
        ahead.settle()  # a later stage's set-up that ran beside the loop is done before anything else runs
    processor.end_static(done)
    return dec.out[:, :done]


def _loop(dec: _Decoder, graph: bool, flex: bool, bounded: bool, max_new_tokens: int) -> int:
    """``static_decode``'s steps after the prefill's token; returns the number of tokens chosen. Once the one graph
    of a flex decode has replayed, the host only replays it and reads the stop flag: later stages' set-up may run
    beside it (``mmw.engines.ahead``)."""
    device = dec.out.device
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    done, host_free = 1, False
    window = dec.window
    while done < max_new_tokens:
        if done % STOP_CHECK_EVERY == 0 and not dec.any_unfinished():
            break
        window.key_limit = key_limit(dec.prompt_len, done, dec.cache_len, bounded)
        if graph and done > WARMUP_STEPS and window.key_limit not in graphs:
            pool = next(iter(graphs.values())).pool() if graphs else None
            captured = _capture(dec, pool)
            if captured is None:
                graph = False
            else:
                graphs[window.key_limit] = captured
        events = STEP_EVENTS is not None and device.type == "cuda"
        if events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        if graph and window.key_limit in graphs:
            graphs[window.key_limit].replay()
            if flex and not host_free:  # one graph: no capture or eager step follows its first replay
                host_free = True
                ahead.device_busy(device)
        else:
            dec.step()
        if events:
            end.record()
            STEP_EVENTS.append((start, end))
        done += 1
    return done


def _capture(dec: _Decoder, pool=None) -> torch.cuda.CUDAGraph | None:
    """Record ``dec.step`` (not run: the capture only records) into ``pool`` (None: a new one); None, with a
    warning, if recording fails."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, pool=pool):
            dec.step()
    except Exception as err:  # a step that cannot be recorded must not cost the run: eager is the same function
        warnings.warn(f"CUDA-graph capture of the decode step failed ({type(err).__name__}: {str(err)[:500]}); "
                      "decoding eagerly")
        torch.cuda.synchronize()
        return None
    return g
