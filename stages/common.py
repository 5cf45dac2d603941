"""Plumbing shared by the stage commands: the wall-time record and the generator's tokenizer/vocabulary."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mmw.io import TIMINGS_DIR, write_json
from mmw.params import ModelParams

if TYPE_CHECKING:  # transformers is imported by the stages that load a model, not by every command
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@contextmanager
def timed(stage: str) -> Iterator[dict[str, Any]]:
    """Time the body; on success write ``reports/timings/<stage>.json`` with ``wall_s`` and the yielded details.

    Nothing is written when the body raises, so a failed stage leaves no record that looks complete.
    """
    started = time.perf_counter()
    details: dict[str, Any] = {}
    yield details
    write_json({"stage": stage, "wall_s": round(time.perf_counter() - started, 3), **details},
               TIMINGS_DIR / f"{stage}.json")


def generator_vocab_size(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> int:
    """Token ids the watermark ranges over: model output rows the tokenizer can also produce.

    Generation (processor) and detection (detector) must agree on it, so both stages call this.
    Models often pad their output layer beyond the tokenizer; ids past ``len(tokenizer)`` are never text.
    """
    return min(len(tokenizer), int(model.config.vocab_size))


def load_generator_vocabulary(model: ModelParams) -> tuple[PreTrainedTokenizerBase, int]:
    """The generator's tokenizer and :func:`generator_vocab_size`, loaded on the CPU."""
    from mmw.engines.models import load_model

    tokenizer, weights = load_model(model.name, device="cpu", dtype="float32")
    return tokenizer, generator_vocab_size(tokenizer, weights)
