"""The judge's last decoder layer computed only where its output is read.

The expected-mode forward keeps the logits of each row's last ``X`` positions (the row's last token and the grade
trie's inner nodes, ``logits_to_keep``); every other position's output of the last layer is dropped by the model's
head. Those positions still give the last layer its keys and values, which the kept queries read, but their queries,
the attention output's projection and the MLP are work whose result nobody reads: for Llama-3-8B about 96 % of one
layer's matrix products over ~1,100 positions a row, i.e. ~3 % of a judgement's.

:func:`last_layer_pruned` runs the last layer as: the input norm and the key / value projections (and the rotary
embedding of the keys) at every position; the query projection, attention, output projection, residuals and MLP at
the kept ``X`` positions only, the queries folded into their K/V head's group under the kept positions' mask
(:func:`mmw.engines.attention.extra_query_attention`, the same call the causal split makes for them). It is the same
function of the inputs as the layer (tests/test_judge.py compares it with the whole layer on every architecture
below); the matrix products run at other shapes, so the numbers differ from the whole layer's in the last bits.

Only for decoder layers whose forward was read and reproduced here (:data:`PRUNABLE`): pre-norm attention then MLP,
``q/k/v/o`` projections, optionally per-head ``q_norm`` / ``k_norm``, the rotary embedding of the layer's modeling
module. Another layer class runs whole (a layer of the same sub-modules may scale its residuals or run attention and
MLP in parallel, so the sub-modules' names are not enough)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from mmw.engines.attention import extra_query_attention

#: Decoder layer classes whose forward :func:`pruned_forward` reproduces (transformers 5.x): the same pre-norm
#: residual structure, attention through ``q/k/v/o_proj`` (Qwen3: per-head ``q_norm``/``k_norm`` before the rotary
#: embedding) and ``apply_rotary_pos_emb`` of their own modeling module.
PRUNABLE = frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"})


def last_layer(model: Any) -> torch.nn.Module | None:
    """``model``'s last decoder layer when :func:`pruned_forward` can run it (None otherwise)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return None
    layer = layers[-1]
    if type(layer).__name__ not in PRUNABLE or not hasattr(_modeling(layer), "apply_rotary_pos_emb"):
        return None
    return layer


def _modeling(layer: torch.nn.Module) -> Any:
    return sys.modules.get(type(layer.self_attn).__module__)


def pruned_forward(layer: torch.nn.Module, hidden_states: torch.Tensor, keep: int, attention_mask: torch.Tensor,
                   position_embeddings: tuple[torch.Tensor, torch.Tensor], past_key_values: Any = None
                   ) -> torch.Tensor:
    """``layer``'s output at the last ``keep`` positions of ``hidden_states`` [B, T, D] -> [B, keep, D].

    ``attention_mask`` [B, 1, keep, W]: the kept queries' additive mask over the keys (the cache's, then the T
    positions', widened to W); ``position_embeddings``: the model's (cos, sin), each [B, T, head_dim];
    ``past_key_values``: a cache whose ``update`` returns the keys and values to attend to (the judge's shared
    head), or None."""
    attention = layer.self_attn
    batch, positions = hidden_states.shape[:2]
    head_dim = attention.head_dim
    normed = layer.input_layernorm(hidden_states)
    query = attention.q_proj(normed[:, -keep:]).view(batch, keep, -1, head_dim)
    key = attention.k_proj(normed).view(batch, positions, -1, head_dim)
    value = attention.v_proj(normed).view(batch, positions, -1, head_dim).transpose(1, 2)
    if hasattr(attention, "q_norm"):
        query, key = attention.q_norm(query), attention.k_norm(key)
    query, key = query.transpose(1, 2), key.transpose(1, 2)
    rotary = _modeling(layer).apply_rotary_pos_emb
    cos, sin = position_embeddings
    query = rotary(query, query, cos[:, -keep:], sin[:, -keep:])[0]  # (the second copy is a few rows of waste)
    key = rotary(key, key, cos, sin)[0]
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, attention.layer_idx)
    out = extra_query_attention(query, key, value, attention_mask, attention.scaling)
    out = hidden_states[:, -keep:] + attention.o_proj(out.transpose(1, 2).reshape(batch, keep, -1))
    return out + layer.mlp(layer.post_attention_layernorm(out))


@contextlib.contextmanager
def last_layer_pruned(model: Any, keep: int, active: bool = True) -> Iterator[bool]:
    """While the block runs (and ``active``), ``model``'s last decoder layer, when :func:`last_layer` can run it,
    returns its output at the last ``keep`` positions only (:func:`pruned_forward`), eagerly, in place of its
    compiled or eager call; the model's forward must keep no more than ``keep`` positions' logits and hand the
    layer the kept queries' mask as its attention mask. Yields whether the layer is pruned."""
    layer = last_layer(model) if active else None
    if layer is None:
        yield False
        return

    def call(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, past_key_values: Any = None,
             **_: Any) -> torch.Tensor:
        return pruned_forward(layer, hidden_states, keep, attention_mask, position_embeddings, past_key_values)

    before = layer._compiled_call_impl  # nn.Module.__call__ runs this in place of the module when set
    layer._compiled_call_impl = call
    try:
        yield True
    finally:
        layer._compiled_call_impl = before
