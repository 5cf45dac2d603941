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


@dataclass(frozen=True)
class Scores:
    """``perplexity``: shape (n,), NaN for an empty reply; ``features``: shape (n, hidden), the mean of the last
    hidden layer over the reply's tokens (zeros for an empty reply)."""

    perplexity: np.ndarray
    features: np.ndarray


@torch.inference_mode()
def score_texts(tokenizer, model, prompts: Sequence[str], texts: Sequence[str], max_tokens: int,
                batch_size: int) -> Scores:
    """Score ``texts[i]`` as the reply to ``prompts[i]`` on its first ``max_tokens`` tokens."""
    heads = render_chat(tokenizer, prompts)
    rows: list[tuple[list[int], list[int]]] = []
    for head, text in zip(heads, texts, strict=True):
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        reply_ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        rows.append((head_ids, reply_ids))
    device = next(model.parameters()).device
    hidden = int(model.config.hidden_size)
    perplexity = np.full(len(rows), np.nan)
    features = np.zeros((len(rows), hidden), dtype=np.float32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        width = max(len(h) + len(r) for h, r in batch)
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
            perplexity[start + i] = float(torch.exp(-token_lp[i][scored[i]].mean()))
            features[start + i] = last[i][reply[i].to(device)].mean(dim=0).cpu().numpy()
    return Scores(perplexity, features)
