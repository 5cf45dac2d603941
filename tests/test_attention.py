"""mmw.engines.attention: grouped-query SDPA under a padding mask (the GPU generation speed-up) is the same
attention, is switched on only for CUDA models, and is always switched back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations import sdpa_attention

from mmw.engines.attention import grouped_query_sdpa

CUDA_LIKE = SimpleNamespace(device=torch.device("cuda"))  # the context only reads ``model.device``


def tiny_gqa_model() -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=97, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding, as batched generation makes it
    mask[1, :2] = 0
    return ids, mask


def test_the_switch_is_on_only_inside_the_block_and_only_for_cuda_models() -> None:
    original = sdpa_attention.use_gqa_in_sdpa
    key = torch.zeros(1, 2, 4, 16)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert original(mask, key, key) is False  # transformers' rule: no GQA kernel when there is a mask
    with grouped_query_sdpa(SimpleNamespace(device=torch.device("cpu"))):
        assert sdpa_attention.use_gqa_in_sdpa is original
    with grouped_query_sdpa(CUDA_LIKE):
        assert sdpa_attention.use_gqa_in_sdpa(mask, key, key) is True
        assert sdpa_attention.use_gqa_in_sdpa(mask, torch.zeros(1, 2, 4, 512), torch.zeros(1, 2, 4, 512)) is False
    assert sdpa_attention.use_gqa_in_sdpa is original
    with pytest.raises(RuntimeError), grouped_query_sdpa(CUDA_LIKE):
        raise RuntimeError("a failed generate")
    assert sdpa_attention.use_gqa_in_sdpa is original


def test_grouped_query_attention_under_a_mask_gives_the_same_logits() -> None:
    model = tiny_gqa_model()
    ids, mask = padded_batch()
    calls: list[bool] = []
    original = sdpa_attention.use_gqa_in_sdpa


    with torch.inference_mode():
        repeated = model(input_ids=ids, attention_mask=mask).logits
        with grouped_query_sdpa(CUDA_LIKE):
            switched = sdpa_attention.use_gqa_in_sdpa
            sdpa_attention.use_gqa_in_sdpa = lambda *a: calls.append(switched(*a)) or switched(*a)
            grouped = model(input_ids=ids, attention_mask=mask).logits
    assert sdpa_attention.use_gqa_in_sdpa is original
    assert calls and all(calls), "the masked forward pass did not take the grouped-query path"
    valid = mask.bool()
    torch.testing.assert_close(grouped[valid], repeated[valid], rtol=1e-5, atol=1e-5)
