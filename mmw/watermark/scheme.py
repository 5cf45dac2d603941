"""SchemeSpec: one validated watermark configuration (the ``scheme:`` section of params.yaml).

A scheme chooses three parts — a randomness source, a sampler, a score — and each part's class declares which
keys it uses, which it does not, and which combinations it refuses (``mmw.validation.Part``: the paper's
"limitations of building blocks"). One validator applies those declarations; an error names the key and says what
is allowed. A key whose value is ``null`` counts as absent, so ``dvc exp run -S scheme.sampler=exponential -S
scheme.delta=null`` switches schemes cleanly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import ModelWrapValidatorHandler, ValidationError, ValidationInfo, model_validator

from mmw.watermark import plugins
from mmw.errors import SpecError
from mmw.watermark.randomness import SOURCES
from mmw.watermark.samplers import WATERMARKING
from mmw.watermark.samplers.binary_code import CODES
from mmw.watermark.samplers.parts import LAYER_WEIGHTS, MAX_LAYERS, MAX_LEAVES
from mmw.watermark.scores import SCORES as SCORE_PARTS
from mmw.validation import Integer, Key, Part, Section, Unused, allowed, allowed_text, validate

#: The parts a scheme chooses, by the key that chooses them; the order in which their rules apply is
#: :func:`_resolve`'s.
PARTS: dict[str, dict[str, type[Part]]] = {
    "sampler": {cls.name: cls for cls in WATERMARKING},
    "randomness": dict(SOURCES),
    "score": dict(SCORE_PARTS),
}
SAMPLERS = tuple(PARTS["sampler"])
RANDOMNESS = tuple(PARTS["randomness"])
SCORES = tuple(PARTS["score"])


class SchemeSpec(Section):
    """A watermark = randomness source R + sampler C + score S (+ their parameters).

    ``window`` is H (R1/R2), ``key_length`` is L (R3). ``delta``/``gamma`` belong to the distribution-shift
    sampler, ``skip_prob`` to the distortion-free ones, ``psi`` to the edit score and ``trials`` to the
    empirical (permutation) null used by the align and edit scores. :meth:`from_params` validates a params
    mapping and normalizes it (defaults filled in, the keys no part uses set to None); ``SchemeSpec(**values)``
    rebuilds a spec from normalized values (``to_dict``) with the types checked.
    """

    sampler: Literal[SAMPLERS] = allowed(", ".join(SAMPLERS))  # type: ignore[valid-type]
    randomness: Literal[RANDOMNESS] | None = allowed(", ".join(RANDOMNESS), default=None)  # type: ignore[valid-type]
    window: Integer | None = allowed("an integer >= 0", default=None, ge=0, le=1 << 20)
    key_length: Integer | None = allowed("an integer >= 1", default=None, ge=1, le=1 << 24)
    delta: float | None = allowed("a number > 0", default=None, gt=0.0, le=1e6)
    gamma: float | None = allowed("a number in (0, 1)", default=None, gt=0.0, lt=1.0)
    skip_prob: float = allowed("a number in [0, 1)", default=0.0, ge=0.0, lt=1.0)
    score: Literal[SCORES] | None = allowed(", ".join(SCORES), default=None)  # type: ignore[valid-type]
    psi: float | None = allowed("a number >= 0", default=None, ge=0.0, le=1e6)
    trials: Integer | None = allowed("an integer >= 1", default=None, ge=1, le=1 << 20)
    alpha: float = allowed("a number in (0, 1)", default=0.02, gt=0.0, lt=1.0)
    binary_code: Literal[CODES] | None = allowed(", ".join(CODES), default=None)  # type: ignore[valid-type]
    reweight_alpha: float | None = allowed("a number in (0, 0.5]", default=None, gt=0.0, le=0.5)
    # C1: sample a context seen before in the generation plainly (vLLM's gumbel, SynthID's repeated-context mask).
    mask_repeated: bool | None = allowed("true or false", default=None)
    # The tournament sampler (SynthID-Text): layers m and candidates per match.
    layers: Integer | None = allowed(f"an integer in [1, {MAX_LAYERS}]", default=None, ge=1, le=MAX_LAYERS)
    leaves: Integer | None = allowed(f"an integer in [2, {MAX_LEAVES}]", default=None, ge=2, le=MAX_LEAVES)
    layer_weights: Literal[tuple(LAYER_WEIGHTS)] | None = allowed(  # type: ignore[valid-type]
        ", ".join(LAYER_WEIGHTS), default=None)
    plugin: str | None = allowed("an installed plugin's name (entry-point group mmw.watermarks)", default=None)
    # A string holding a YAML/JSON mapping is parsed (mmw.watermark.plugins.parse_plugin_params): `dvc exp run -S` replaces a
    # string whole, where it merges a mapping into the previous plugin's keys.
    plugin_params: dict[str, Any] | str | None = allowed("a mapping the plugin's own model accepts (or a string "
                                                         "holding one)", default=None)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_params(cls, params: Any, prefix: str = "scheme") -> Self:
        """Validate a params mapping; raises SpecError naming ``<prefix>.<key>``."""
        if not isinstance(params, dict):
            raise SpecError(prefix, f"expected a mapping, got {type(params).__name__}")
        return validate(cls, params, prefix)

    @model_validator(mode="wrap")
    @classmethod
    def _rules(cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo) -> Self:
        """Params (validated through :func:`mmw.validation.validate`, which names the prefix): drop nulls, check
        each key's type and range, then apply the parts' rules. Anything else: the types only."""
        prefix = (info.context or {}).get("prefix")
        if prefix is None or not isinstance(data, Mapping):
            return handler(data)
        if data.get("key") is not None:
            raise SpecError(f"{prefix}.key", "the watermark key is the top-level `key:` of params (or $MMW_KEY), "
                            "not part of the scheme", KNOWN_KEYS)
        present = {k: v for k, v in data.items() if v is not None}
        # mmw's own blocks need a randomness source and a score; a plugin brings its own. Their absence is reported
        # where pydantic would report a missing required field: in field order among the other errors.
        missing = [] if present.get("sampler") == "plugin" else [k for k in _BLOCK_KEYS if k not in present]
        try:
            given = handler(present)
        except ValidationError as err:
            if not missing:
                raise
            errors = [*err.errors(include_url=False), *({"type": "missing", "loc": (k,), "input": present}
                                                        for k in missing)]
            order = {k: i for i, k in enumerate(cls.model_fields)}
            errors.sort(key=lambda e: order.get(str(e["loc"][0]), -1) if e["loc"] else -1)
            raise ValidationError.from_exception_data(err.title, errors) from None  # type: ignore[arg-type]
        if missing:
            raise SpecError(f"{prefix}.{missing[0]}", "missing", allowed_text(SchemeSpec, missing[0]))
        resolve = _resolve_plugin if given.sampler == "plugin" else _resolve
        return given.model_copy(update=resolve(given, prefix))

    # ------------------------------------------------------------------ views
    @property
    def is_plugin(self) -> bool:
        """An outside watermark (``mmw.watermark.plugins``): it brings its own randomness, sampling and detection."""
        return self.sampler == "plugin"

    @property
    def text_dependent(self) -> bool:
        return PARTS["randomness"][self.randomness].text_dependent  # type: ignore[attr-defined,no-any-return]

    @property
    def exact_null(self) -> bool:
        """Sum scores have exact nulls (Gamma/Binomial); align and edit use the permutation test."""
        if self.is_plugin:  # a plugin's pivots come with a declared exact null; its p-values alone do not
            return plugins.no_pivot_reason(self) is None
        return PARTS["score"][self.score].exact_null  # type: ignore[attr-defined,no-any-return]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict without unset fields (safe to log: the key is never part of the spec)."""
        return self.model_dump(exclude_none=True)

    def describe(self) -> str:
        if self.is_plugin:
            params = " ".join(f"{k}={v}" for k, v in sorted((self.plugin_params or {}).items()))
            return f"plugin {self.plugin}" + (f" {params}" if params else "")
        parts = [self.sampler, self.randomness]
        parts.append(f"H={self.window}" if self.text_dependent else f"L={self.key_length}")
        if self.delta is not None:
            parts.append(f"delta={self.delta:g} gamma={self.gamma:g}")
        if self.reweight_alpha is not None:
            parts.append(f"alpha={self.reweight_alpha:g} gamma={self.gamma:g}")
        if self.layers is not None:
            parts.append(f"m={self.layers} leaves={self.leaves}")
            if self.layer_weights not in (None, "uniform"):
                parts.append(f"weights={self.layer_weights}")
        if self.skip_prob:
            parts.append(f"skip={self.skip_prob:g}")
        if self.mask_repeated:
            parts.append("repeats plain")
        parts.append(self.score + (f"(psi={self.psi:g})" if self.psi is not None else ""))
        return " ".join(parts)


