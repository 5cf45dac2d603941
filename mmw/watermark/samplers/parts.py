"""The samplers' declarations: what the scheme's validation needs of each sampler C1-C4 (and plain sampling) —
its name, display label, the scheme keys it uses (with defaults) and the combinations it refuses
(``mmw.validation.Part``, applied by ``mmw.watermark.scheme.SchemeSpec``).

This module imports no torch: validation, the params board and the reports read it without loading
the generation code. Each sampler's implementation (``mmw.watermark.samplers.<module>``) subclasses its declaration, and
the declaration names it (``implementation``), so :func:`mmw.watermark.samplers.build_sampler` imports it on first use.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from mmw.watermark.samplers.binary_code import CODES
from mmw.watermark.scheme_values import SchemeValues
from mmw.validation import Key, Part, Refuse, Unused

#: Seeds a generation remembers for a repeated-context mask (SynthID's ``context_history_size`` default): a
#: 1,024-token text is masked over its whole length.
REPEATED_CONTEXT_HISTORY = 1024


def refuse_constant_randomness(holds: str) -> Refuse:
    """Constant randomness (window=0) gives every token one seed; the sum score counts each random draw once, so
    a sampler whose draws are shared across tokens (C2: one uniform per seed, C3: one per tree node, most of them
    forced by the model) stops gathering evidence with length. Measured on synthetic text of entropy log 16: 17%
    (C2) and 0-8% (C3) detected at 64 and 200 tokens (tests/test_power.py)."""
    return Refuse("window", lambda v: v["window"] == 0, "window=0 (constant randomness) cannot detect "
                  "sampler={sampler}: every token shares one seed, so the text holds " + holds
                  + " and evidence stops growing with length", "an integer >= 1")


class SamplerPart(Part):
    """One sampling strategy C of the design space (the scheme's ``sampler``; ``label``: its display name;
    ``implementation``: the module whose subclass of this declaration samples and scores)."""

    part = "sampler"
    chosen = "by sampler={name}"
    label: ClassVar[str]
    implementation: ClassVar[str]
    distortion_free: ClassVar[bool] = True
    #: How the running sum S of its unit statistics moves under the watermark (``mmw.watermark.size``'s anytime e-process):
    #: "exp_up" -- each unit is -Exp(1) and the watermark makes Exp(1) draws large (C1, C2); "exp_down" -- each
    #: unit is +Exp(1) and shrinks when marked (C3, per tree node); "green" -- each unit is -1 (green, probability
    #: gamma) or 0 (C4, reweight); "bits" -- each unit is minus its count of ones among ``layers`` fair bits
    #: (tournament). None: no per-unit pivot.
    pivot: ClassVar[str | None] = None
    #: Whether ``choose`` accepts one seed per candidate (int64 [B, V], ``randomness=selfhash``) besides one per row:
    #: true where each candidate's draw is its own keyed value (C1's uniform, C4's green bit); false where one
    #: permutation, uniform or tree walk per position is shared by all candidates.
    candidate_seeds: ClassVar[bool] = False
    #: Seeds remembered per generation for masking repeated contexts (0: no mask); ``mmw.watermark.processor`` applies it.
    context_history: ClassVar[int] = 0
    #: Whether the numba kernels compute its statistic (``mmw.kernels.stats.token_statistic``); its kernel code is its
    #: place among such samplers in :data:`WATERMARKING` (:data:`KERNEL_CODES`).
    kernel_statistic: ClassVar[bool] = True
    # A distortion-free sampler is deterministic given the key, so it may sample plainly with probability skip_prob.
    scheme_keys = (Key("skip_prob", default=0.0),)

    @classmethod
    def history_size(cls, spec: SchemeValues) -> int:
        """Seeds a generation remembers to sample its repeated contexts plainly under ``spec`` (0: none)."""
        return cls.context_history


class PlainPart(SamplerPart):
    """Ordinary sampling: the unwatermarked baseline (not a value of the scheme's ``sampler``)."""

    name = "none"
    label = "Plain"
    implementation = "mmw.watermark.samplers.base"
    kernel_statistic = False


class DistributionShiftPart(SamplerPart):
    """C4 distribution shift (Kirchenbauer et al.): delta added to a keyed green list of fraction gamma."""

    name = "distribution_shift"
    label = "Distribution shift"
    implementation = "mmw.watermark.samplers.distribution_shift"
    distortion_free = False
    pivot = "green"
    candidate_seeds = True
    scheme_keys = (Unused("skip_prob", "by the distribution-shift sampler (it is not deterministic given the key)"),
                   Key("delta", required=True, purpose="the distribution-shift bias", generation_only=True),
                   Key("gamma", default=0.5, purpose="the distribution-shift green-list fraction"))


class ExponentialPart(SamplerPart):
    """C1 exponential (Aaronson): Gumbel-max with keyed per-token uniforms; distortion-free."""

    name = "exponential"
    label = "Exponential"
    implementation = "mmw.watermark.samplers.exponential"
    pivot = "exp_up"
    candidate_seeds = True
    # mask_repeated: a seed already used in the generation is sampled plainly, as vLLM's gumbel sampler does. Without
    # it C1 marks a repeated context with the same draw again and can loop: at T = 0.7 on the embedded generator 4 of
    # 24 texts repeated over 20 % of their 4-token contexts, vLLM's none (bench/results/oracles.md). Detection is the
    # same either way (the deduplicated sum counts each seed once).
    scheme_keys = (*SamplerPart.scheme_keys, Key("mask_repeated", purpose="the exponential sampler's repeated-context "
                                                 "mask", generation_only=True))
    refuses = (Refuse("mask_repeated", lambda v: bool(v["mask_repeated"]) and v["randomness"] not in ("window",
                                                                                                     "minhash"),
                      "mask_repeated=true needs one seed per row and step, which randomness={randomness} does not "
                      "give", ("false", "or randomness=window / minhash")),
               Refuse("window", lambda v: bool(v["mask_repeated"]) and v["window"] == 0, "mask_repeated=true with "
                      "window=0 (one seed for every token) samples every token after the first plainly",
                      "an integer >= 1"))

    @classmethod
    def history_size(cls, spec: SchemeValues) -> int:
        return REPEATED_CONTEXT_HISTORY if spec.mask_repeated else 0


class InverseTransformPart(SamplerPart):
    """C2 inverse transform (Kuditipudi et al.): inverse-CDF sampling over a keyed permutation of the vocabulary."""

    name = "inverse_transform"
    label = "Inverse transform"
    implementation = "mmw.watermark.samplers.inverse_transform"
    pivot = "exp_up"
    refuses = (refuse_constant_randomness("one random draw"),)


class BinaryPart(SamplerPart):
    """C3 binary (Christ et al.): tokens as bit strings, each bit drawn by a keyed uniform."""

    name = "binary"
    label = "Binary"
    implementation = "mmw.watermark.samplers.binary"
    pivot = "exp_down"
    scheme_keys = (*SamplerPart.scheme_keys, Key("binary_code", default=CODES[0]))
    # The edit DP compares per-token costs with the gap cost psi, which only means something when the statistic
    # is on the -Exp(1) scale (C1, C2) or in [-1, 0] (C4). This sampler's per-token statistic is a sum of ~depth
    # (10-17) positive Exp(1) node values, always far above 2 psi, so the DP takes only gaps and every text (and
    # every null trial) scores exactly 2 n psi: p = 1, nothing is ever detected.
    refuses = (Refuse("score", lambda v: v["score"] == "edit", "the edit score cannot detect the binary sampler: "
                      "its per-token statistic (a sum of ~10-17 positive node values) always exceeds the gap cost "
                      "2*psi, so every text scores 2*n*psi and p = 1; use score=align with randomness=fixed, or "
                      "score=sum", ("sum", "align")),
               refuse_constant_randomness("only the tree nodes' draws, shared by all tokens"))


# ---------------------------------------------------------------- beyond the paper: reweighting (DiPmark)
class ReweightPart(SamplerPart):
    """DiPmark reweighting (Wu et al. 2023; gamma-reweight of Hu et al. 2023 at reweight_alpha = 0.5): the
    cumulative mass in a keyed permutation order is mapped by ``F -> max(F - a, 0) + max(F - (1 - a), 0)``, which
    moves mass towards the end of the order; distortion-free over keys. Detected by the share of tokens in the last
    ``gamma`` of the order (the green list)."""

    name = "reweight"
    label = "Reweight (DiPmark)"
    implementation = "mmw.watermark.samplers.reweight"
    pivot = "green"
    scheme_keys = (Unused("skip_prob", "by the reweighting sampler (it samples with fresh randomness already, so "
                          "skipping only weakens it)"),
                   Key("reweight_alpha", default=0.5, purpose="the reweighting strength", generation_only=True),
                   Key("gamma", default=0.5))



# ---------------------------------------------------------------- beyond the paper: permute-and-flip (PF)
class PermuteFlipPart(SamplerPart):
    """Permute-and-flip decoding (Zhao, Li & Wang, ICLR 2025; MarkLLM's "PF"): ``argmax_i log p_i - log r_i``
    with keyed uniforms r_i, i.e. the PF decoder with keyed noise. Distortion-free over keys with respect to the
    PF decoder's own law, not softmax sampling (PF favours likelier tokens), hence ``distortion_free = False``
    and no ``skip_prob`` (a skipped token would be drawn from the softmax). Its per-token statistic ``log r`` is
    -Exp(1) under H0, as C1's."""

    name = "permute_flip"
    label = "Permute-and-flip (PF)"
    implementation = "mmw.watermark.samplers.permute_flip"
    distortion_free = False
    pivot = "exp_up"
    candidate_seeds = True
    # mask_repeated: as C1 (PF is deterministic given the seed, so a repeated context repeats its token and can
    # loop); a masked row is drawn by the unwatermarked PF decoder (``PermuteFlip.choose_or_plain``).
    scheme_keys = (Unused("skip_prob", "by the permute-and-flip sampler (a skipped token would be drawn from the "
                          "softmax, not from PF's law)"),
                   Key("mask_repeated", generation_only=True))
    refuses = ExponentialPart.refuses

    @classmethod
    def history_size(cls, spec: SchemeValues) -> int:
        return REPEATED_CONTEXT_HISTORY if spec.mask_repeated else 0


# ---------------------------------------------------------------------------------------------- tournament
#: The most tournament layers the kernels support: layer l's g-value is bit 63 - l of one 64-bit PRF output.
MAX_LAYERS = 64
#: The most candidates per match (``leaves``): beyond a few the distortionary tournament is near-greedy on g.
MAX_LEAVES = 16


def uniform_weights(layers: int) -> np.ndarray:
    """Every layer counts once: the score is SynthID's mean score (the count of ones)."""
    return np.ones(layers, dtype=np.int64)


def decreasing_weights(layers: int) -> np.ndarray:
    """SynthID's weighted mean score: weights falling linearly from 10 (first layer) to 1 (last layer), because
    later rounds see a distribution already sharpened by the earlier ones and carry less signal. Rounded to
    integers, so that the weighted count of ones has an exact discrete null (``mmw.watermark.nulls.weighted_bits_upper``);
    SynthID's own rescaling of the weights to sum m does not change which texts score higher."""
    return np.rint(np.linspace(10.0, 1.0, layers)).astype(np.int64)


#: The tournament score's per-layer weights (the scheme's ``layer_weights``): name -> weights of m layers
#: (positive integers, int64 [m]).
LAYER_WEIGHTS = {"uniform": uniform_weights, "decreasing": decreasing_weights}


class TournamentPart(SamplerPart):
    """SynthID-Text (Dathathri et al., Nature 2024): a tournament over ``layers`` rounds of keyed Bernoulli
    g-values, ``leaves`` candidates per match; its output distribution is computed exactly (no candidate draws).

    ``leaves`` = 2 is SynthID's non-distortionary mode (distortion-free over keys at each step); ``leaves`` > 2
    its distortionary mode (stronger signal, biased towards tokens with many g = 1). Repeated contexts (a seed
    already used in this generation) are sampled plainly, as SynthID does."""

    name = "tournament"
    label = "Tournament"
    implementation = "mmw.watermark.samplers.tournament"
    pivot = "bits"
    #: Seeds remembered per row for the repeated-context mask (SynthID's ``context_history_size``).
    context_history = REPEATED_CONTEXT_HISTORY
    # A seed seen before in the generation is sampled plainly (SynthID's repeated-context mask), so a seed shared by
    # every token (window 0) or a key sequence that repeats every L tokens (fixed) leaves nearly nothing marked:
    # measured 0 % (window 0) and 42-62 % (fixed L = 16, align/edit) detected at 100 tokens (tests/test_power.py).
    refuses = (refuse_constant_randomness("one seed, masked after its first use"),
               Refuse("randomness", lambda v: v["randomness"] == "fixed", "randomness=fixed repeats its key "
                      "sequence every key_length tokens, and the tournament samples a repeated seed plainly, so the "
                      "text stops carrying the watermark", ("window", "minhash")))
    scheme_keys = (Unused("skip_prob", "by the tournament sampler (it is not deterministic given the key)"),
                   Key("layers", default=30, purpose="the tournament's number of layers m"),
                   Key("leaves", default=2, purpose="the tournament's candidates per match (2: non-distortionary)",
                       generation_only=True),
                   Key("layer_weights", default="uniform", purpose="the tournament score's per-layer weights"))

    @staticmethod
    def weights_of(spec) -> np.ndarray:
        """The per-layer weights of the g-value count that ``spec`` (a tournament scheme) scores: int64 [m]."""
        return LAYER_WEIGHTS[spec.layer_weights or "uniform"](spec.layers)


class PluginPart(SamplerPart):
    """An outside watermark through its plugin (``mmw.watermark.plugins``, entry-point group ``mmw.watermarks``): the plugin
    brings its own randomness, sampling and detection; ``plugin`` names it, ``plugin_params`` are validated by the
    plugin's own model (``mmw.watermark.scheme`` checks both)."""

    name = "plugin"
    label = "Plugin"
    implementation = "mmw.watermark.plugins"  # the interface; each plugin brings its implementation
    distortion_free = False
    kernel_statistic = False
    scheme_keys = (Key("plugin", required=True, purpose="the plugin's entry-point name"),
                   Key("plugin_params", default=None, purpose="the plugin's parameters"))


#: The watermarking samplers, in the paper's order: the values of the scheme's ``sampler``.
WATERMARKING: tuple[type[SamplerPart], ...] = (DistributionShiftPart, ExponentialPart, InverseTransformPart,
                                               BinaryPart, ReweightPart, TournamentPart, PermuteFlipPart,
                                               PluginPart)
#: Every sampler's declaration by name, plain sampling (``none``) included.
DECLARED: dict[str, type[SamplerPart]] = {cls.name: cls for cls in (*WATERMARKING, PlainPart)}
#: The code each sampler with a kernel statistic has in the numba kernels (``mmw.kernels.stats`` branches on it): 1, 2,
#: ... in :data:`WATERMARKING`'s order. Codes are run-time values; the CPU twin's on-disk cache is keyed on them.
KERNEL_CODES: dict[str, int] = {cls.name: code for code, cls in
                                enumerate((c for c in WATERMARKING if c.kernel_statistic), start=1)}
#: Display names of the built-in watermarking samplers (the report's families), in the paper's order.
#: A plugin is not one family: each plugin is its own, labelled by the plugin (``mmw.watermark.plugins.label``).
LABELS: dict[str, str] = {cls.name: cls.label for cls in WATERMARKING if cls is not PluginPart}
