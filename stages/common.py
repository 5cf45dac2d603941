"""The generator's tokenizer and vocabulary, shared by the stages that tokenize (the wall-time record is
``mmw.stages.timing``: stages that load no model import only that)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmw.params import ModelParams

if TYPE_CHECKING:  # transformers is imported by the stages that load a model, not by every command
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
