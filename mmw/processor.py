"""WatermarkProcessor: applies any scheme to a batch during Hugging Face ``generate``.

The processor chooses every token itself and returns logits that are -inf except at the chosen token, so the
engine runs plain greedy decoding (``do_sample=False``) and no engine-side warper can interfere. All randomness
comes from the PRF keyed by per-row seeds, so a row's tokens do not depend on which other rows share its batch,
and the same key + seed give the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from mmw import prf
from mmw.randomness import FixedKey, RandomnessSource
from mmw.samplers import build_sampler
from mmw.samplers.base import Plain
from mmw.scheme import SchemeSpec


class WatermarkProcessor(LogitsProcessor):
    """spec None -> unwatermarked (plain) sampling. row_seeds: one 64-bit seed per batch row.

    Also records, per step and row, the entropy and the spike entropy (modulus 1, as in the paper's appendix)
    of the model's own next-token distribution at temperature 1."""

    def __init__(self, spec: SchemeSpec | None, key: int | None, vocab_size: int, row_seeds: Sequence[int],
                 temperature: float):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.spec = spec
        self.vocab_size = vocab_size
        self.temperature = float(temperature)
        self.row_seeds = [int(s) & prf.MASK64 for s in row_seeds]
        self.plain = Plain(spec, 0, vocab_size)
        if spec is None:
            self.sampler, self.source, self.key = self.plain, None, 0
        else:
            self.sampler = build_sampler(spec, key, vocab_size)
            self.source = RandomnessSource.from_spec(spec)
            self.key = key
        shifts = self.source.shifts_for_rows(self.row_seeds) if isinstance(self.source, FixedKey) \
            else np.zeros(len(self.row_seeds), dtype=np.int64)
        self._shifts = torch.from_numpy(shifts)
        self._sample_base = torch.tensor([prf.to_signed(prf.prf_int(s, prf.SAMPLE)) for s in self.row_seeds])
        self._skip_base = torch.tensor([prf.to_signed(prf.prf_int(s, prf.SKIP)) for s in self.row_seeds])
        self.step = 0
        self.entropy: list[torch.Tensor] = []
        self.spike_entropy: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: int64 [B, S] (prompt + generated so far); scores: float [B, V'] raw logits."""
        b = scores.shape[0]
        if b != len(self.row_seeds):
            raise ValueError(f"batch has {b} rows but the processor was built for {len(self.row_seeds)}")
        device = scores.device
        logits = scores[:, : self.vocab_size]
        self._record_entropy(logits)
        plain_u = prf.unit_t(prf.prf_t(self._sample_base.to(device), self.step))
        if self.source is None:
            chosen = self.plain.choose(logits, None, self.temperature, plain_u)
        else:
            seeds = self.source.seeds_t(input_ids, self.key, self.step, self._shifts.to(device))
            chosen = self.sampler.choose(logits, seeds, self.temperature, plain_u)
            if self.spec.skip_prob > 0:
                skip = prf.unit_t(prf.prf_t(self._skip_base.to(device), self.step)) < self.spec.skip_prob
                if bool(skip.any()):
                    chosen = torch.where(skip, self.plain.choose(logits, None, self.temperature, plain_u), chosen)
        self.step += 1
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen.unsqueeze(-1), 0.0)
        return out

    def _record_entropy(self, logits: torch.Tensor) -> None:
        logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
        p = logp.exp()
        self.entropy.append(-(p * logp).nan_to_num().sum(-1).cpu())
        self.spike_entropy.append((p / (1.0 + p)).sum(-1).cpu())

    def _mean_over(self, per_step: list[torch.Tensor], lengths: Sequence[int]) -> np.ndarray:
        if not per_step:
            return np.full(len(lengths), np.nan)
        table = torch.stack(per_step, dim=1).numpy()  # [B, steps]
        return np.array([table[i, :n].mean() if n > 0 else np.nan for i, n in enumerate(lengths)])

    def mean_entropy(self, lengths: Sequence[int]) -> np.ndarray:
        """Mean Shannon entropy (nats) over each row's first ``lengths[i]`` generated tokens."""
        return self._mean_over(self.entropy, lengths)

    def mean_spike_entropy(self, lengths: Sequence[int]) -> np.ndarray:
        return self._mean_over(self.spike_entropy, lengths)
