"""The per-step token choice shared by every engine, and its Hugging Face ``generate`` adapter.

``WatermarkStep`` is the whole watermark work of one decoding step as pure tensor code: the seed of each row
(R1-R3), the sampler's choice (C1-C4, skip), and the entropies of the model's own distribution. Every engine calls
it: ``WatermarkProcessor`` (transformers, one batch of rows in lockstep) and ``mmw.engines.vllm_engine`` (vLLM,
requests joining and leaving the batch at any step). Per-row state lives in four int64 tensors (context tail,
step index, fixed-key shift, row seed), so a row's tokens depend only on its own seed and context — never on
which other rows share the batch, on the batch order, or on preemption.

On a GPU the step runs through ``torch.compile``: a decoding step is a few reductions and one PRF over B x V
entries, microseconds of memory traffic, and eager PyTorch spends ~20x that on launches and float64
intermediates. The compiled and eager paths compute the same function (tests/test_processor.py; the GPU bench
compares their tokens).

The processor chooses every token itself and returns logits that are -inf except at the chosen token, so the
engine runs plain greedy decoding and no engine-side warper can interfere.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from transformers import LogitsProcessor

from mmw.inductor import inductor_options
from mmw.watermark import prf
from mmw.watermark.randomness import FixedKey, RandomnessSource
from mmw.watermark.samplers import build_sampler
from mmw.watermark.samplers.base import Plain, numba_cuda, softmax_law
from mmw.watermark.scheme import SchemeSpec


def entropies(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shannon entropy (nats) and spike entropy (modulus 1, the paper's appendix) of softmax(logits) at T = 1.

    logits: float [B, V] -> (float64 [B], float64 [B])."""
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    p = logp.exp()
    return -(p * logp).nan_to_num().sum(-1), (p / (1.0 + p)).sum(-1)


def row_state(spec: SchemeSpec | None, row_seeds: Sequence[int]) -> dict[str, torch.Tensor]:
    """Per-row constants derived from the row seeds (CPU int64 [B] each): the plain-sampling and skip PRF bases
    and the fixed-key shift (zeros for text-dependent randomness)."""
    seeds = [int(s) & prf.MASK64 for s in row_seeds]
    shifts = np.zeros(len(seeds), dtype=np.int64)
    if spec is not None and spec.randomness == "fixed":
        shifts = RandomnessSource.from_spec(spec).shifts_for_rows(seeds)
    return {"sample_base": torch.tensor([prf.to_signed(prf.prf_int(s, prf.SAMPLE)) for s in seeds], dtype=torch.int64),
            "skip_base": torch.tensor([prf.to_signed(prf.prf_int(s, prf.SKIP)) for s in seeds], dtype=torch.int64),
            "shift": torch.from_numpy(shifts)}


