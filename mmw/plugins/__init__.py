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

This module is light (pydantic, numpy, scipy): validation loads the plugin's class, never its heavy
dependencies, which a plugin imports inside ``processor``/``detector``. The runtime wrappers (sampling, checks,
sizes) live in ``mmw.plugin_generation`` and ``mmw.plugin_detection``.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Literal

import numpy as np

from mmw import nulls
from mmw.errors import SpecError
from mmw.validation import Section

GROUP = "mmw.watermarks"

#: The nulls a plugin may declare for its per-token pivots, by the running-sum convention of ``mmw.size``'s
#: anytime e-process (lower sum = more evidence, docs/PRF.md):
#: - "green": each unit is -1 (green, probability ``gamma`` under H0) or 0; the sum's null is Binomial;
#: - "exp_up": each unit is -Exp(1) under H0 and the watermark makes the draws large; the sum's null is Erlang.
NULLS = ("green", "exp_up")


@dataclass(frozen=True)
class Pivots:
    """Per-token pivotal statistics of one text of N tokens under a declared null.

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
    #: Import names of the packages its processor and detector need (checked when the plugin is chosen).
    requires: ClassVar[tuple[str, ...]] = ()
    Params: ClassVar[type[Section]]

    @abstractmethod
    def processor(self, params: Any, key: int, vocab_size: int, temperature: float, row_seeds: list[int]) -> Any:
        """A transformers ``LogitsProcessor`` (``__call__(input_ids, scores) -> scores``) for one batch, from a
        64-bit ``key`` (the plugin derives its own keys from it, never logs it); ``row_seeds``: one 63-bit seed per
        row for any ordinary randomness the plugin needs (a row's tokens then depend only on its own seed)."""

    @abstractmethod
    def detector(self, params: Any, key: int, vocab_size: int) -> PluginDetector:
        """The detector of texts watermarked with ``key``."""

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
        raise SpecError(setting, f"plugin {name!r} ({found[name].value}) is not a mmw.plugins.WatermarkPlugin "
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


def validate_params(name: str, raw: Any, prefix: str = "scheme") -> dict[str, Any]:
    """The plugin's parameters, validated by its own model and normalized (defaults filled in)."""
    plugin = load_plugin(name, f"{prefix}.plugin")
    model = plugin.Params.from_params({} if raw is None else raw, f"{prefix}.plugin_params")
    return model.model_dump()


def plugin_params(spec: Any) -> tuple[WatermarkPlugin, Section]:
    """A plugin scheme's (``mmw.scheme.SchemeSpec``) plugin and its normalized parameters as the plugin's model."""
    plugin = load_plugin(spec.plugin)
    return plugin, plugin.Params.model_validate(spec.plugin_params or {}, strict=False)


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