#: The part choices mmw's own blocks require (a plugin scheme has neither).
_BLOCK_KEYS = ("randomness", "score")
#: The scheme's keys, in declaration order (what an unknown key's error lists).
KNOWN_KEYS = tuple(SchemeSpec.model_fields)
#: Each key's declarations: the ``Key`` rules of every part that uses it.
_DECLARED_KEYS: dict[str, list[Key]] = {
    k: [rule for parts in PARTS.values() for part in parts.values() for rule in part.scheme_keys
        if isinstance(rule, Key) and rule.name == k] for k in KNOWN_KEYS}
#: The keys that shape only generation: no detector reads them (a detection is the same for any value). Declared on
#: the parts' keys (``Key(..., generation_only=True)`` by every part that uses the key), in the scheme's key order.
GENERATION_ONLY = tuple(k for k, rules in _DECLARED_KEYS.items() if rules and all(r.generation_only for r in rules))
#: The keys detection reads: dvc.yaml's detection stages depend on exactly these, so a change of a generation-only
#: key reruns no detection of the unwatermarked baseline.
DETECTION_KEYS = tuple(key for key in KNOWN_KEYS if key not in GENERATION_ONLY)
#: Each part kind's keys: every key one of its parts names (a key belongs to one kind).
_OWNED: dict[str, tuple[str, ...]] = {
    kind: tuple(k for k in KNOWN_KEYS if any(rule.name == k for part in parts.values() for rule in part.scheme_keys))
    for kind, parts in PARTS.items()
}
if sum(map(len, _OWNED.values())) != len(set().union(*_OWNED.values())):
    raise TypeError(f"a scheme key is named by parts of two kinds: {_OWNED}")


