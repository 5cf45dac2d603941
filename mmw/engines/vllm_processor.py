"""mmw's watermark as a vLLM V1 logits processor (``vllm.v1.sample.logits_processor.LogitsProcessor``).

vLLM builds one instance per engine and keeps a persistent batch whose rows come and go (continuous batching),
move, and are re-added after preemption. All watermark state of a row is derived from what vLLM hands over when
the row is added — its ``SamplingParams`` (``seed`` = the row seed, ``extra_args["mmw"]`` = the scheme) and live
references to its prompt and output token lists — so a row's tokens depend only on its own seed, prompt and
output so far: not on its batch neighbours, its position, or whether it was preempted and recomputed. With
``n > 1`` vLLM gives child *i* the seed ``seed + i``, so siblings draw distinct randomness.

The watermark key is never part of a request (requests can be logged): the engine puts it in the environment
variable ``MMW_VLLM_KEY`` before the engine starts, and the processor reads it here.

A plugin's processor (``scheme.sampler: plugin``: a transformers ``LogitsProcessor``) runs here too: each row gets
the plugin's processor for a batch of one (its own seed), called every step with the row's prompt and output so far
and its logits, and the token is drawn from what it returns with the row's PRF uniform at the row's step
(:class:`mmw.watermark.plugin_generation.PluginProcessor`), as on the transformers engine. A processor that keeps state
across steps (SynthID's context history) starts afresh when vLLM re-adds a preempted row.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from mmw.watermark.plugin_generation import PluginProcessor
from mmw.watermark.processor import WatermarkStep, compile_default, row_state, watermark_step
from mmw.watermark.samplers.parts import DECLARED
from mmw.watermark.scheme import SchemeSpec

KEY_ENV = "MMW_VLLM_KEY"
#: The processors of this process (the engine reads entropies from them when vLLM runs in-process).
ACTIVE: weakref.WeakSet[WatermarkLogitsProcessor] = weakref.WeakSet()


def request_args(spec: SchemeSpec | None, vocab_size: int, temperature: float) -> dict[str, Any]:
    """``SamplingParams.extra_args`` that put a request under the watermark (spec None: plain sampling through
    the same PRF-driven sampler, the baseline)."""
    return {"mmw": {"scheme": spec.to_dict() if spec is not None else None, "vocab_size": int(vocab_size),
                    "temperature": float(temperature)}}


class _Row:
    """One request in the persistent batch: its configuration, seeds and live token lists."""

    __slots__ = ("config", "seed", "prompt", "output", "state", "plugin")

    def __init__(self, config: tuple, seed: int, prompt: list[int], output: list[int]):
        self.config, self.seed, self.prompt, self.output = config, seed, prompt, output
        spec, key, vocab_size, temperature = config
        self.plugin = None
        if spec is not None and spec.is_plugin:
            self.plugin = PluginProcessor(spec, key, vocab_size, [seed], temperature)
            self.state = []
        else:
            self.state = [int(t[0]) for t in row_state(spec, [seed]).values()]  # shift, sample_base, skip_base


class WatermarkLogitsProcessor(LogitsProcessor):
    """Chooses the next token of every mmw request (logits become -inf except at the choice); other requests'
    logits pass through untouched. vLLM's own sampling then returns the one finite logit whatever its settings;
    the watermark's temperature travels in ``extra_args``."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        self.device = torch.device(device)
        self.pin = bool(is_pin_memory)
        key = os.environ.get(KEY_ENV)
        self.key = int(key) if key else None
        self.rows: dict[int, _Row] = {}
        # (row seeds, steps, entropy [B] on device, spike entropy [B] on device), read once by ``take_entropies``.
        self.records: list[tuple[list[int], list[int], torch.Tensor, torch.Tensor]] = []
        ACTIVE.add(self)

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        args = (params.extra_args or {}).get("mmw")
        if args is None:
            return
        if params.seed is None:
            raise ValueError("mmw requests need SamplingParams.seed (the row seed)")

    def is_argmax_invariant(self) -> bool:
        return False

    def _config(self, args: dict[str, Any]) -> tuple:
        scheme = args["scheme"]
        spec = SchemeSpec(**scheme) if scheme is not None else None
        if spec is not None and self.key is None:
            raise RuntimeError(f"a watermarked request reached the vLLM engine but {KEY_ENV} is not set")
        if spec is not None and not spec.is_plugin and DECLARED[spec.sampler].history_size(spec):
            raise RuntimeError(f"sampler={spec.sampler} masks repeated contexts, and this engine keeps no per-request "
                               "seed history yet: use engine=transformers")
        return (spec, self.key if spec is not None else None, int(args["vocab_size"]), float(args["temperature"]))

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt, output in batch_update.added:
            args = (params.extra_args or {}).get("mmw") if params is not None else None
            if args is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = _Row(self._config(args), int(params.seed), prompt or [], output)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        indices = sorted(self.rows)
        rows = [self.rows[i] for i in indices]
        config = rows[0].config
        if any(row.config != config for row in rows):
            raise RuntimeError("mmw: requests with different watermark configurations share one vLLM batch")
        if rows[0].plugin is not None:
            return self._apply_plugin(logits, indices, rows)
        # No CUDA graphs here: vLLM's batch size changes every step, and each size would be one more recording.
        step: WatermarkStep = watermark_step(*config, compile_default(self.device), "default")
        n = step.context_len
        # One host->device copy per step: [B, context + 4] = context tail, step, shift, sample/skip bases.
        table = []
        for row in rows:
            tail = (row.prompt + row.output)[-n:] if n else []
            tail = [0] * (n - len(tail)) + tail  # fewer tokens than the window: zeros, as the detector never scores them
            table.append(tail + [len(row.output)] + row.state)
        host = torch.tensor(table, dtype=torch.int64, pin_memory=self.pin and self.device.type == "cuda")
        packed = host.to(self.device, non_blocking=True)
        every = indices == list(range(logits.shape[0]))
        scores = logits if every else logits[torch.tensor(indices, device=logits.device)]
        chosen, entropy, spike = step(scores, packed[:, :n], packed[:, n], packed[:, n + 1], packed[:, n + 2],
                                      packed[:, n + 3])
        self.records.append(([row.seed for row in rows], [len(row.output) for row in rows], entropy, spike))
        choice = torch.full_like(scores, float("-inf")).scatter_(1, chosen.unsqueeze(-1), 0.0)
        if every:
            return choice
        logits[torch.tensor(indices, device=logits.device)] = choice
        return logits

    def _apply_plugin(self, logits: torch.Tensor, indices: list[int], rows: list[_Row]) -> torch.Tensor:
        """Each plugin row's choice from its own processor (a batch of one: the rows' token histories differ in
        length, and a plugin may keep per-row state)."""
        entropy, spike = [], []
        for index, row in zip(indices, rows, strict=True):
            plugin = row.plugin
            plugin.steps = torch.tensor([len(row.output)], dtype=torch.int64, device=logits.device)  # the row's step
            ids = torch.tensor([row.prompt + row.output], dtype=torch.int64, device=logits.device)
            logits[index:index + 1] = plugin(ids, logits[index:index + 1].clone())
            entropy.append(plugin.entropy.pop())  # what the processor recorded of this step, kept with the batch's
            spike.append(plugin.spike_entropy.pop())
        self.records.append(([row.seed for row in rows], [len(row.output) for row in rows], torch.cat(entropy),
                             torch.cat(spike)))
        return logits

    def take_entropies(self) -> dict[tuple[int, int], tuple[float, float]]:
        """{(row seed, step): (entropy, spike entropy)} recorded since the last call (one device->host copy)."""
        if not self.records:
            return {}
        entropy = torch.cat([r[2] for r in self.records]).cpu().tolist()
        spike = torch.cat([r[3] for r in self.records]).cpu().tolist()
        keys = [(seed, step) for r in self.records for seed, step in zip(r[0], r[1], strict=True)]
        self.records = []
        return dict(zip(keys, zip(entropy, spike, strict=True), strict=True))
