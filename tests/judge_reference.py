"""The judge's forward without the shared head: every row's whole rating prompt and the grade trie's inner nodes in
one forward under the dense tree mask, as the judge computed every batch before the rating prompt's head was
shared (and still computes a batch with a row that does not begin with the head). The reference that
:meth:`mmw.judge.judge.Judge.node_logits` must reproduce (``tests/test_judge.py``; itself checked against brute force
there), and the "before" of ``bench/judge_forward.py``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmw.judge.judge import Judge


def single_pass_node_logits(judge: Judge, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """(batch, 1 + n_inner, vocab) logits after each left-padded row and each inner trie node, one forward."""
    # an empty head: no row is split, no cache; one dense tree mask over the rows' own widths
    head, judge._head = judge._head, ()
    layout = judge.round_attention, judge.split_attention
    judge.round_attention = judge.split_attention = False
    try:
        return judge.node_logits(sequences)
    finally:
        judge._head, (judge.round_attention, judge.split_attention) = head, layout
