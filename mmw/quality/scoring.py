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
                batch_size: int, pad_multiple: int | None = None, queued: bool | None = None) -> Scores:
    """Score ``texts[i]`` as the reply to ``prompts[i]`` on its first ``max_tokens`` tokens.

    ``pad_multiple``: batch widths are rounded up to a multiple of it and rows are batched longest first (default:
    ``CUDA_PAD_MULTIPLE`` on CUDA, none elsewhere). Either way the scores come back in the order of ``texts``.
    ``queued``: the widened batches through :func:`_score_queued` (default: on CUDA), the same numbers as the
    per-row loop, which a CPU keeps (its results stay the bits they always were)."""
    if len(prompts) != len(texts):
        raise ValueError(f"prompts and texts differ in length ({len(prompts)} vs {len(texts)})")
    if not texts:
        return Scores(np.full(0, np.nan), np.zeros((0, int(model.config.hidden_size)), dtype=np.float32))
    # One call per list, not per text: the same ids (a fast tokenizer encodes a list item by item), without
    # transformers' per-call overhead 2 x 592 times.
    heads = tokenizer(render_chat(tokenizer, prompts), add_special_tokens=False)["input_ids"]
    replies = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    rows = [(head_ids, reply_ids[:max_tokens]) for head_ids, reply_ids in zip(heads, replies, strict=True)]
    device = next(model.parameters()).device
    if pad_multiple is None and device.type == "cuda":
        pad_multiple = CUDA_PAD_MULTIPLE
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]) - len(rows[i][1])) if pad_multiple \
        else list(range(len(rows)))
    hidden = int(model.config.hidden_size)
    perplexity = np.full(len(rows), np.nan)
    features = np.zeros((len(rows), hidden), dtype=np.float32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if pad_multiple and (device.type == "cuda" if queued is None else queued):
        _score_queued(model, rows, order, batch_size, pad_multiple, pad, device, perplexity, features)
        return Scores(perplexity, features)
    for start in range(0, len(rows), batch_size):
        members = order[start:start + batch_size]
        batch = [rows[i] for i in members]
        width = max(len(h) + len(r) for h, r in batch)
        if pad_multiple:
            width = -(-width // pad_multiple) * pad_multiple
        ids, mask, reply = _batch_tensors(batch, width, pad)
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


def _batch_tensors(batch: Sequence[tuple[list[int], list[int]]], width: int, pad: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, width) token ids, attention mask and reply positions of ``batch`` (Right padding: positions, and so
    rotary phases, match an unpadded forward pass.)"""
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    reply = torch.zeros((len(batch), width), dtype=torch.bool)  # positions holding reply tokens
    for i, (head_ids, reply_ids) in enumerate(batch):
        sequence = head_ids + reply_ids
        ids[i, :len(sequence)] = torch.tensor(sequence)
        mask[i, :len(sequence)] = 1
        reply[i, len(head_ids):len(sequence)] = True
    return ids, mask, reply


def _score_queued(model, rows: list[tuple[list[int], list[int]]], order: list[int], batch_size: int,
                   pad_multiple: int, pad: int, device: torch.device, perplexity: np.ndarray,
                   features: np.ndarray) -> None:
    """The loop of :func:`score_texts` on CUDA (it runs on any device: tests run it on the CPU), the same numbers as
    the per-row loop, with nothing waiting for the device until every batch is queued: the per-row loop read each
    row's numbers back (five waits a row) while the device sat idle.

    - The same forward (its attention mask too), without a key/value cache (it would only copy the keys and values).
    - Logits from the batch's shortest prompt on (``logits_to_keep``), log-softmax only at the positions that
      predict a reply token, picked with index tensors made on the host (a boolean mask reads back a count).
    - Each row's reply tokens are one contiguous run, so its mean log-probability and mean last hidden state are
      means over slices: the same elements in the same order as the per-row path's.
    - Each batch's numbers are copied to page-locked memory as they are computed; read once, at the end."""
    pending = []
    cuda = device.type == "cuda"
    for start in range(0, len(rows), batch_size):
        members = order[start:start + batch_size]
        batch = [rows[i] for i in members]
        width = -(-max(len(h) + len(r) for h, r in batch) // pad_multiple) * pad_multiple
        ids, mask, reply = _batch_tensors(batch, width, pad)
        first = max(min(len(h) for h, _ in batch) - 1, 0)  # no reply token is predicted before this position
        row_of, position = reply[:, 1:].nonzero(as_tuple=True)  # token t+1 is predicted at position t, row-major
        ids_d, mask_d, row_of_d, position_d = (t.pin_memory().to(device, non_blocking=True) if cuda else t
                                               for t in (ids, mask, row_of, position))
        out = model(input_ids=ids_d, attention_mask=mask_d, output_hidden_states=True, use_cache=False,
                    logits_to_keep=width - first)  # logits of positions first .. width - 1
        logprobs = torch.log_softmax(out.logits[row_of_d, position_d - first].float(), dim=-1)
        token_lp = logprobs.gather(-1, ids_d[row_of_d, position_d + 1].unsqueeze(-1)).squeeze(-1)
        last = out.hidden_states[-1].float()
        del out, logprobs
        kept, means, states, offset = [], [], [], 0
        for i, (head_ids, reply_ids) in enumerate(batch):
            if reply_ids:
                kept.append(members[i])
                means.append(token_lp[offset:offset + len(reply_ids)].mean())
                states.append(last[i, len(head_ids):len(head_ids) + len(reply_ids)].mean(dim=0))
                offset += len(reply_ids)
        if kept:
            pending.append((kept, torch.exp(-torch.stack(means)).to("cpu", non_blocking=cuda),
                            torch.stack(states).to("cpu", non_blocking=cuda)))
    if cuda:
        torch.cuda.synchronize(device)
    for kept, batch_perplexity, batch_features in pending:
        perplexity[kept] = batch_perplexity.numpy()
        features[kept] = batch_features.numpy()
