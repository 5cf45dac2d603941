"""Perplexity of generations under a local scoring model, and the MAUVE features (its last hidden states), from
one forward pass per batch.

A text is scored as the assistant's reply to its prompt, both rendered with the scorer's chat template, so the
perplexity is that of the reply given the prompt (what the generator was asked), not of the reply alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mmw.tasks import render_chat

#: On CUDA a batch is widened to a multiple of this many positions and the rows are batched longest first: torch's
#: cuDNN attention builds an execution plan for every new sequence length (as in ``mmw.judge.judge.CUDA_PAD_MULTIPLE``),
#: and unsorted batches of texts of varied lengths each had a width of their own. Pads sit right of every row's
#: tokens, which the causal mask already hides from them, so each row's numbers are those of its own forward pass.
#: On a CPU extra positions are only extra work: there nothing is padded or reordered.
CUDA_PAD_MULTIPLE = 128


@dataclass(frozen=True)
class Scores:
    """``perplexity``: shape (n,), NaN for an empty reply; ``features``: shape (n, hidden), the mean of the last
    hidden layer over the reply's tokens (zeros for an empty reply)."""

    perplexity: np.ndarray
    features: np.ndarray


@torch.inference_mode()
def score_texts(tokenizer, model, prompts: Sequence[str], texts: Sequence[str], max_tokens: int,
                batch_size: int, pad_multiple: int | None = None) -> Scores:
    """Score ``texts[i]`` as the reply to ``prompts[i]`` on its first ``max_tokens`` tokens.

    ``pad_multiple``: batch widths are rounded up to a multiple of it and rows are batched longest first (default:
    ``CUDA_PAD_MULTIPLE`` on CUDA, none elsewhere). Either way the scores come back in the order of ``texts``."""
    heads = render_chat(tokenizer, prompts)
    rows: list[tuple[list[int], list[int]]] = []
    for head, text in zip(heads, texts, strict=True):
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        rows.append((head_ids, reply_ids))
    device = next(model.parameters()).device
    if pad_multiple is None and device.type == "cuda":
        pad_multiple = CUDA_PAD_MULTIPLE
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]) - len(rows[i][1])) if pad_multiple \
        else list(range(len(rows)))
    hidden = int(model.config.hidden_size)
    perplexity = np.full(len(rows), np.nan)
    features = np.zeros((len(rows), hidden), dtype=np.float32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(rows), batch_size):
        members = order[start:start + batch_size]
        batch = [rows[i] for i in members]
        width = max(len(h) + len(r) for h, r in batch)
        if pad_multiple:
            width = -(-width // pad_multiple) * pad_multiple
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        reply = torch.zeros((len(batch), width), dtype=torch.bool)  # positions holding reply tokens
        for i, (head_ids, reply_ids) in enumerate(batch):
            # Right padding: positions (and so rotary phases) match an unpadded forward pass.
            sequence = head_ids + reply_ids
            ids[i, :len(sequence)] = torch.tensor(sequence)
            mask[i, :len(sequence)] = 1
            reply[i, len(head_ids):len(sequence)] = True
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
        logprobs = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
        target = ids[:, 1:].to(device)
        token_lp = logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (batch, width - 1)
        scored = reply[:, 1:].to(device)  # token t+1 is predicted at position t
        last = out.hidden_states[-1].float()
        for i in range(len(batch)):
            n = int(scored[i].sum())
            if n == 0:
                continue
            perplexity[members[i]] = float(torch.exp(-token_lp[i][scored[i]].mean()))
            features[members[i]] = last[i][reply[i].to(device)].mean(dim=0).cpu().numpy()
    return Scores(perplexity, features)
