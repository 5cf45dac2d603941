"""Outside watermarks as plugins: what a plugin supplies, and how mmw finds it (entry-point group ``mmw.watermarks``).

A plugin is a :class:`WatermarkPlugin` subclass that a distribution registers under the entry-point group
``mmw.watermarks`` (``[project.entry-points."mmw.watermarks"] name = "package.module:Class"``). The scheme
chooses it like a built-in sampler::

    scheme:
      sampler: plugin
      plugin: hf_kgw                    # the entry point's name
      plugin_params: {bias: 2.0}        # validated by the plugin's own ``Params`` model (a Section)
      alpha: 0.02

A plugin supplies
- ``Params``: its parameter model (``mmw.validation.Section``: strict types, unknown keys rejected, each field's
  accepted values through ``allowed``), so its errors read ``scheme.plugin_params.<key>: ...; allowed: ...``;
- ``processor(params, key, vocab_size, temperature, row_seeds)``: a generation-side processor following the
  transformers ``LogitsProcessor`` protocol, ``(input_ids int64 [B, S], scores float [B, V]) -> float [B, V]``,
  called once per decoding step on the temperature-scaled logits (as transformers runs its watermark processors,
  after the warpers); mmw samples the next token from the softmax of what it returns;
- ``detector(params, key, vocab_size)``: an object whose ``score(tokens int64 [N])`` returns either
  :class:`Pivots` (per-token unit statistics with a declared null from :data:`NULLS`: every size works — E, the
  checkpoint size and the anytime size) or :class:`PrefixPValues` (a p-value per prefix: E and the checkpoint size
  only; the anytime size is reported as not available, with the reason).

The whole contract (docs/PLUGINS.md has it with examples):
- the processor is built fresh for every batch of rows (it may keep state across the steps of its batch, never
  across batches) and is called once per step with ``scores`` = the step's logits already divided by the
  temperature (raw at temperature 0), cut to the vocabulary and copied (it may modify them in place);
- it returns logits over the whole vocabulary of the same shape: -inf excludes a token, NaN and +inf are refused;
  a reference processor that applies its own temperature or top-k returns candidates: give it ``scores *
  temperature`` and spread its candidates back with :func:`spread_candidates`;
- pivots count evidence downwards: a green token is -1, a Gumbel/exponential draw is -r (``Pivots``);
- a detector with ``needs_model = True`` receives the generator and its tokenizer (:class:`DetectionModel`);
- ``mmw.watermark.plugin_contract.check_contract`` runs all of this on a tiny synthetic batch; the ``key`` stage runs it
  before any work, and ``mmw plugin new`` writes a package whose test runs it.

This module is light (pydantic, numpy, scipy): validation loads the plugin's class, never its heavy
dependencies, which a plugin imports inside ``processor``/``detector``. The runtime wrappers (sampling, checks,
sizes) live in ``mmw.watermark.plugin_generation`` and ``mmw.watermark.plugin_detection``.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from mmw.errors import SpecError
from mmw.validation import Section
from mmw.watermark import nulls

GROUP = "mmw.watermarks"

#: The nulls a plugin may declare for its per-token pivots, by the running-sum convention of ``mmw.watermark.size``'s
#: anytime e-process (lower sum = more evidence, docs/PRF.md):
#: - "green": each unit is -1 (green, probability ``gamma`` under H0) or 0; the sum's null is Binomial;
#: - "exp_up": each unit is -Exp(1) under H0 and the watermark makes the draws large; the sum's null is Erlang.
NULLS = ("green", "exp_up")


@dataclass(frozen=True)
class Pivots:
    """Per-token pivotal statistics of one text of N tokens under a declared null.

    Sign convention: evidence for the watermark makes the sum SMALLER. Null "green": a green unit is -1, any other
    unit 0 (so ``values = -green_count``); null "exp_up": a unit is -r for a draw r ~ Exp(1) under H0 that the
    watermark makes large (Gumbel-max / exponential sampling). A detector that returns +1 per green unit
    is refused by the contract check (its sum would exceed 0).

    ``values`` float64 [N]: the sum of the unit statistics token n contributes (0 where it contributes none);
    ``units`` int64 [N] >= 0: how many independent units token n contributes (0: masked, e.g. a repeated context).
    ``null``: one of :data:`NULLS`; ``gamma``: the green probability under H0 (null "green" only)."""

    values: np.ndarray
    units: np.ndarray
    null: str | None
    gamma: float | None = None


@dataclass(frozen=True)
class PrefixPValues:
    """``pvalues`` float64 [N]: the p-value of the first n tokens at index n - 1, valid (super-uniform) under H0
    for each prefix; ``reason``: why the plugin gives no per-token pivot (shown where the anytime size is not)."""

    pvalues: np.ndarray
    reason: str = "the plugin's detector gives p-values per prefix, no per-token pivot with a declared null"


@runtime_checkable
class PluginLogitsProcessor(Protocol):
    """What ``WatermarkPlugin.processor`` returns: the transformers ``LogitsProcessor`` protocol.

    Built fresh for each batch of rows. Called once per decoding step with ``input_ids`` int64 [B, S] (prompt and
    tokens generated so far, left-padded prompts included) and ``scores`` float [B, V]: the step's logits divided
    by the temperature (unscaled at temperature 0), cut to the vocabulary of V ids, a copy the processor may
    modify. Returns float [B, V] logits on the same device: mmw samples the next token from their softmax with
    its per-row PRF uniforms (the argmax at temperature 0); -inf excludes a token; NaN, +inf, a changed shape or
    a row that is -inf everywhere is refused."""

    def __call__(self, input_ids: Any, scores: Any) -> Any: ...


@runtime_checkable
class DetectionModel(Protocol):
    """What a detector with ``needs_model = True`` receives: the generator's language model, loaded by mmw.

    ``logits(tokens int64 [N]) -> float32 [N, V]``: row n is the model's next-token logits before token n given
    tokens[:n] (row 0 given the tokenizer's BOS token when it has one, else all zeros: a uniform distribution),
    without temperature. ``model`` / ``tokenizer``: the transformers objects (None in the contract check, which
    passes a synthetic model); ``vocab_size``: V, as the detector's own ``vocab_size``."""

    vocab_size: int
    model: Any
    tokenizer: Any

    def logits(self, tokens: np.ndarray) -> np.ndarray: ...


def spread_candidates(candidate_scores: Any, candidate_ids: Any, vocab_size: int) -> Any:
    """Logits over the vocabulary from a processor that returns only its top-k candidates: float [B, V], -inf
    except at ``candidate_ids`` int64 [B, K], which get ``candidate_scores`` float [B, K] (torch tensors). mmw then
    samples among the candidates from the softmax of their scores, as the reference's own sampler would."""
    import torch

    out = torch.full((candidate_scores.shape[0], vocab_size), float("-inf"), dtype=candidate_scores.dtype,
                     device=candidate_scores.device)
    return out.scatter_(1, candidate_ids.to(torch.int64), candidate_scores)


class PluginDetector(ABC):
    """The detection side of a plugin."""

    @abstractmethod
    def score(self, tokens: np.ndarray) -> Pivots | PrefixPValues:
        """tokens: int64 [N] (the generated tokens, or a text re-tokenized by the generator's tokenizer)."""


class WatermarkPlugin(ABC):
    """An outside watermark: its parameter model, its generation-side processor and its detector.

    ``label``: its display name in tables and the page; ``distortion_free``: whether its sampling preserves the
    model's distribution in expectation over keys (shown beside the built-in samplers')."""

    label: ClassVar[str]
    distortion_free: ClassVar[bool] = False
    #: Import names of the packages its processor and detector need (checked when the plugin is chosen, so a
    #: missing package fails at validation, naming the plugin and the package).
    requires: ClassVar[tuple[str, ...]] = ()
    #: True: ``detector`` is called with ``model=`` a :class:`DetectionModel` (the generator and its tokenizer,
    #: e.g. for SWEET/EWD-style entropy weighting); the detect stages then load the generator.
    needs_model: ClassVar[bool] = False
    Params: ClassVar[type[Section]]

    @abstractmethod
    def processor(self, params: Any, key: int, vocab_size: int, temperature: float, row_seeds: list[int]) -> Any:
        """A :class:`PluginLogitsProcessor` for ONE batch (built again for every batch), from a 64-bit ``key``
        (the plugin derives its own keys from it, never logs it); ``temperature``: already applied to the scores
        it receives (given for a reference processor that wants the raw logits back: ``scores * temperature``);
        ``row_seeds``: one 63-bit seed per row for any ordinary randomness the plugin needs (a row's tokens then
        depend only on its own seed)."""

    @abstractmethod
    def detector(self, params: Any, key: int, vocab_size: int, **model: DetectionModel) -> PluginDetector:
        """The detector of texts watermarked with ``key``; with ``needs_model`` it is called with ``model=`` a
        :class:`DetectionModel`, otherwise without it."""

    def no_pivot_reason(self, params: Any) -> str | None:
        """None when the detector returns :class:`Pivots` under these parameters; else why it returns only
        per-prefix p-values (the reports show it where the anytime size is not available)."""
        return None


# ------------------------------------------------------------------------------------------------ discovery
def installed() -> dict[str, EntryPoint]:
    """The installed plugins by entry-point name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


@lru_cache(maxsize=32)
def _load(name: str, value: str) -> type[WatermarkPlugin]:
    """The plugin class behind one entry point (cached by its target: a reinstalled plugin is loaded anew)."""
    return installed()[name].load()  # type: ignore[no-any-return]


def load_plugin(name: str, setting: str = "scheme.plugin") -> WatermarkPlugin:
    """The plugin registered as ``name``: SpecError naming it when it is not installed, does not load, or is not
    a :class:`WatermarkPlugin` with a ``Params`` model and a ``label``."""
    found = installed()
    if name not in found:
        raise SpecError(setting, f"no watermark plugin {name!r} is installed (entry-point group {GROUP})",
                        sorted(found) or "none installed")
    try:
        cls = _load(name, found[name].value)
    except Exception as err:  # a plugin's import can fail in any way; the user needs its name and the cause
        raise SpecError(setting, f"plugin {name!r} ({found[name].value}) failed to load: "
                        f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    if not (isinstance(cls, type) and issubclass(cls, WatermarkPlugin)):
        raise SpecError(setting, f"plugin {name!r} ({found[name].value}) is not a mmw.watermark.plugins.WatermarkPlugin "
                        "subclass", "an entry point naming a WatermarkPlugin subclass")
    params = getattr(cls, "Params", None)
    if not (isinstance(params, type) and issubclass(params, Section)) or not isinstance(getattr(cls, "label", None),
                                                                                        str):
        raise SpecError(setting, f"plugin {name!r} declares no Params model (a mmw.validation.Section) or no label",
                        "a WatermarkPlugin with Params and label")
    missing = [module for module in cls.requires if importlib.util.find_spec(module) is None]
    if missing:
        raise SpecError(setting, f"plugin {name!r} needs {', '.join(missing)}, which is not installed here",
                        "an environment with the plugin's requirements")
    try:
        return cls()
    except Exception as err:
        raise SpecError(setting, f"plugin {name!r} could not be built: {type(err).__name__}: {err}") from None


def parse_plugin_params(raw: Any, setting: str) -> dict[str, Any]:
    """``plugin_params`` as a mapping: a mapping as given, None as {}, or a string holding a YAML/JSON mapping.

    The string form is what switching plugins with ``dvc exp run -S`` needs: DVC applies ``-S key={...}`` by
    merging the new mapping into the one params.yaml holds, in struct mode, so a key the previous plugin did not
    have fails (``Key 'top_k' is not in struct``); a string replaces the old value whole:
    ``-S 'scheme.plugin_params="{depth: 30, ngram_len: 5}"'``."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        import yaml

        try:
            raw = yaml.safe_load(raw) if raw.strip() else {}
        except yaml.YAMLError as err:
            raise SpecError(setting, f"not a YAML/JSON mapping: {str(err).splitlines()[0]}",
                            "a mapping, e.g. \"{depth: 30, ngram_len: 5}\"") from None
        raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise SpecError(setting, f"expected a mapping, got {type(raw).__name__}",
                        "a mapping, or a string holding one")
    return raw


def validate_params(name: str, raw: Any, prefix: str = "scheme") -> dict[str, Any]:
    """The plugin's parameters, validated by its own model and normalized (defaults filled in); an error names
    the key, the plugin and the allowed values."""
    plugin = load_plugin(name, f"{prefix}.plugin")
    try:
        model = plugin.Params.from_params(parse_plugin_params(raw, f"{prefix}.plugin_params"),
                                          f"{prefix}.plugin_params")
    except SpecError as err:
        raise SpecError(err.key, f"{err.problem} (plugin {name!r}: {plugin.label})", err.allowed) from None
    return model.model_dump()


def plugin_params(spec: Any) -> tuple[WatermarkPlugin, Section]:
    """A plugin scheme's (``mmw.watermark.scheme.SchemeSpec``) plugin and its normalized parameters as the plugin's model."""
    plugin = load_plugin(spec.plugin)
    raw = parse_plugin_params(spec.plugin_params, "scheme.plugin_params")
    return plugin, plugin.Params.model_validate(raw, strict=False)


def no_pivot_reason(spec: Any) -> str | None:
    """Why a plugin scheme's detector gives no anytime size, or None when it does."""
    plugin, params = plugin_params(spec)
    return plugin.no_pivot_reason(params)


def label(name: str) -> str:
    """The display name of an installed plugin (its entry-point name when it cannot be loaded)."""
    try:
        return load_plugin(name).label
    except SpecError:
        return name


# ------------------------------------------------------------------------------------------------ the nulls
def check_pivots(pivots: Pivots, n_tokens: int, plugin: str) -> None:
    """A plugin's pivots must declare a known null and be finite, aligned with the text: SpecError naming it."""
    setting = f"scheme.plugin ({plugin})"
    if pivots.null not in NULLS:
        raise SpecError(setting, f"the detector returned per-token pivots without a declared null "
                        f"(null={pivots.null!r})", NULLS)
    if pivots.null == "green" and not (isinstance(pivots.gamma, float) and 0.0 < pivots.gamma < 1.0):
        raise SpecError(setting, f"the green null needs gamma in (0, 1), got {pivots.gamma!r}", "a number in (0, 1)")
    values, units = np.asarray(pivots.values), np.asarray(pivots.units)
    if values.shape != (n_tokens,) or units.shape != (n_tokens,):
        raise SpecError(setting, f"the detector's pivots have shapes {values.shape}, {units.shape} for a text of "
                        f"{n_tokens} tokens", f"arrays of shape ({n_tokens},)")
    if not np.all(np.isfinite(values)) or np.any(units < 0):
        raise SpecError(setting, "the detector returned NaN/inf pivots or negative unit counts",
                        "finite values, unit counts >= 0")
    if np.any(values > 0) or np.any((values != 0) & (units == 0)):  # evidence counts downwards (Pivots)
        raise SpecError(setting, "the detector returned positive pivots or pivots on tokens with no units (a green "
                        "unit counts -1, an exponential draw r counts -r)", "values <= 0, 0 where units is 0")
    if pivots.null == "green" and np.any(values < -units):
        raise SpecError(setting, "the detector returned green pivots below -units (each green unit counts -1)",
                        "values in [-units, 0]")


def check_pvalues(result: PrefixPValues, n_tokens: int, plugin: str) -> None:
    p = np.asarray(result.pvalues, dtype=np.float64)
    setting = f"scheme.plugin ({plugin})"
    if p.shape != (n_tokens,):
        raise SpecError(setting, f"the detector returned {p.shape} p-values for a text of {n_tokens} tokens",
                        f"one p-value per prefix, shape ({n_tokens},)")
    bad = ~((p >= 0.0) & (p <= 1.0))
    if bad.any():
        raise SpecError(setting, f"the detector returned a p-value outside [0, 1] ({float(p[bad][0])!r} at prefix "
                        f"{int(np.flatnonzero(bad)[0]) + 1})", "p-values in [0, 1]")


def prefix_pvalues(total: np.ndarray, count: np.ndarray, null: Literal["green", "exp_up"],
                   gamma: float | None) -> np.ndarray:
    """Exact p-values of the running sums: float64 [N] from ``total`` and ``count`` (cumulative, [N] each)."""
    if null == "green":
        return nulls.binomial_upper(np.rint(-total).astype(np.int64), count.astype(np.int64), float(gamma))
    return nulls.erlang_upper(total, count)
