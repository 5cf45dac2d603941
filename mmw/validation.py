"""One validation dialect for params sections, the watermark scheme and attack parameters: pydantic models whose
errors become the project's one-line :class:`~mmw.errors.SpecError` ("<key>: <problem>; allowed: <values>").

A section is a :class:`Section` model: unknown keys are rejected, types are strict (``p: true`` or ``p: "0.1"``
are mistakes, not 1 and 0.1), and every field says what it accepts with :func:`allowed` (the text after
"allowed:"). Rules that span fields raise ``SpecError`` themselves, naming the key they blame (a validator's
``SpecError`` passes through unchanged; a plain ``ValueError`` becomes the problem of the field it checks).
A composite config (the watermark scheme) is checked by its parts: each :class:`Part` (a sampler, a randomness
source, a score) declares on its class the keys it uses (:class:`Key`), the keys it does not (:class:`Unused`) and
the combinations it refuses (:class:`Refuse`); ``mmw.watermark.scheme`` applies them in one validator.
This module is light on purpose (pydantic only): every stage imports it before any heavy work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from mmw.errors import SpecError

__all__ = ["Integer", "Key", "Part", "Refuse", "Section", "Unused", "allowed", "allowed_text", "spec_error",
           "validate"]

#: Pydantic error types that mean "right type, value out of its range".
_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"})

M = TypeVar("M", bound=BaseModel)


def _integral(value: Any) -> Any:
    """YAML and ``dvc exp run -S`` may give ``2.0`` for an integer knob: accept whole floats, nothing else."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A strict integer that also accepts whole floats (never bools or strings).
Integer = Annotated[int, BeforeValidator(_integral)]


class Section(BaseModel):
    """Base of every validated mapping: strict types, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    @classmethod
    def from_params(cls, data: Any, prefix: str) -> Self:
        """This section validated from the mapping ``data`` (as ``mmw.watermark.scheme.SchemeSpec.from_params``)."""
        return validate(cls, data, prefix)


def allowed(text: str, **constraints: Any) -> Any:
    """A pydantic ``Field`` whose accepted values read ``text`` in errors; ``constraints`` are Field's (ge=, ...)."""
    default = constraints.pop("default", ...)
    return Field(default, json_schema_extra={"allowed": text}, **constraints)


def _key(prefix: str, loc: tuple[int | str, ...]) -> str:
    key = prefix
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def allowed_text(model: type[BaseModel], key: str) -> str | None:
    """What the field ``key`` of ``model`` accepts, as its :func:`allowed` says (None if it says nothing)."""
    field = model.model_fields.get(key)
    extra = field.json_schema_extra if field is not None else None
    return extra.get("allowed") if isinstance(extra, dict) else None  # type: ignore[return-value]


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field's type holds (``Confirmation | None`` -> Confirmation), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _nested_model(arg)) is not None), None)


def _owner(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[type[BaseModel], str | None]:
    """The (nested) model that declares the last named key of an error's ``loc``, and that key."""
    owner, found, name = model, model, None
    for part in loc:
        if isinstance(part, int):
            continue
        if owner is None:  # inside a plain mapping or list: the key belongs to the field that holds it
            break
        found, name = owner, str(part)
        field = owner.model_fields.get(name)
        owner = _nested_model(field.annotation) if field is not None else None
    return found, name


def spec_error(error: ValidationError, model: type[BaseModel], prefix: str) -> SpecError:
    """The first error of ``model``'s validation as a one-line SpecError naming ``<prefix>.<key>``."""
    errors = error.errors(include_url=False)
    # A typo shows as both an unknown and a missing key: the unknown one is the useful message.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    kind, loc, value = first["type"], tuple(first["loc"]), first.get("input")
    original = (first.get("ctx") or {}).get("error")
    if isinstance(original, SpecError):  # a cross-field rule that named its key itself
        return original
    key = _key(prefix, loc)
    owner, name = _owner(model, loc)
    if kind == "extra_forbidden":
        return SpecError(key, "unknown key", list(owner.model_fields))
    shown = allowed_text(owner, name) if name is not None else None
    if kind == "missing":
        return SpecError(key, "missing", shown)
    if kind == "literal_error":
        return SpecError(key, f"unknown value {value!r}", shown or first["ctx"]["expected"])
    if kind in _RANGE_ERRORS:
        return SpecError(key, f"{value!r} is out of range", shown)
    if original is not None:  # a field validator's ValueError: its message is the problem
        return SpecError(key, str(original), shown)
    return SpecError(key, f"expected {shown or first['msg'].lower()}, got {value!r}", shown)


def validate(model: type[M], data: Any, prefix: str, context: Mapping[str, Any] | None = None) -> M:
    """``model`` validated from the mapping ``data``; raises SpecError naming ``<prefix>.<key>``. ``context``
    reaches the model's validators (``info.context``) beside ``prefix``: what a cross-field rule checks against."""
    if not isinstance(data, Mapping):
        raise SpecError(prefix, f"expected a mapping, got {type(data).__name__}", list(model.model_fields))
    try:
        return model.model_validate(dict(data), context={**(context or {}), "prefix": prefix})
    except ValidationError as error:
        raise spec_error(error, model, prefix) from None


# ---------------------------------------------------------------------------------------------- parts of a config
#: What a rule reads: the config's values resolved so far (key -> value; keys of no part yet resolved hold None).
Values = Mapping[str, Any]


@dataclass(frozen=True)
class Key:
    """A key a part uses: ``required`` ("<key>: required with <part>=<name>"), else ``default`` when absent.

    ``purpose`` completes the error of another part of the same kind that is given the key ("not used by
    sampler=binary (delta is <purpose>)"; default: "for <part>=<names of the parts that use it>"). ``check`` sees
    the values once this key is resolved and returns ``(problem, allowed)`` to refuse them, or None.
    ``generation_only``: no detector reads the key (the detection stages do not depend on it)."""

    name: str
    required: bool = False
    default: Any = None
    purpose: str | None = None
    check: Callable[[Values], tuple[str, str] | None] | None = None
    generation_only: bool = False


@dataclass(frozen=True)
class Unused:
    """A key a part does not use, checked where it stands among the part's keys; ``reason`` is the text after
    "not used " (default: "<how the part is chosen> (<key> is <its purpose>)"). A key of the part's kind that the
    part does not name is unused too, checked after the named ones."""

    name: str
    reason: str | None = None


@dataclass(frozen=True)
class Refuse:
    """A combination a part cannot detect or does not define: when ``when(values)``, the error blames ``key`` with
    ``problem`` (``str.format``-ed with the values) and ``allowed``."""

    key: str
    when: Callable[[Values], bool]
    problem: str
    allowed: str | tuple[str, ...]


class Part:
    """One building block of a composite config, chosen by the value ``name`` of the config key ``part``.

    ``scheme_keys``: the keys it uses or not, in the order they are checked; ``refuses``: its refusals."""

    part: ClassVar[str]
    name: ClassVar[str]
    #: How the part is chosen, as the unused-key error says it ("by sampler={name}", "with randomness={name}").
    chosen: ClassVar[str]
    scheme_keys: ClassVar[tuple[Key | Unused, ...]] = ()
    refuses: ClassVar[tuple[Refuse, ...]] = ()
