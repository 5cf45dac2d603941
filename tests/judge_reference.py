"""The judge's single-pass forward without the shared head cache: every row's whole rating prompt and the grade
trie's inner nodes in one forward under a dense tree mask. The reference that :meth:`mmw.judge.Judge.node_logits`
must reproduce (``tests/test_judge.py``), and the "before" of ``bench/judge_forward.py``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmw.judge import Judge


@torch.inference_mode()
def single_pass_node_logits(judge: Judge, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """(batch, 1 + n_inner, vocab) logits after each left-padded row and each inner trie node, one forward."""
    batch = judge._pad(sequences)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    n_rows, context_len = ids.shape
    device = ids.device
    tree_tokens = judge._tree_tokens.to(device)
    n_tree = tree_tokens.shape[0]
    length = context_len + n_tree
    context_positions = (mask.cumsum(-1) - 1).clamp(min=0)
    positions = torch.cat([context_positions, context_positions[:, -1:] + judge._tree_depth.to(device)], 1)
    allowed = torch.zeros(length, length, dtype=torch.bool, device=device)
    allowed[:context_len, :context_len] = torch.ones(context_len, context_len, device=device).tril().bool()
    allowed[context_len:, :context_len] = True
    allowed[context_len:, context_len:] = judge._tree_ancestors.to(device)
    key_ok = torch.cat([mask.bool(), torch.ones(n_rows, n_tree, dtype=torch.bool, device=device)], 1)
    allowed = allowed[None, None] & key_ok[:, None, None, :]
    additive = torch.zeros(allowed.shape, dtype=judge.model.dtype, device=device)
    additive.masked_fill_(~allowed, torch.finfo(judge.model.dtype).min)
    return judge.model(
        input_ids=torch.cat([ids, tree_tokens.expand(n_rows, n_tree)], 1),
        attention_mask=additive,
        position_ids=positions,
        logits_to_keep=n_tree + 1,
        use_cache=False,
    ).logits
