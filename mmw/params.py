"""Loading and validating params.yaml for the pipeline stages.

Each section is a pydantic model (:mod:`mmw.validation`) living here when it is plain data, or with its consumer
when it needs the consumer's knowledge (``scheme:`` -> ``mmw.watermark.scheme.SchemeSpec``, ``quality:`` ->
``mmw.quality.params``): the stage passes those, ``load_params(path, ("seed", "scheme"), models={"scheme":
SchemeSpec})``, so this module imports no consumer (every stage imports it: anything it imports, even lazily,
enters every stage's DVC deps). A stage loads only the sections it declares and lists exactly those under
``params:`` in dvc.yaml; reading an undeclared section raises, so a stage cannot read a param DVC does not track.
Validation fails in seconds with a one-line ``SpecError`` ("<key>: <problem>; allowed: <values>") before any
model is loaded.

The checks that need a consumer's code (task names, attack specs, installed embedded models) are the consumers':
``mmw.board.load_board`` runs them all for the whole board (the ``key`` stage does, so a typo anywhere fails at
once), and each stage runs its own before heavy work (``build_prompts``, ``build_attacks``, ``load_model``).
Keeping them out of this module keeps every stage's import closure, hence its DVC deps, small.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import yaml

from mmw.errors import SpecError
from mmw.model_fields import (  # noqa: F401  (some re-exported: callers read the field types from mmw.params)
    DETECT_DEVICES,
    DEVICES,
    DTYPES,
    MODEL_SPECS,
    RATE_MODES,
    CompileMode,
    DecodeAttention,
    DetectDevice,
    Device,
    Dtype,
    Engine,
    JudgeBackend,
    ModelName,
    PromptPool,
    RateMode,
    choices,
)
from mmw.validation import Integer, Section, allowed, validate

if TYPE_CHECKING:
    from mmw.quality.params import LowEntropyParams, QualityParams
    from mmw.watermark.scheme import SchemeSpec

DEFAULT_PARAMS = Path("params.yaml")


class ModelParams(Section):
    """The generator: ``name`` as accepted by ``mmw.engines.models.load_model``."""

    name: ModelName = allowed(MODEL_SPECS)
    device: Device = allowed(DEVICES)
    dtype: Dtype = allowed(choices(Dtype))
    batch_size: Integer = allowed("an integer >= 1", ge=1)
    max_new_tokens: Integer = allowed("an integer >= 1", ge=1)
    # T = 0 is greedy decoding, which the paper evaluates too.
    temperature: float = allowed("a number in [0, 100]", ge=0.0, le=100.0)
    # Who runs the model: in-process transformers, or vLLM (mmw.engines.vllm_engine; `pip install vllm` on a CUDA
    # machine, scripts/setup-vllm.sh on a CPU). Same processor, same PRF, so detection is unchanged.
    engine: Engine = allowed(choices(Engine), default="transformers")



class PromptParams(Section):
    """``per_task`` None = every prompt of each task (of its ``pool``)."""

    # The names are checked by their consumer, mmw.tasks.build_prompts (and mmw.board for the whole board).
    tasks: list[str] = allowed("a non-empty list of task names (mmw.tasks.TASKS)", min_length=1)
    per_task: Integer | None = allowed("an integer >= 1, or null for every prompt", ge=1)
    # Skips the first ``offset`` prompts of each task's selection order: disjoint [offset, offset + per_task)
    # ranges are disjoint prompt sets (a sweep's tuning and confirmation prompts).
    offset: Integer = allowed("an integer >= 0", ge=0, default=0)
    # The core tasks' prompts: the paper's only (the default: per_task null is the paper's 296), or extended by
    # mmw's. A range past the pool fails (mmw.tasks.check_range) rather than shrink.
    pool: PromptPool = allowed(choices(PromptPool), default="paper")


class AttackParams(Section):
    """``fraction`` of each task (its first prompts) is attacked by every spec in ``specs``.

    Each spec is validated by its attack class: ``mmw.attacks.build_attacks``, the perturb stage's own code."""

    fraction: float = allowed("a number in [0, 1]", ge=0.0, le=1.0)
    specs: list[Any] | None = allowed("a list of mappings such as {name: swap, p: 0.1}")


class DetectParams(Section):
    device: DetectDevice = allowed(choices(DetectDevice))
    # Extra keys the baseline is re-detected with (FPR spread over keys, mmw.audit).
    audit_keys: Integer = allowed("an integer >= 0", ge=0)


