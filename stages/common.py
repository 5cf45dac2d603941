"""The generator's tokenizer and vocabulary, shared by the stages that tokenize, and the generator as a model-aware
plugin detector sees it (the wall-time record is ``mmw.stages.timing``: stages that load no model import only that)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

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


class GeneratorModel:
    """The :class:`mmw.watermark.plugins.DetectionModel` of a transformers causal LM (the generator a model-aware
    plugin detector gets): next-token logits per position."""

    def __init__(self, model: Any, tokenizer: Any, vocab_size: int):
        self.model, self.tokenizer, self.vocab_size = model, tokenizer, vocab_size

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        import torch

        tokens = np.asarray(tokens, dtype=np.int64)
        if not len(tokens):
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        bos = self.tokenizer.bos_token_id
        ids = tokens if bos is None else np.concatenate([[bos], tokens])
        with torch.inference_mode():
            out = self.model(torch.as_tensor(ids[None], device=self.model.device)).logits[0, :, : self.vocab_size]
        out = out.float().cpu().numpy()
        if bos is not None:  # row n: given BOS + tokens[:n]
            return out[: len(tokens)]
        return np.vstack([np.zeros((1, self.vocab_size), dtype=np.float32), out[: len(tokens) - 1]])


@lru_cache(maxsize=2)
def generator_model(name: str, device: str, dtype: str) -> GeneratorModel:
    """The generator for model-aware detectors, loaded once a process (the baseline's audit keys reuse it)."""
    from mmw.engines.models import load_model

    tokenizer, model = load_model(name, device, dtype)
    return GeneratorModel(model.eval(), tokenizer, generator_vocab_size(tokenizer, model))
