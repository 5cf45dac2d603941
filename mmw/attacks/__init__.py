"""Attack registry: ``build_attack({"name": "swap", "p": 0.1})`` -> a validated :class:`Attack`.

Each name maps to the module that defines its class (the subclass of Attack whose ``family`` is that name).
Modules are imported only when their attack is built, so a missing optional dependency (argostranslate,
openai, the WordNet data) breaks only the attacks that need it. Adding an attack = one class + one line here.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from mmw.attacks.base import Attack, AttackError, AttackOutcome, Param, RateAttack
from mmw.errors import SpecError

__all__ = ["ATTACK_MODULES", "Attack", "AttackError", "AttackOutcome", "Param", "RateAttack",
           "attack_class", "build_attack", "build_attacks"]

ATTACK_MODULES: dict[str, str] = {
    "swap": "mmw.attacks.text",
    "lowercase": "mmw.attacks.text",
    "contraction": "mmw.attacks.text",
    "expansion": "mmw.attacks.text",
    "misspelling": "mmw.attacks.text",
    "typo": "mmw.attacks.text",
    "synonym": "mmw.attacks.synonym",
    "translation": "mmw.attacks.translation",
    "paraphrase": "mmw.attacks.paraphrase",
}


def attack_class(name: str, where: str = "attack") -> type[Attack]:
    """The Attack subclass registered under ``name``; SpecError if unknown, ImportError if its deps are missing."""
    if not isinstance(name, str) or name not in ATTACK_MODULES:
        raise SpecError(f"{where}.name", f"unknown attack {name!r}", sorted(ATTACK_MODULES))
    module_name = ATTACK_MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"{where}.name: attack {name!r} cannot be loaded from {module_name}: {error}") from error
    found = [obj for obj in vars(module).values()
             if inspect.isclass(obj) and issubclass(obj, Attack) and not inspect.isabstract(obj)
             and obj.__dict__.get("family") == name]
    if len(found) != 1:
        raise ImportError(f"{module_name} must define exactly one Attack with family={name!r}, found {len(found)}")
    return found[0]


def build_attack(spec: Mapping[str, Any], where: str = "attacks[i]") -> Attack:
    """Build the attack described by ``spec`` (``name`` plus its parameters); errors name ``<where>.<key>``."""
    if not isinstance(spec, Mapping):
        raise SpecError(where, f"expected a mapping like {{name: swap, p: 0.1}}, got {spec!r}",
                        sorted(ATTACK_MODULES))
    if "name" not in spec:
        raise SpecError(f"{where}.name", "required", sorted(ATTACK_MODULES))
    cls = attack_class(spec["name"], where)
    params = {k: v for k, v in spec.items() if k != "name"}
    if "where" in params:  # would collide with the constructor's own keyword
        raise SpecError(f"{where}.where", f"unknown parameter of attack {cls.family!r}",
                        [p.name for p in cls.parameters] or "no parameters")
    return cls(where=where, **params)


def build_attacks(specs: Sequence[Any] | None, where: str = "attacks.specs") -> list[Attack]:
    """Every attack of params ``attacks.specs`` (None = none), validated: errors name ``<where>[i].<key>``.

    An attack whose optional dependency is missing, or two specs naming the same attack, fail here, before any
    text is perturbed. Construction only validates parameters (models and lexicons load on first use).
    """
    attacks: list[Attack] = []
    names: dict[str, int] = {}
    for index, spec in enumerate(specs or []):
        at = f"{where}[{index}]"
        try:
            attack = build_attack(spec, at)
        except ImportError as err:
            raise SpecError(f"{at}.name", f"cannot be loaded ({str(err).splitlines()[0]})") from None
        if attack.name in names:
            raise SpecError(at, f"duplicate of {where}[{names[attack.name]}] (both are {attack.name!r})")
        names[attack.name] = index
        attacks.append(attack)
    return attacks
