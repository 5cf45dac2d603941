"""The generator's tokenizer and vocabulary, shared by the stages that tokenize (the wall-time record is
``mmw.stages.timing``: stages that load no model import only that)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmw.params import ModelParams

if TYPE_CHECKING:  # transformers is imported by the stages that load a model, not by every command
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase


def generator_vocab_size(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel | PretrainedConfig) -> int:
    """Token ids the watermark ranges over: model output rows the tokenizer can also produce (``model``: the
    model or its config).

    Generation (processor) and detection (detector) must agree on it, so both stages call this.
    Models often pad their output layer beyond the tokenizer; ids past ``len(tokenizer)`` are never text.
    """
    return min(len(tokenizer), int(getattr(model, "config", model).vocab_size))


def load_generator_vocabulary(model: ModelParams) -> tuple[PreTrainedTokenizerBase, int]:
    """The generator's tokenizer and :func:`generator_vocab_size`, from its tokenizer and config (no weights)."""
    from mmw.engines.models import load_tokenizer

    tokenizer, config = load_tokenizer(model.name)
    return tokenizer, generator_vocab_size(tokenizer, config)
