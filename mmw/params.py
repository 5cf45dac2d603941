"""Loading and validating params.yaml for the pipeline stages.

Every stage validates the whole board up front, before any model is loaded, so a typo fails in seconds with a
one-line ``SpecError`` ("<key>: <problem>; allowed: <values>") instead of after an hour of generation.
The ``scheme:`` section is validated by the watermark core (``SchemeSpec.from_params``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mmw.errors import SpecError
from mmw.scheme import SchemeSpec

DEFAULT_PARAMS = Path("params.yaml")
SECTIONS = ("seed", "model", "prompts", "scheme", "attacks", "detect", "rate")
DEVICES = "auto, cpu, cuda, cuda:N"
DTYPES = ("auto", "float32", "float16", "bfloat16")
RATE_MODES = ("auto", "greedy", "expected")


@dataclass(frozen=True)
class ModelParams:
    """The generator: ``name`` as accepted by ``mmw.engines.models.load_model``."""

    name: str
    device: str
    dtype: str
    batch_size: int
    max_new_tokens: int
    temperature: float


@dataclass(frozen=True)
class PromptParams:
    """``per_task`` None = every prompt of each task."""

    tasks: tuple[str, ...]
    per_task: int | None


@dataclass(frozen=True)
class AttackParams:
    """``fraction`` of each task (its first prompts) is attacked by every spec in ``specs``."""

    fraction: float
    specs: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class DetectParams:
    device: str


@dataclass(frozen=True)
class RateParams:
    judge: str
    device: str
    dtype: str
    batch_size: int
    mode: str
    max_new_tokens: int


@dataclass(frozen=True)
class Params:
    """The validated board. ``scheme_raw`` keeps the section as written (for the key and for reports)."""

    seed: int
    model: ModelParams
    prompts: PromptParams
    scheme: SchemeSpec
    scheme_raw: dict[str, Any]
    attacks: AttackParams
    detect: DetectParams
    rate: RateParams


def _section(raw: dict[str, Any], name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if name not in raw:
        raise SpecError(name, "missing section", keys)
    section = raw[name]
    if not isinstance(section, dict):
        raise SpecError(name, f"expected a mapping, got {type(section).__name__}", keys)
    for key in section:
        if key not in keys:
            raise SpecError(f"{name}.{key}", "unknown key", keys)
    for key in keys:
        if key not in section:
            raise SpecError(f"{name}.{key}", "missing", keys)
    return section


def _integer(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(key, f"expected an integer >= {minimum}, got {value!r}", f"an integer >= {minimum}")
    return value


def _number(value: Any, key: str, low: float, high: float, low_open: bool, high_open: bool) -> float:
    shown = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(key, f"expected a number, got {value!r}", shown)
    value = float(value)
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        raise SpecError(key, f"{value:g} is out of range", shown)
    return value


def _choice(value: Any, key: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise SpecError(key, f"unknown value {value!r}", allowed)
    return value


def _device(value: Any, key: str) -> str:
    if not isinstance(value, str) or not (value in ("auto", "cpu", "cuda") or
                                          (value.startswith("cuda:") and value[5:].isdigit())):
        raise SpecError(key, f"unknown device {value!r}", DEVICES)
    return value


def _model_name(value: Any, key: str) -> str:
    """Cheap existence checks; the loader (``mmw.engines.models``) does the full resolution later."""
    from mmw.engines import models

    if not isinstance(value, str) or not value.strip():
        raise SpecError(key, f"expected a model name, got {value!r}", models.ALLOWED_SPECS)
    try:
        if value.startswith(models.EMBEDDED_PREFIX):
            models.embedded_files(value[len(models.EMBEDDED_PREFIX):])
            return value
    except SpecError as err:  # the loader names model.name; this may be rate.judge
        raise SpecError(key, err.problem, err.allowed) from None
    path = Path(value).expanduser()
    looks_like_path = path.is_absolute() or value.startswith((".", "~")) or value.endswith(".gguf") \
        or value.count("/") > 1
    if looks_like_path and not path.exists():
        raise SpecError(key, f"path {value!r} does not exist", models.ALLOWED_SPECS)
    return value


def _model(raw: dict[str, Any]) -> ModelParams:
    section = _section(raw, "model", ("name", "device", "dtype", "batch_size", "max_new_tokens", "temperature"))
    return ModelParams(
        name=_model_name(section["name"], "model.name"),
        device=_device(section["device"], "model.device"),
        dtype=_choice(section["dtype"], "model.dtype", DTYPES),
        batch_size=_integer(section["batch_size"], "model.batch_size", 1),
        max_new_tokens=_integer(section["max_new_tokens"], "model.max_new_tokens", 1),
        # T = 0 is greedy decoding, which the paper evaluates too.
        temperature=_number(section["temperature"], "model.temperature", 0.0, 100.0, False, False),
    )


def _prompts(raw: dict[str, Any]) -> PromptParams:
    from mmw.tasks import TASKS

    allowed = tuple(TASKS)
    section = _section(raw, "prompts", ("tasks", "per_task"))
    tasks = section["tasks"]
    if not isinstance(tasks, list) or not tasks:
        raise SpecError("prompts.tasks", f"expected a non-empty list, got {tasks!r}", allowed)
    for index, task in enumerate(tasks):
        _choice(task, f"prompts.tasks[{index}]", allowed)
    if len(set(tasks)) != len(tasks):
        raise SpecError("prompts.tasks", f"duplicate task in {tasks}", allowed)
    per_task = section["per_task"]
    if per_task is not None:
        per_task = _integer(per_task, "prompts.per_task", 1)
    return PromptParams(tasks=tuple(tasks), per_task=per_task)


def _attacks(raw: dict[str, Any]) -> AttackParams:
    from mmw.attacks import build_attack

    section = _section(raw, "attacks", ("fraction", "specs"))
    fraction = _number(section["fraction"], "attacks.fraction", 0.0, 1.0, False, False)
    specs = section["specs"] if section["specs"] is not None else []
    if not isinstance(specs, list):
        raise SpecError("attacks.specs", f"expected a list of attack specs, got {specs!r}",
                        "a list of mappings such as {name: swap, p: 0.1}")
    names: dict[str, int] = {}
    for index, spec in enumerate(specs):
        where = f"attacks.specs[{index}]"
        try:
            # Constructing an attack only validates its parameters; models and lexicons load on first use.
            name = build_attack(spec, where).name
        except ImportError as err:
            raise SpecError(f"{where}.name", f"cannot be loaded ({str(err).splitlines()[0]})") from None
        if name in names:
            raise SpecError(where, f"duplicate of attacks.specs[{names[name]}] (both are {name!r})")
        names[name] = index
    return AttackParams(fraction=fraction, specs=tuple(specs))


def _rate(raw: dict[str, Any]) -> RateParams:
    section = _section(raw, "rate", ("judge", "device", "dtype", "batch_size", "mode", "max_new_tokens"))
    return RateParams(
        judge=_model_name(section["judge"], "rate.judge"),
        device=_device(section["device"], "rate.device"),
        dtype=_choice(section["dtype"], "rate.dtype", DTYPES),
        batch_size=_integer(section["batch_size"], "rate.batch_size", 1),
        mode=_choice(section["mode"], "rate.mode", RATE_MODES),
        max_new_tokens=_integer(section["max_new_tokens"], "rate.max_new_tokens", 1),
    )


def parse_params(raw: Any) -> Params:
    """Validate a parsed params mapping; raises ``SpecError`` naming the first offending key."""
    if not isinstance(raw, dict):
        raise SpecError("params", f"expected a mapping at the top level, got {type(raw).__name__}", SECTIONS)
    for key in raw:
        if key not in SECTIONS:
            raise SpecError(key, "unknown top-level key", SECTIONS)
    if "seed" not in raw:
        raise SpecError("seed", "missing", "an integer >= 0")
    seed = _integer(raw["seed"], "seed", 0)
    if "scheme" not in raw:
        raise SpecError("scheme", "missing section")
    scheme_raw = raw["scheme"]
    from mmw.detector import DEVICES as DETECT_DEVICES

    detect = _section(raw, "detect", ("device",))
    return Params(
        seed=seed,
        model=_model(raw),
        prompts=_prompts(raw),
        scheme=SchemeSpec.from_params(scheme_raw),
        scheme_raw=dict(scheme_raw),
        attacks=_attacks(raw),
        detect=DetectParams(device=_choice(detect["device"], "detect.device", DETECT_DEVICES)),
        rate=_rate(raw),
    )


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Read and validate a params YAML file."""
    path = Path(path)
    if not path.is_file():
        raise SpecError("params", f"file {str(path)!r} not found", "a params.yaml path")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError("params", f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
    return parse_params(raw)


def derive_seed(seed: int, *parts: str) -> int:
    """A 63-bit seed for one unit of work (e.g. ``derive_seed(seed, "attack", prompt_id, attack_name)``).

    Hashing the parts (not Python's salted ``hash()``) makes it stable across processes and machines, and
    independent of the order in which units are processed.
    """
    message = "\x00".join([str(seed), *parts]).encode()
    return int.from_bytes(hashlib.blake2b(message, digest_size=8).digest(), "little") >> 1