#: The keys a plugin scheme uses; every other scheme key belongs to mmw's own blocks.
PLUGIN_KEYS = ("sampler", "plugin", "plugin_params", "alpha")


def _resolve_plugin(spec: SchemeSpec, prefix: str) -> dict[str, Any]:
    """A plugin scheme: the plugin installed and loadable, its parameters valid under its own model, and none of
    mmw's own blocks' keys given (the plugin brings its randomness, sampling and score)."""
    for name in KNOWN_KEYS:
        if name not in PLUGIN_KEYS and name in spec.model_fields_set:
            raise SpecError(f"{prefix}.{name}", "not used by sampler=plugin (the plugin brings its own randomness, "
                            "sampling and score); remove it or set it to null")
    if spec.plugin is None:
        raise SpecError(f"{prefix}.plugin", "required with sampler=plugin", sorted(plugins.installed()) or None)
    values = spec.model_dump()
    values["plugin_params"] = plugins.validate_params(spec.plugin, spec.plugin_params, prefix)
    return values


def _resolve(spec: SchemeSpec, prefix: str) -> dict[str, Any]:
    """The parts' rules on the type-checked ``spec``: its normalized values, or SpecError naming the key.

    Order: the randomness source's keys and refusals, the score's and the sampler's refusals, then the sampler's
    keys and the score's keys (the first rule broken is the one reported)."""
    given = spec.model_fields_set
    values = spec.model_dump()
    for kind in ("randomness", "score"):
        if values[kind] is None:
            raise SpecError(f"{prefix}.{kind}", "missing", allowed_text(SchemeSpec, kind))
    parts = {kind: PARTS[kind][values[kind]] for kind in PARTS}

    def fail(key: str, problem: str, shown: Any = None) -> None:
        raise SpecError(f"{prefix}.{key}", problem, shown)

    def unused(kind: str, name: str) -> str:
        users = [p for p in PARTS[kind].values() if any(isinstance(r, Key) and r.name == name for r in p.scheme_keys)]
        purpose = next((r.purpose for p in users for r in p.scheme_keys if r.name == name and r.purpose), None)
        purpose = purpose or f"for {kind}={'|'.join(p.name for p in users)}"
        return f"{parts[kind].chosen.format(name=parts[kind].name)} ({name} is {purpose})"

    def keys(kind: str) -> None:
        part = parts[kind]
        for rule in part.scheme_keys:
            if isinstance(rule, Unused):
                if rule.name in given:
                    fail(rule.name, f"not used {rule.reason or unused(kind, rule.name)}; remove it or set it to null")
                continue
            if rule.name not in given:
                if rule.required:
                    fail(rule.name, f"required with {kind}={part.name}", allowed_text(SchemeSpec, rule.name))
                values[rule.name] = rule.default
            refused = rule.check(values) if rule.check is not None else None
            if refused is not None:
                fail(rule.name, *refused)
        named = {rule.name for rule in part.scheme_keys}
        for name in _OWNED[kind]:
            if name not in named and name in given:
                fail(name, f"not used {unused(kind, name)}; remove it or set it to null")

    def refusals(kind: str) -> None:
        for rule in parts[kind].refuses:
            if rule.when(values):
                fail(rule.key, rule.problem.format(**values), rule.allowed)

    keys("randomness")
    refusals("randomness")
    refusals("score")
    refusals("sampler")
    keys("sampler")
    keys("score")
    return values
