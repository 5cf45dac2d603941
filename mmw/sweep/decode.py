"""One decode for several configurations: the watermarked generations of the configurations of a sweep pack.

The configurations of a pack share the prompts, the generator, its temperature, the seed and the length cap; they
differ only in the scheme and the key. Decoding them one after the other pays the decode's floor once per
configuration: a decoding step costs about the same for 12 rows as for 296 on a GPU (memory-bound), so a race's
small shards pay 1,024 full steps per configuration for a handful of rows (bench/RESULTS.md, "the decode floor").
:func:`generate_together` instead stacks the configurations' rows into one batch — each row keeps its own
processor (its configuration's scheme and key, its own per-row seed), so a row's token choices are those of its
configuration — and decodes up to ``decode_rows`` rows in one ``generate`` call.

What changes against one configuration at a time: only which rows share a forward pass. Every configuration's
batches are planned exactly as :func:`mmw.engines.generate.generate` plans them (same members, same left
padding, since the stacked copies are the same prompts); a row's logits can still differ in the last bits where
the model's kernels are not batch-invariant (a GEMM picks its blocking by the number of rows), and a sampled
token then flips only where two candidates were within that rounding. tests/test_shared_decode.py measures
identity on the CPU; bench/gpu_pack.py writes each configuration's evidence rows for a GPU comparison.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mmw.engines.generate import GENERATION_SCHEMA, ProcessorFactory, RecordingProcessor, generate_batch, row_seed
from mmw.io import plan_units
from mmw.params import EngineParams


class StackedProcessor:
    """The processors of several row groups as one: ``parts[j]`` owns rows ``[offsets[j], offsets[j + 1])`` of
    the stacked batch. Each part sees only its rows (its own input ids and logits, in its own row order), so its
    state — step counter, per-row seeds, recorded entropies — is what it would be in a batch of its own."""

    def __init__(self, parts: Sequence[RecordingProcessor], sizes: Sequence[int]):
        if len(parts) != len(sizes) or not parts:
            raise ValueError("expected one row count per processor, and at least one processor")
        self.parts = list(parts)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids int64 [B, S], scores float [B, V'] with B = sum(sizes) -> float [B, V'] (each part's rows as
        that part returns them: -inf except the chosen token)."""
        if scores.shape[0] != self.offsets[-1]:
            raise ValueError(f"batch has {scores.shape[0]} rows but the parts own {self.offsets[-1]}")
        # Each part gets tensors of its own (not views into the stacked batch), as a decode of its own gives it.
        return torch.cat([part(input_ids[lo:hi].clone(), scores[lo:hi].clone())
                          for part, lo, hi in zip(self.parts, self.offsets, self.offsets[1:], strict=False)])

    def _split(self, lengths: Sequence[int], method: str) -> np.ndarray:
        return np.concatenate([getattr(part, method)(lengths[lo:hi])
                               for part, lo, hi in zip(self.parts, self.offsets, self.offsets[1:], strict=False)])

    def mean_entropy(self, lengths: Sequence[int]) -> np.ndarray:
        return self._split(lengths, "mean_entropy")

    def mean_spike_entropy(self, lengths: Sequence[int]) -> np.ndarray:
        return self._split(lengths, "mean_spike_entropy")


def generate_together(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    chats: Sequence[str],
    factories: Sequence[ProcessorFactory],
    max_new_tokens: int,
    batch_size: int,
    decode_rows: int,
    *,
    prompt_ids: Sequence[str],
    seed: int = 0,
    settings: EngineParams | None = None,
) -> list[pl.DataFrame]:
    """The generations of every chat under each of ``factories`` (one per configuration), as
    :func:`mmw.engines.generate.generate` would return them for that factory alone: one table per factory, rows in
    input order, columns of ``GENERATION_SCHEMA``.

    Each configuration's batches are planned as ``generate`` plans them (longest first, ``batch_size`` rows); a
    decode stacks the same batch of ``decode_rows // (rows of the largest batch)`` configurations (at least one),
    so no ``generate`` call holds more rows than ``max(decode_rows, batch_size)``. Nothing is stored on the way: the
    caller (a pack) keeps its finished configurations, and a killed decode is redone whole.
    """
    if batch_size < 1:
        raise ValueError(f"model.batch_size: expected an integer >= 1, got {batch_size!r}")
    if decode_rows < 1:
        raise ValueError(f"decode_rows: expected an integer >= 1, got {decode_rows!r}")
    ids = list(prompt_ids)
    if len(ids) != len(chats) or len(set(ids)) != len(ids):
        raise ValueError("prompt_ids: expected one distinct id per chat")
    encoded = tokenizer(list(chats), add_special_tokens=False, return_attention_mask=False)["input_ids"] \
        if chats else []
    batches = plan_units(sorted(range(len(chats)), key=lambda i: (-len(encoded[i]), i)), batch_size)
    parts: list[list[pl.DataFrame]] = [[] for _ in factories]
    # Configurations outer, batches inner: a configuration's compiled watermark step (cached per configuration,
    # mmw.watermark.processor.watermark_step) is used for all its batches before the next group's are built.
    per_decode = max(1, decode_rows // len(batches[0])) if batches else 1
    for start in range(0, len(factories), per_decode):
        group = range(start, min(start + per_decode, len(factories)))
        for rows in batches:
            seeds = [row_seed(seed, ids[i]) for i in rows]
            processor = StackedProcessor([factories[c](seeds) for c in group], [len(rows)] * len(group))
            columns = generate_batch(model, tokenizer, [encoded[i] for i in rows] * len(group), processor,
                                     max_new_tokens, settings)
            for j, c in enumerate(group):
                lo, hi = j * len(rows), (j + 1) * len(rows)
                parts[c].append(pl.DataFrame({"prompt_id": [ids[i] for i in rows],
                                              **{name: values[lo:hi] for name, values in columns.items()}},
                                             schema=GENERATION_SCHEMA))
    order = pl.DataFrame({"prompt_id": ids})
    return [order.join(pl.concat(tables), on="prompt_id", how="left", maintain_order="left")
            .select(list(GENERATION_SCHEMA)) if tables else pl.DataFrame(schema=GENERATION_SCHEMA)
            for tables in parts]
