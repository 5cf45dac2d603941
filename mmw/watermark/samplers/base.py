"""Sampler base: next-token selection from logits + a seed (torch), and its per-token statistic (numpy).

A new sampler is four places, plus its tests:

1. its declaration in ``mmw.watermark.samplers.parts``: a ``SamplerPart`` subclass (name, label, the scheme keys it
   uses and the combinations it refuses, its pivot, where its implementation lives) added to ``WATERMARKING``.
   Everything else is derived from it: the scheme's allowed ``sampler`` values and key rules
   (``mmw.watermark.scheme``), its kernel code (``KERNEL_CODES``), the detection stages' scheme keys in dvc.yaml
   (``Key(..., generation_only=True)`` keeps a key out of them), the sweep's config identity and the report's label;
2. its class here, in the module the declaration names, subclassing both ``Sampler`` and its declaration:
   ``choose`` (generation), ``statistic`` (detection), and, when its null differs, ``units`` (what counts as one
   independent random draw) and ``pvalue_sum`` (the exact null of the sum);
3. its kernel statistic in ``mmw.kernels.stats``: a ``register_jitable`` value function and its branch, under its
   code, in ``token_statistic`` and ``token_unit`` (the CPU and CUDA twins share them);
4. its params line: the sampler in a params board or a sweep (``sweeps/*.yaml``) that runs it.

A scheme key of its own adds a field to ``mmw.watermark.scheme.SchemeSpec``, a property to
``mmw.watermark.scheme_values.SchemeValues`` and a line to each params board. tests/test_declarations.py fails when
the derived registries drift from the declarations (a kernel code without its statistic, dvc.yaml's keys, the
sweep's identity keys). Convention (docs/PRF.md): lower statistic = more watermark evidence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch
from mmw.watermark import nulls, prf
from mmw.watermark.samplers.parts import PlainPart, SamplerPart
from mmw.watermark.scheme_values import SchemeValues


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float64 softmax of logits / temperature. logits: [B, V]; temperature > 0."""
    return torch.softmax(logits.to(torch.float64) / temperature, dim=-1)


@torch.library.custom_op("mmw::cumsum_last", mutates_args=())
def cumsum_last(x: torch.Tensor) -> torch.Tensor:
    """``torch.cumsum(x, dim=-1)``, opaque to ``torch.compile``: Inductor's split scan fails to generate code for a
    float64 cumsum over a vocabulary-sized row (torch 2.11, H100), so the compiled step calls ATen's scan kernel."""
    return torch.cumsum(x, dim=-1)


@cumsum_last.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def law_of(logits: torch.Tensor, temperature: float, probs: torch.Tensor | None) -> torch.Tensor:
    """The model's law at ``temperature``: ``probs`` where the step already computed it (a sampler with
    ``takes_law``), else ``probabilities(logits, temperature)``."""
    return probabilities(logits, temperature) if probs is None else probs


def numba_cuda() -> bool:
    """True when numba's CUDA target sees a device (asked when a step or sampler prepares, outside any compiled
    graph); False where numba or its CUDA target cannot be imported."""
    try:
        from mmw.kernels.softmax import available  # the module patches numpy as numba's CUDA target needs
    except ImportError:
        return False
    return available()