class WatermarkStep:
    """One decoding step of scheme ``spec`` (None = plain sampling) for a batch of independent rows.

    Call with ``scores`` float [B, V'] (raw logits, V' >= vocab_size; columns past vocab_size are never chosen),
    ``context`` int64 [B, context_len] (each row's last tokens, prompt included), ``steps`` int64 [B] (index of
    the token being generated in each row), ``shift``/``sample_base``/``skip_base`` int64 [B] (``row_state``).
    Returns (chosen int64 [B], entropy float64 [B], spike entropy float64 [B]). Build through ``watermark_step``
    so the compiled kernels are shared by every batch."""

    def __init__(self, spec: SchemeSpec | None, key: int | None, vocab_size: int, temperature: float,
                 compiled: bool, mode: str | None = None, dynamic: bool | None = None):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.spec, self.vocab_size, self.temperature = spec, vocab_size, float(temperature)
        self.plain = Plain(spec, 0, vocab_size)
        if spec is None:
            self.sampler, self.source, self.key = self.plain, None, 0
        else:
            self.sampler = build_sampler(spec, key, vocab_size)
            self.source = RandomnessSource.from_spec(spec)
            self.key = key
        self.context_len = self.source.context if self.source is not None else 0
        #: Seeds a row remembers for the sampler's repeated-context mask (0: the sampler has none).
        self.history_size = self.sampler.history_size(spec) if spec is not None else 0
        self._slots: torch.Tensor | None = None
        fixed = isinstance(self.source, FixedKey)
        self._key_seq = torch.from_numpy(self.source.key_sequence(key).view(np.int64)) if fixed else None
        self._device: torch.device | None = None
        self._fused_softmax = False
        self.compile_error: str | None = None
        self.mode: str | None = None
        # dynamic=None: the first batch shape compiles static kernels, a second shape recompiles them with a
        # symbolic batch size once (vLLM's batch changes every step). dynamic=False (transformers: one batch shape
        # per generate call): never symbolic. Under dynamic=None a second key seen by the same code (the
        # configurations of a pack's one decode, called in turn every step) makes the key a symbolic int, and
        # Inductor's Triton code for the key's 64-bit mixing failed to compile on an H100 (torch 2.11), sending
        # those steps to eager.
        self._run = self._step
        if compiled:
            # Dynamo keys its cache on the code object, which every WatermarkStep shares: each configuration
            # (and batch-shape class) is one more entry. The default limit of 8 would silently drop a sweep or
            # the bench to eager after a few schemes.
            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, 256)
            config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4096)
            # reduce-overhead = CUDA graphs: one replay instead of ~15 kernel launches and Inductor's wrapper, the
            # host time that dominates a step at small batches (bench/RESULTS.md, "processor overhead").
            self.mode = mode or "reduce-overhead"  # params engine.compile_mode
            self._run = torch.compile(self._step, dynamic=dynamic, options=inductor_options(self.mode))

    #: Whether a CUDA step computes its law and entropies with ``softmax_law`` (where numba sees the device); a
    #: bench turns it off on a step before its first call to time torch's code instead.
    fused_softmax = True

    def _prepare(self, device: torch.device) -> None:
        """Device constants built outside the traced function (the compiled graph only reads them)."""
        if self._device != device:
            self.sampler.prepare(device)
            self.plain.prepare(device)
            if self._key_seq is not None:
                self._key_seq = self._key_seq.to(device)
            self._slots = torch.arange(max(self.history_size, 1), dtype=torch.int64, device=device)
            self._fused_softmax = self.fused_softmax and device.type == "cuda" and numba_cuda()
            self._device = device

    def seeds(self, context: torch.Tensor, steps: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """int64 [B] seeds r_n of the tokens being generated (uint64 bits), as the detector recomputes them; int64
        [B, V], every candidate's own seed, for a per-candidate source (the detector recomputes the chosen one's)."""
        if self.source.per_candidate:
            return self.source.candidate_seeds_t(context, self.key, self.sampler.token_ids(context.device))
        if self._key_seq is not None:
            return self._key_seq[(shift + steps) % self._key_seq.shape[0]]
        return self.source.seeds_t(context, self.key, 0, shift)

    def _law(self, logits: torch.Tensor, seeds: torch.Tensor | None
             ) -> tuple[torch.Tensor | None, torch.Tensor, dict]:
        """The model's law at the step's temperature where the sampler takes it (float64 [B, V], else None), the
        entropies at T = 1 stacked float64 [2, B], and what else the sampler's ``choose`` takes from the pass that
        wrote the law (``Sampler.binned_law``; {} where none): on a CUDA device with numba's support, for a sampler
        that takes the law, all from ``softmax_law``'s passes; elsewhere torch's code. (For the entropies alone, at
        T = 0 or for a sampler that draws from other logits, Inductor's fused reductions were as fast as the kernels:
        0.409 against 0.440 ms at 296 x 128,256 on one H100, bench/gpu_softmax.py.)"""
        if self._fused_softmax and self.temperature > 0 and self.sampler.takes_law and logits.dtype == torch.float32:
            binned = None if seeds is None else self.sampler.binned_law(logits, self.temperature, seeds)
            return binned if binned is not None else (*softmax_law(logits, self.temperature), {})
        return None, torch.stack(entropies(logits)), {}

    def _step(self, scores, context, steps, shift, sample_base, skip_base, history=None):
        logits = scores[:, : self.vocab_size]
        seeds = self.seeds(context, steps, shift) if self.source is not None else None
        probs, stats, first = self._law(logits, seeds)
        plain_u = prf.unit_t(prf.prf_t(sample_base, steps))
        if self.source is None:
            chosen = self.plain.choose(logits, None, self.temperature, plain_u, probs=probs)
            return chosen, stats, chosen
        seen = None
        if history is not None:
            # Repeated context: this seed was already used at an earlier step of the row (slot k of the ring holds
            # step k mod H's seed; slots not yet written are ignored), so the token is sampled plainly.
            seen = ((history == seeds.unsqueeze(-1)) & (self._slots.unsqueeze(0) < steps.unsqueeze(-1))).any(-1)
        law = {"probs": probs, **first} if probs is not None else {}
        if seen is not None and hasattr(self.sampler, "choose_or_plain"):
            # The sampler draws those rows plainly itself, from the same scan (the tournament: one scan, not two).
            chosen, seen = self.sampler.choose_or_plain(logits, seeds, self.temperature, plain_u, seen, **law), None
        else:
            chosen = self.sampler.choose(logits, seeds, self.temperature, plain_u, **law)
        if self.spec.skip_prob > 0:
            # Both branches are computed for every row: choosing per row on the host would sync every step.
            skip = prf.unit_t(prf.prf_t(skip_base, steps)) < self.spec.skip_prob
            chosen = torch.where(skip, self.plain.choose(logits, None, self.temperature, plain_u, probs=probs), chosen)
        if seen is not None:
            chosen = torch.where(seen, self.plain.choose(logits, None, self.temperature, plain_u, probs=probs), chosen)
        return chosen, stats, seeds

    def __call__(self, scores: torch.Tensor, context: torch.Tensor, steps: torch.Tensor, shift: torch.Tensor,
                 sample_base: torch.Tensor, skip_base: torch.Tensor,
                 history: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``history``: int64 [B, history_size], the row's seeds of earlier steps (``new_history``), for samplers
        that mask repeated contexts; this step's seed is written into it (outside the compiled graph)."""
        self._prepare(scores.device)
        if self._run is not self._step:
            try:
                chosen, stats, seeds = self._run(scores, context, steps, shift, sample_base, skip_base, history)
                # A CUDA-graph replay reuses its output buffers: the kept statistics are copied out (one launch);
                # ``chosen`` and ``seeds`` are consumed before the next step.
                stats = stats.clone()
                self._remember(history, steps, seeds)
                return chosen, stats[0], stats[1]
            except Exception as err:  # a compiler bug must not cost a run: eager computes the same function
                self.compile_error = f"{type(err).__name__}: {err}"
                warnings.warn(f"torch.compile of the watermark step failed ({self.compile_error[:2000]}); "
                              "running it eager (slower)")
                self._run = self._step
        chosen, stats, seeds = self._step(scores, context, steps, shift, sample_base, skip_base, history)
        self._remember(history, steps, seeds)
        return chosen, stats[0], stats[1]

    def new_history(self, batch: int, device: torch.device | str) -> torch.Tensor | None:
        """An empty seed history for ``batch`` rows (None when the sampler masks no repeated context)."""
        if not self.history_size:
            return None
        return torch.zeros(batch, self.history_size, dtype=torch.int64, device=device)

    def _remember(self, history: torch.Tensor | None, steps: torch.Tensor, seeds: torch.Tensor) -> None:
        if history is not None:
            history.scatter_(1, (steps % self.history_size).unsqueeze(-1), seeds.unsqueeze(-1))

    @property
    def is_compiled(self) -> bool:
        return self._run is not self._step


def compile_default(device: torch.device | str) -> bool:
    """Compile on CUDA (CPU steps are cheap next to a CPU model step; compiling would cost a C++ toolchain and
    seconds per shape); params ``engine.compile_step: false`` passes ``compiled=False`` instead."""
    return torch.device(device).type == "cuda"


@lru_cache(maxsize=64)  # a pack decodes up to model.batch_size // prompts configurations at once
def watermark_step(spec: SchemeSpec | None, key: int | None, vocab_size: int, temperature: float,
                   compiled: bool, mode: str | None = None, dynamic: bool | None = None) -> WatermarkStep:
    """The shared ``WatermarkStep`` of a configuration (one compilation per configuration and process)."""
    return WatermarkStep(spec, key, vocab_size, temperature, compiled, mode, dynamic)


def choice_logits(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """-inf everywhere except 0 at each row's chosen column. scores float [B, V'], chosen int64 [B]."""
    return torch.full_like(scores, float("-inf")).scatter_(1, chosen.unsqueeze(-1), 0.0)


class RecordingLogitsProcessor(LogitsProcessor):
    """A logits processor that records, per step and row, the entropy and the spike entropy of the model's own
    next-token distribution (float64 [B] each, on the device) and gives their per-row means over each row's
    generated tokens: the recording every engine reads, shared by mmw's processor and a plugin's."""

    def __init__(self) -> None:
        self.entropy: list[torch.Tensor] = []
        self.spike_entropy: list[torch.Tensor] = []

    def _steps_table(self, which: int) -> np.ndarray | None:
        """The recorded values as float64 [B, steps] (``which`` 0: entropy, 1: spike entropy), or None when no
        step was recorded. One device->host copy."""
        per_step = (self.entropy, self.spike_entropy)[which]
        return torch.stack(per_step, dim=1).cpu().numpy() if per_step else None

    def _mean_over(self, which: int, lengths: Sequence[int]) -> np.ndarray:
        table = self._steps_table(which)
        if table is None:
            return np.full(len(lengths), np.nan)
        return np.array([table[i, :n].mean() if n > 0 else np.nan for i, n in enumerate(lengths)])

    def mean_entropy(self, lengths: Sequence[int]) -> np.ndarray:
        """Mean Shannon entropy (nats) over each row's first ``lengths[i]`` generated tokens."""
        return self._mean_over(0, lengths)

    def mean_spike_entropy(self, lengths: Sequence[int]) -> np.ndarray:
        """Mean spike entropy over each row's first ``lengths[i]`` generated tokens."""
        return self._mean_over(1, lengths)


class WatermarkProcessor(RecordingLogitsProcessor):
    """spec None -> unwatermarked (plain) sampling. row_seeds: one 64-bit seed per batch row.

    Also records, per step and row, the entropy and the spike entropy of the model's own next-token
    distribution at temperature 1 — on the device, copied to the host once when asked for the means.
    ``compiled`` None: compile on CUDA (``compile_default``); ``compile_mode``: torch.compile's mode (params
    ``engine.compile_mode``; None: reduce-overhead)."""

    def __init__(self, spec: SchemeSpec | None, key: int | None, vocab_size: int, row_seeds: Sequence[int],
                 temperature: float, compiled: bool | None = None, compile_mode: str | None = None):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        super().__init__()
        self.spec, self.key, self.vocab_size, self.temperature = spec, key, vocab_size, float(temperature)
        self.row_seeds = [int(s) & prf.MASK64 for s in row_seeds]
        self.compiled, self.compile_mode = compiled, compile_mode
        #: Trailing tokens of each row the randomness reads (0 unwatermarked): the engine's loop needs prompts at
        #: least this long (mmw.engines.generate.use_static_decode).
        self.window_context = RandomnessSource.from_spec(spec).context if spec is not None else 0
        self._state = row_state(spec, self.row_seeds)
        self._step: WatermarkStep | None = None
        self._history: torch.Tensor | None = None
        self._steps: torch.Tensor | None = None
        self.step = 0
        self._tables: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: int64 [B, S] (prompt + generated so far); scores: float [B, V'] raw logits."""
        b = scores.shape[0]
        if b != len(self.row_seeds):
            raise ValueError(f"batch has {b} rows but the processor was built for {len(self.row_seeds)}")
        device = scores.device
        if self._step is None:
            compiled = compile_default(device) if self.compiled is None else self.compiled
            self._step = watermark_step(self.spec, self.key, self.vocab_size, self.temperature, compiled,
                                        self.compile_mode, dynamic=False)
            self._state = {name: t.to(device) for name, t in self._state.items()}
            self._steps = torch.zeros(b, dtype=torch.int64, device=device)
            self._history = self._step.new_history(b, device)
        n = self._step.context_len
        # Contiguous: a view into the growing input_ids has a new stride every step, and each new stride would
        # cost a recompilation or a CUDA-graph recording.
        context = input_ids[:, input_ids.shape[1] - n:].contiguous() if n else input_ids.new_zeros(b, 0)
        chosen, entropy, spike = self._step(scores, context, self._steps, **self._state, history=self._history)
        self.entropy.append(entropy)
        self.spike_entropy.append(spike)
        self._steps += 1
        self.step += 1
        return choice_logits(scores, chosen)

    # ------------------------------------------------------------------ static decoding (mmw.engines.graph_decode)
    def begin_static(self, batch: int, steps: int, device: torch.device, graph: bool = False) -> None:
        """Prepare ``static_step`` for ``batch`` rows and up to ``steps`` tokens: every per-step record goes into a
        pre-allocated [B, steps] table, so the step can be recorded in a CUDA graph. ``graph``: the compiled
        watermark step is built without its own CUDA graphs (Inductor's plain kernels), which an outer capture
        records; the function is the same."""
        if batch != len(self.row_seeds):
            raise ValueError(f"batch has {batch} rows but the processor was built for {len(self.row_seeds)}")
        compiled = compile_default(device) if self.compiled is None else self.compiled
        mode = "default" if compiled and graph else self.compile_mode
        self._step = watermark_step(self.spec, self.key, self.vocab_size, self.temperature, compiled, mode,
                                    dynamic=False)
        self._state = {name: t.to(device) for name, t in self._state.items()}
        self._steps = torch.zeros(batch, dtype=torch.int64, device=device)
        self._history = self._step.new_history(batch, device)
        self._tables = torch.full((2, batch, steps), float("nan"), dtype=torch.float64, device=device)
        self._table_steps = 0

    def static_step(self, context: torch.Tensor, scores: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """One step on fixed buffers: context int64 [B, window_context], scores float [B, V'], t int64 [1] (the
        step's column in the tables) -> chosen int64 [B]. Device work only, no host synchronisation."""
        self._step._prepare(scores.device)
        chosen, entropy, spike = self._step(scores, context, self._steps, **self._state, history=self._history)
        self._tables.index_copy_(2, t, torch.stack([entropy, spike]).unsqueeze(-1))
        self._steps += 1
        return chosen

    def end_static(self, steps: int) -> None:
        """``steps`` tokens were chosen through ``static_step``."""
        self._table_steps = steps
        self.step += steps

    def _steps_table(self, which: int) -> np.ndarray | None:
        if self._tables is not None:  # static decoding wrote its records into one pre-allocated table
            return self._tables[which, :, : self._table_steps].cpu().numpy()
        return super()._steps_table(which)