class RateParams(Section):
    judge: ModelName = allowed(MODEL_SPECS)
    device: Device = allowed(DEVICES)
    dtype: Dtype = allowed(choices(Dtype))
    batch_size: Integer = allowed("an integer >= 1", ge=1)
    mode: RateMode = allowed(choices(RateMode))
    max_new_tokens: Integer = allowed("an integer >= 1", ge=1)
    # Where judgements come from (mmw.judge.backends, docs/JUDGE.md); the rest is for backend openai only.
    backend: JudgeBackend = allowed(choices(JudgeBackend), default="transformers")
    base_url: str = allowed("an http(s) URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1",
                            default="http://127.0.0.1:8000/v1", pattern=r"^https?://\S+$")
    api_key_env: str = allowed("an environment variable name such as OPENAI_API_KEY", default="OPENAI_API_KEY",
                               pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = allowed("a number in (0, 3600]", default=120.0, gt=0.0, le=3600.0)
    max_retries: Integer = allowed("an integer in [0, 10]", default=3, ge=0, le=10)
    concurrency: Integer = allowed("an integer in [1, 256]", default=4, ge=1, le=256)



class EngineParams(Section):
    """How the transformers engine computes on CUDA: each switch picks kernels or a compilation, so it can change
    generated texts (by rounding) or a judgement's last digits, and it is a param like any other (docs/GPU.md,
    "Engine switches"). None of them acts on a CPU, where the defaults' outputs are those of every setting.
    The vLLM engine and backends take none of them."""

    # The generator decodes through mmw.engines.graph_decode's own loop over a static cache (false: transformers'
    # generate).
    static_decode: bool = allowed("true or false", default=True)
    # That loop's step captured as one CUDA graph (false: the same step run eagerly).
    graph_decode: bool = allowed("true or false", default=True)
    # The generator's decoding-step attention: flex (compiled flex_attention over the written cache blocks; outside
    # the static loop as efficient), efficient (query heads folded, memory-efficient SDPA kernel; both repeat bit
    # for bit) or sdpa (SDPA's own choice, cuDNN on Hopper: not run-to-run reproducible).
    decode_attention: DecodeAttention = allowed(choices(DecodeAttention), default="flex")
    # The watermark step through torch.compile (false: eager, the same function).
    compile_step: bool = allowed("true or false", default=True)
    # torch.compile's mode for the step outside the captured loop (the loop's capture uses "default").
    compile_mode: CompileMode = allowed(choices(CompileMode), default="reduce-overhead")
    # The generator's norms, rotary embedding and gated activation through torch.compile inside that loop
    # (mmw.engines.fused_layers; false: transformers' eager code).
    fuse_layers: bool = allowed("true or false", default=True)
    # The judge's decoder layers through torch.compile for its expected-mode forward (false: eager).
    compile_judge: bool = allowed("true or false", default=True)

    @property
    def compiles_generation(self) -> bool:
        """Whether generation on CUDA compiles anything: the watermark step, or inside mmw's own loop the fused
        layers or flex attention (the stage then starts and waits for Inductor's compile workers)."""
        return self.compile_step or (self.static_decode and (self.fuse_layers or self.decode_attention == "flex"))


class _Seed(Section):
    seed: Integer = allowed("an integer >= 0", ge=0)


class _Key(Section):
    key: str | int | None = allowed("a string (or set $MMW_KEY)")


class SectionModel(Protocol):
    """What validates a consumer section: a ``mmw.validation.Section`` model, or ``mmw.watermark.scheme.SchemeSpec``."""

    @classmethod
    def from_params(cls, data: Any, prefix: str) -> Any: ...


T = TypeVar("T")


class Board(Generic[T]):
    """One top-level entry of params.yaml, declared on :class:`Params`: how it is validated, and (as a descriptor)
    the typed value a stage reads.

    ``model`` validates it here: a section model, or with ``scalar`` a one-field model of a plain value. Without a
    model it is a consumer's section, validated by the model the stage passes (``load_params(..., models=)``).
    ``optional``: it may be absent (a scalar is then None, a consumer section gets its model's defaults)."""

    def __init__(self, model: type[Section] | None = None, *, scalar: bool = False, optional: bool = False) -> None:
        self.model, self.scalar, self.optional = model, scalar, optional
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Board[T]: ...
    @overload
    def __get__(self, obj: Params, owner: type) -> T: ...

    def __get__(self, obj: Params | None, owner: type) -> Board[T] | T:
        return self if obj is None else obj._get(self.name)

    def _data(self, raw: Mapping[str, Any]) -> Any:
        if self.optional:
            return raw.get(self.name) if self.scalar else raw.get(self.name) or {}
        if self.name not in raw:
            raise SpecError(self.name, "missing section")
        return raw[self.name]

    def validate(self, raw: Mapping[str, Any], models: Mapping[str, type[SectionModel]]) -> T:
        """This entry of the parsed params ``raw`` validated; SpecError naming the first offending key."""
        if self.model is None:
            if self.name not in models:
                raise KeyError(f"params section {self.name!r} is validated by its consumer's model: pass "
                               f"models={{{self.name!r}: ...}}")
            return models[self.name].from_params(self._data(raw), self.name)  # type: ignore[no-any-return]
        if self.scalar:  # errors name the entry itself: "seed: ..."
            value = validate(self.model, {self.name: self._data(raw)}, "")
            return getattr(value, self.name)  # type: ignore[no-any-return]
        return validate(self.model, self._data(raw), self.name)  # type: ignore[return-value]


class Params:
    """The validated board: one typed attribute per top-level entry of params.yaml, in the file's order, restricted
    to the sections a stage declared (reading another one raises KeyError)."""

    seed: Board[int] = Board(_Seed, scalar=True)
    #: The key as written in params (``mmw.keys.resolve_key`` lets ``$MMW_KEY`` win); never a DVC param.
    key: Board[str | int | None] = Board(_Key, scalar=True, optional=True)
    model: Board[ModelParams] = Board(ModelParams)
    prompts: Board[PromptParams] = Board(PromptParams)
    scheme: Board[SchemeSpec] = Board()
    attacks: Board[AttackParams] = Board(AttackParams)
    detect: Board[DetectParams] = Board(DetectParams)
    rate: Board[RateParams] = Board(RateParams)
    low_entropy: Board[LowEntropyParams] = Board(optional=True)
    quality: Board[QualityParams] = Board(optional=True)
    #: Absent: every switch at its default (the stages that read it list its keys in dvc.yaml, so a DVC run needs it).
    engine: Board[EngineParams] = Board(EngineParams, optional=True)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def _get(self, name: str) -> Any:
        if name not in self._values:
            raise KeyError(f"params section {name!r} was not loaded: add it to the stage's load_params() sections "
                           "and to its params: in dvc.yaml")
        return self._values[name]

    @property
    def sections(self) -> tuple[str, ...]:
        return tuple(self._values)


#: Top-level entries of params.yaml, in order. ``key`` is the watermark key (``$MMW_KEY`` wins): never a DVC param.
BOARD: dict[str, Board[Any]] = {name: entry for name, entry in vars(Params).items() if isinstance(entry, Board)}
SECTIONS = tuple(BOARD)


def check_task_names(tasks: list[str], known: Iterable[str]) -> None:
    """Every name in params ``prompts.tasks`` is one of ``known`` (``mmw.tasks.TASKS``), once; SpecError if not."""
    known = tuple(known)
    for index, task in enumerate(tasks):
        if task not in known:
            raise SpecError(f"prompts.tasks[{index}]", f"unknown value {task!r}", known)
    if len(set(tasks)) != len(tasks):
        raise SpecError("prompts.tasks", f"duplicate task in {tasks}", known)


def parse_params(raw: Any, sections: Iterable[str] | None = None,
                 models: Mapping[str, type[SectionModel]] | None = None) -> Params:
    """Validate the ``sections`` (default: all of this module's, plus those of ``models``) of a parsed params
    mapping; ``models`` gives the consumer-owned sections' models. No consumer checks (``mmw.board``).

    Raises ``SpecError`` naming the first offending key. Unknown top-level keys fail in every case.
    """
    if not isinstance(raw, dict):
        raise SpecError("params", f"expected a mapping at the top level, got {type(raw).__name__}", SECTIONS)
    for name in raw:
        if name not in SECTIONS:
            raise SpecError(name, "unknown top-level key", SECTIONS)
    models = dict(models or {})
    own = tuple(name for name, entry in BOARD.items() if entry.model is not None)
    wanted = own + tuple(models) if sections is None else tuple(sections)
    # Tooling hook (no cost without a listener): tests/test_deps.py checks each stage's sections against dvc.yaml.
    sys.audit("mmw.params.load", wanted)
    values: dict[str, Any] = {}
    for name in wanted:
        if name not in BOARD:
            raise KeyError(f"no params section {name!r}; sections: {', '.join(SECTIONS)}")
        values[name] = BOARD[name].validate(raw, models)
    return Params(values)


def load_params(path: str | Path = DEFAULT_PARAMS, sections: Iterable[str] | None = None,
                models: Mapping[str, type[SectionModel]] | None = None) -> Params:
    """Read a params YAML file and validate its ``sections`` (default: all) as :func:`parse_params` does."""
    return parse_params(read_params(path), sections, models)


def read_params(path: str | Path = DEFAULT_PARAMS) -> Any:
    """The parsed YAML of a params file, unvalidated; SpecError if it is missing or not YAML."""
    path = Path(path)
    if not path.is_file():
        raise SpecError("params", f"file {str(path)!r} not found", "a params.yaml path")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError("params", f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
    return raw