@torch.library.custom_op("mmw::softmax_law", mutates_args=())
def softmax_law(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """On a CUDA device: ``probabilities(logits, temperature)`` (float64 [B, V]) and the Shannon and spike entropies
    of softmax(logits) at T = 1 (``mmw.watermark.processor.entropies``) stacked float64 [2, B], from float32 logits
    [B, V] in two reads (``mmw.kernels.softmax``; opaque to ``torch.compile``, whose
    float64 softmaxes took four times their bytes)."""
    from mmw.kernels.softmax import law

    return law(logits, temperature)


@softmax_law.register_fake
def _(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows = logits.shape[0]
    return (logits.new_empty((rows, logits.shape[1]), dtype=torch.float64),
            logits.new_empty((2, rows), dtype=torch.float64))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample one index per row by inverse transform. probs: float64 [B, V], u: float64 [B] in (0, 1) -> int64 [B].

    The target is scaled by the row total so rounding never lands on a zero-probability tail token. The index is
    the count of CDF entries below the target — ``searchsorted`` on a monotone CDF, but a plain reduction that a
    compiler fuses with the scan, and that stays exact if a parallel scan's rounding makes the CDF non-monotone."""
    cdf = cumsum_last(probs)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    return (cdf < target).sum(-1).clamp_(max=probs.shape[-1] - 1)


def per_candidate(seeds: torch.Tensor) -> torch.Tensor:
    """Seeds broadcastable against the vocabulary: int64 [B] (one per row) -> [B, 1]; [B, V] (one per candidate,
    ``randomness=selfhash``) unchanged."""
    return seeds.unsqueeze(-1) if seeds.dim() == 1 else seeds


class Sampler(SamplerPart, ABC):
    """The implementation of a sampling strategy: generation (torch) and its statistic (numpy). A concrete sampler
    also subclasses its declaration, e.g. ``class Exponential(Sampler, ExponentialPart)``."""

    def __init__(self, spec: SchemeValues, key: int, vocab_size: int):
        self.spec = spec
        self.key = key
        self.vocab_size = vocab_size

    # ---------------------------------------------------------------- generation (torch)
    def prepare(self, device: torch.device) -> None:
        """Build device constants (lookup tables) before ``choose`` runs, possibly inside a compiled graph."""

    _token_ids: torch.Tensor | None = None

    def token_ids(self, device: torch.device) -> torch.Tensor:
        """The token ids 0..V-1, int64 [V] on ``device``, as a stored table built once: Inductor folds an in-graph
        ``arange + constant`` into int32 index arithmetic, and the PRF's 64-bit constants then fail Triton's
        compile (torch 2.11). Samplers that hash every token id call this from ``prepare``."""
        if self._token_ids is None or self._token_ids.device != device:
            self._token_ids = torch.arange(self.vocab_size, dtype=torch.int64, device=device)
        return self._token_ids

    #: Whether ``choose`` takes ``probs=``, the model's law ``probabilities(logits, temperature)`` already computed
    #: by the step (on a CUDA device, together with the entropies: ``softmax_law``).
    takes_law = False

    def binned_law(self, logits: torch.Tensor, temperature: float, seeds: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
        """Where the step computes the law on a CUDA device (``softmax_law``) and this sampler has a vocabulary pass
        of its own over it that the pass writing the law can do too: ``softmax_law``'s two results and the
        keywords ``choose`` then takes with them (that pass's result). None (the default): no such pass."""
        return None

    @abstractmethod
    def choose(self, logits: torch.Tensor, seeds: torch.Tensor, temperature: float,
               plain_u: torch.Tensor) -> torch.Tensor:
        """Pick the next token. logits: float [B, V]; seeds: int64 [B] (uint64 bits), or int64 [B, V] (one per
        candidate) where the sampler declares ``candidate_seeds``; plain_u: float64 [B] uniforms for any ordinary
        sampling the scheme needs -> int64 [B]. A sampler with ``takes_law`` also accepts ``probs``: float64 [B, V]
        or None (then it computes the law itself)."""

    # ---------------------------------------------------------------- detection (numpy reference)
    @abstractmethod
    def statistic(self, tokens: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """Per-token statistic s(T, r), broadcast over int64 tokens and uint64 seeds -> float64."""

    def units(self, tokens: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The independent random draws behind aligned (token, seed) pairs, for the sum score's deduplication.

        tokens int64 [N], seeds uint64 [N] -> (position int64 [M], unit id uint64 [M], value float64 [M]).
        Default: one draw per distinct (seed, token) pair."""
        ids = prf.prf_np(seeds, tokens)
        return np.arange(len(tokens)), ids, self.statistic(tokens, seeds)

    def pvalue_sum(self, total: np.ndarray, n_units: np.ndarray) -> np.ndarray:
        """p-value of a sum score; default: each unit's statistic is -Exp(1) under H0."""
        return nulls.erlang_upper(total, n_units)


class Plain(Sampler, PlainPart):
    """Ordinary sampling (the unwatermarked baseline, and skipped tokens). No statistic."""

    takes_law = True

    def choose(self, logits, seeds, temperature, plain_u, probs=None):
        if temperature == 0:
            return logits.argmax(dim=-1)
        return inverse_cdf(law_of(logits, temperature, probs), plain_u)

    def statistic(self, tokens, seeds):
        raise TypeError("the plain sampler has no watermark statistic")
