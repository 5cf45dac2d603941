"""Sweep definitions (``sweeps/<name>.yaml``): a version-controlled grid that expands to validated configs.

A definition file holds::

    description: one line
    base: {dotted.param: value, ...}        # set on every config (the scale: prompts, tokens, attacks, judge)
    temperatures: [0.0, 0.3, 0.7, 1.0]      # crossed with every grid (model.temperature)
    grids:                                  # a union of Cartesian products, one per entry
      - name: ds-sum-window
        scheme.sampler: distribution_shift  # a scalar is one value, a list is an axis
        scheme.window: [1, 2, 3]
    reevaluate: {k: 5, first_seed: 1000}    # each pick is re-run with seeds first_seed .. first_seed+k-1
    confirm: {prompts: 20, level: 0.05, max_tries: 2}   # held-out prompts per task for the re-runs (optional)
    adaptive: {shards: [4, 16, 64], level: 0.05, budget_s: null}   # race the tuning prompts (optional; needs confirm)
    extends: paper                          # optional: start from sweeps/paper.yaml; this file's keys win (base
                                            # merged key by key)

Every config sets the whole ``scheme`` section (keys a grid does not name are set to null, so one config never
inherits another's parameters) except the key, which is never a param of a sweep. A config's identity,
``config_id``, is a stable hash of its overrides (sorted JSON), so a rerun of the sweep recognises finished
configs whatever order the grid is written in.

Everything is validated before anything is queued, by the params' mechanism (:mod:`mmw.validation`): the file is
a :class:`SweepFile` section model (its fields' types and ranges; its validator checks the keys against the
repository's ``params.yaml`` and the confirmation prompts), and every expanded config is validated by the params
sections and :class:`mmw.watermark.scheme.SchemeSpec`. Errors are :class:`SpecError` naming the file, the entry and the
allowed values (``sweeps/small.yaml: grids[2] (ds-sum): scheme.delta: ...``).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import BeforeValidator, ValidationInfo, model_validator

from mmw.errors import SpecError
from mmw.watermark.scheme import KNOWN_KEYS, SchemeSpec
from mmw.params import parse_params
from mmw.sweep.confirm import CANNOT, QUALITY_LOSSES, Confirmation
from mmw.sweep.cost import cost_for_pack
from mmw.sweep.schedule import Schedule, schedule_from
from mmw.validation import Integer, Section, allowed, allowed_text, validate

SWEEPS_DIR = Path("sweeps")
TEMPERATURE = "model.temperature"
#: Scheme keys a sweep sets on every config (all but the key, which only ever comes from the environment).
SCHEME_KEYS = tuple(f"scheme.{k}" for k in KNOWN_KEYS if k != "key")
#: Params a sweep must never set: the watermark key (either layout: ``scheme.key`` or the top-level ``key``).
FORBIDDEN = frozenset({"scheme.key", "key"})
#: Params that must take one value over a whole sweep: picks compare runs, and runs of different generators,
#: engines or judges are not comparable.
SINGLE_VALUED = ("model.name", "model.engine", "rate.judge", "rate.backend", "rate.base_url", "rate.mode")
#: Fewest confirmation prompts for an interval (mmw.sweep.confirm.MIN_PROMPTS).
MIN_CONFIRM_PROMPTS = 5


@dataclass(frozen=True)
class Config:
    """One point of the sweep. ``overrides``: dotted param -> value (what ``dvc exp run -S`` sets), sorted.

    ``grid``: the name of the grid entry it came from; ``config_id``: 10 hex digits of a hash of ``overrides``.
    """

    config_id: str
    grid: str
    overrides: dict[str, Any]


def _or_empty(value: Any) -> Any:
    """A section written with no entries (``base:``) is an empty mapping."""
    return {} if value is None else value


#: The dotted params of a base or grid entry and their values (a list is an axis of the grid).
Entries = Annotated[dict[str, Any], BeforeValidator(_or_empty)]


class Reevaluation(Section):
    """How picks are re-evaluated: ``k`` runs with seeds ``first_seed .. first_seed + k - 1`` and fresh keys."""

    k: Integer = allowed("an integer >= 1", ge=1, default=5)
    first_seed: Integer = allowed("an integer >= 0", ge=0, default=1000)

    @property
    def seeds(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.k))


def _mapping_text(model: type[Section]) -> str:
    """What a nested section accepts, from its fields: "{k: an integer >= 1, first_seed: ...}"."""
    return "{" + ", ".join(f"{name}: {allowed_text(model, name)}" for name in model.model_fields) + "}"


class SweepFile(Section):
    """A sweep definition file as written. Validated with ``context={"board": <params mapping>}`` (see
    :func:`read_definition`), its validator checks every dotted key against the board and the confirmation prompts
    against the tuning prompts; without a board only the file's shape is checked."""

    description: str = allowed("one line of text", default="")
    base: Entries = allowed("a mapping of dotted params to values, set on every config", default={})
    temperatures: Any = allowed("a list of temperatures (model.temperature), each crossed with every grid",
                                default=None)
    grids: list[Entries] = allowed("a non-empty list of grid entries (mappings of dotted params to a value or a "
                                   "list of values)", min_length=1)
    reevaluate: Annotated[Reevaluation, BeforeValidator(_or_empty)] = allowed(
        _mapping_text(Reevaluation), default=Reevaluation())
    confirm: Confirmation | None = allowed(_mapping_text(Confirmation), default=None)
    #: The race's schedule as written: its values checked here, the rules between them and against the configs
    #: and tasks by :func:`expand` (:func:`mmw.sweep.schedule.schedule_from`).
    adaptive: Schedule | None = allowed(_mapping_text(Schedule), default=None)
    #: Configurations per unit (:mod:`mmw.sweep.pack`): 1 = one ``dvc exp run`` each; k > 1 = up to k that share a
    #: baseline in one process; 0 = all that share one.
    pack: Integer = allowed("an integer >= 0 (configurations per unit: 1 = one DVC experiment each, 0 = every "
                            "configuration that shares a baseline in one process)", ge=0, default=1)

    @model_validator(mode="after")
    def _against_board(self, info: ValidationInfo) -> Self:
        board = (info.context or {}).get("board")
        if board is not None:
            _check_keys("base", self.base, board)
            for index, grid in enumerate(self.grids):
                where = self.grid_label(index)
                _check_keys(where, {key: value for key, value in grid.items() if key != "name"}, board)
                if TEMPERATURE in grid:
                    raise SpecError(f"{where}: {TEMPERATURE}",
                                    "set temperatures at the top level (crossed with every grid)")
                for key, value in grid.items():
                    if key != "name" and _axis(value) == []:
                        raise SpecError(f"{where}: {key}", "empty list (the grid would have no config)")
            self.confirmation(board)
        return self

    def grid_label(self, index: int) -> str:
        """How errors name the grid entry ``index``: ``grids[2] (ds-sum)``."""
        return f"grids[{index}] ({self.grids[index].get('name', f'#{index}')})"

    def tuning(self, board: Mapping[str, Any]) -> tuple[int, int | None]:
        """``(offset, per_task)`` of the tuning prompts: the base's ``prompts.offset`` / ``prompts.per_task``, else
        the board's (per_task None: every prompt)."""
        prompts_board = board.get("prompts", {})
        per_task = self.base.get("prompts.per_task", prompts_board.get("per_task"))
        offset = self.base.get("prompts.offset", prompts_board.get("offset", 0)) or 0
        return int(offset), None if per_task is None else int(per_task)

    def tasks(self, board: Mapping[str, Any]) -> list[str]:
        """The runs' tasks: the base's ``prompts.tasks``, else the board's."""
        return list(self.base.get("prompts.tasks", board.get("prompts", {}).get("tasks")) or [])

    def pool(self, board: Mapping[str, Any]) -> str:
        """The tuning runs' prompt pool: the base's ``prompts.pool``, else the board's (default the paper's). The
        held-out rounds past it take the extended pool (:func:`mmw.sweep.units.held_out`)."""
        from mmw.tasks import PAPER_POOL

        return str(self.base.get("prompts.pool", board.get("prompts", {}).get("pool", PAPER_POOL)))

    def confirmation(self, board: Mapping[str, Any]) -> Confirmation | None:
        """The ``confirm`` section against the tuning prompts, its offset resolved: K >= 2, enough prompts for an
        interval of quality and of R, disjoint from the tuning prompts (None without a ``confirm`` section)."""
        raw = self.confirm
        if raw is None:
            return None
        tuning_offset, tuning = self.tuning(board)
        tasks = self.tasks(board)
        if self.reevaluate.k < 2:
            raise SpecError("reevaluate.k", f"{self.reevaluate.k} confirmation run(s): an interval over runs needs "
                            "at least 2", "an integer >= 2")
        if tuning is None:
            raise SpecError("confirm", "the tuning runs take every prompt (prompts.per_task: null), so no prompt is "
                            "left for confirmation", "set base prompts.per_task to the tuning prompts per task")
        count = raw.prompts
        if count * max(len(tasks), 1) < MIN_CONFIRM_PROMPTS:
            raise SpecError("confirm.prompts", f"{count} per task x {len(tasks)} task(s) is too small to compute "
                            "an interval", f"at least {MIN_CONFIRM_PROMPTS} confirmation prompts in all")
        fraction = self.base.get("attacks.fraction", board.get("attacks", {}).get("fraction", 0.0)) or 0.0
        attacked = attacked_prompts(fraction, count, len(tasks))
        if attacked < MIN_CONFIRM_PROMPTS:  # R's interval resamples the attacked prompts
            needed = min_confirm_prompts(fraction, len(tasks))
            raise SpecError("confirm.prompts", f"{count} per task attack only {attacked} confirmation prompt(s) "
                            f"(attacks.fraction {fraction:g}): too few to compute an interval of R",
                            f"at least {needed} per task" if needed else "attacks.fraction > 0")
        offset = tuning_offset + tuning if raw.offset is None else raw.offset
        if offset < tuning_offset + tuning and tuning_offset < offset + count:
            raise SpecError("confirm.offset", f"confirmation prompts [{offset}, {offset + count}) overlap the "
                            f"tuning prompts [{tuning_offset}, {tuning_offset + tuning})",
                            f"an offset >= {tuning_offset + tuning}")
        for task, size in task_pool_sizes(list(tasks)).items():
            if offset + count > size:
                raise SpecError("confirm.prompts", f"{count} per task from prompt {offset}: task {task} holds {size} "
                                f"prompts in the extended pool (the largest)",
                                f"at most {max(size - offset, 0)} per task from prompt {offset}")
        check_extensions(raw, (tuning_offset, tuning), (offset, count), self.reevaluate.seeds, list(tasks), fraction)
        return raw.model_copy(update={"offset": int(offset), "quality_losses": sorted(raw.quality_losses)})


@dataclass(frozen=True)
class Sweep:
    """An expanded, validated sweep: ``configs`` in definition order (duplicates removed); ``confirmation``: how
    its cells are confirmed, on held-out prompts (None: the definition has no ``confirm`` section and its picks
    are re-run on the tuning prompts: an exploratory table, never confirmed)."""

    name: str
    description: str
    configs: list[Config]
    reevaluate: Reevaluation
    confirmation: Confirmation | None = None
    #: The race of a definition with an ``adaptive`` section, else None.
    schedule: Schedule | None = None
    #: The tuning prompts per task: ``[tuning_offset, tuning_offset + tuning)`` (tuning None: every prompt).
    tuning_offset: int = 0
    tuning: int | None = None
    #: Run (and collect) an adaptive definition as the plain grid, for comparison (``mmw sweep run --uniform``).
    uniform: bool = False
    #: Tasks per run (``prompts.tasks``): a race unit's prompts are its shard's per-task prompts times this.
    tasks: int = 0
    #: The runs' tasks (``prompts.tasks``; empty: not known, held-out ranges are checked against every core task)
    #: and the tuning runs' prompt pool (``prompts.pool``): held-out prompts past it run on the extended pool.
    task_names: tuple[str, ...] = ()
    pool: str = "paper"
    #: Configurations per unit (the definition's ``pack``, or ``mmw sweep run --pack``): 1 = one DVC experiment
    #: each (:class:`mmw.sweep.runner.LocalDvcExecutor`); k > 1 = up to k that share a baseline in one process, 0 =
    #: all that share one (:class:`mmw.sweep.pack.PackedExecutor`).
    pack: int = 1
    #: Tuning configurations per baseline (:func:`mmw.sweep.pack.pack_key`: the params but ``scheme``), in order
    #: of first appearance: how packs form, and how the cost model counts packed units.
    per_baseline: tuple[int, ...] = ()

    def baselines(self) -> list[int]:
        """Configurations per baseline (every configuration its own when not known)."""
        return list(self.per_baseline) or [1] * len(self.configs)

    @property
    def racing(self) -> bool:
        """Whether the tuning runs are the race's shards (an ``adaptive`` section, not ``--uniform``)."""
        return self.schedule is not None and not self.uniform


def task_pool_sizes(tasks: list[str], pool: str = "extended") -> dict[str, int]:
    """Prompts each task holds in ``pool`` (:func:`mmw.tasks.pool_sizes`; a task built from the pipeline's own
    outputs is left out: its count is known only after a run). Held-out prompts are checked against the extended
    pool: a confirmation round past the tuning runs' pool runs on it (:func:`mmw.sweep.units.held_out`)."""
    from mmw.tasks import pool_sizes

    return pool_sizes(tasks, pool)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the half-open ranges ``[start, start + size)`` overlap."""
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def check_extensions(confirmation: Confirmation, tuning: tuple[int, int], first: tuple[int, int], seeds: list[int],
                     tasks: list[str], fraction: float, pools: Mapping[str, int] | None = None) -> None:
    """The later rounds of ``confirm.extend`` (:class:`mmw.sweep.confirm.Extension`) against the rest of the
    definition: fresh prompts (disjoint from the tuning prompts ``tuning``, the first rounds' ``first`` and every
    other round's, as ``(offset, per task)``), fresh seeds (disjoint from ``seeds`` and every other round's), one
    prompt range per temperature, enough prompts and attacked prompts for an interval, prompts the tasks hold
    (``pools``: prompts per task, default the extended pool's, :func:`task_pool_sizes`), every cell declared once,
    and a total level below 0.5. SpecError naming ``confirm.extend[i]...``."""
    if not confirmation.extend:
        return
    held = " in the extended pool (the largest)" if pools is None else ""
    pools = task_pool_sizes(tasks) if pools is None else pools
    taken = [("the tuning prompts", tuning), ("the first confirmation prompts", first)]
    used_seeds = [("reevaluate", seeds[0], len(seeds))] if seeds else []
    for i, ext in enumerate(confirmation.extend):
        where = f"confirm.extend[{i}]"
        per_t: dict[float, tuple[int, int]] = {}
        declared: set[tuple[float, str, float]] = set()
        for j, cell in enumerate(ext.cells):
            key = f"{where}.cells[{j}]"
            if cell.temperature in per_t and per_t[cell.temperature][1] != cell.prompts:
                other, count = per_t[cell.temperature]
                raise SpecError(f"{key}.prompts", f"{cell.prompts} per task at T = {cell.temperature:g}, but "
                                f"cells[{other}] there has {count}: the cells of one temperature share one prompt "
                                "range, so their runs share each seed's baseline", f"{count}")
            per_t.setdefault(cell.temperature, (j, cell.prompts))
            for r in cell.min_r:
                if (cell.temperature, cell.family, r) in declared:
                    raise SpecError(f"{key}.min_r", f"the cell T = {cell.temperature:g} {cell.family} R > {r:g} is "
                                    "declared twice in this round", "each cell once per round")
                declared.add((cell.temperature, cell.family, r))
            if cell.prompts * max(len(tasks), 1) < MIN_CONFIRM_PROMPTS or (
                    fraction and attacked_prompts(fraction, cell.prompts, len(tasks)) < MIN_CONFIRM_PROMPTS):
                needed = min_confirm_prompts(fraction, len(tasks)) or MIN_CONFIRM_PROMPTS
                raise SpecError(f"{key}.prompts", f"{cell.prompts} per task: too few for an interval of quality and R",
                                f"at least {needed} per task")
            for task, size in pools.items():
                if ext.offset + cell.prompts > size:
                    raise SpecError(f"{key}.prompts", f"{cell.prompts} per task from prompt {ext.offset}: task {task} "
                                    f"holds {size} prompts{held}; the cell {CANNOT}",
                                    f"at most {max(size - ext.offset, 0)} per task from prompt {ext.offset}")
        span = (ext.offset, max(c.prompts for c in ext.cells))
        for what, other in taken:
            if _overlap(span, other):
                raise SpecError(f"{where}.offset", f"prompts [{span[0]}, {span[0] + span[1]}) overlap {what} "
                                f"[{other[0]}, {other[0] + other[1]})", f"an offset >= {other[0] + other[1]} "
                                "(fresh prompts)")
        taken.append((f"the prompts of confirm.extend[{i}]", span))
        for what, start, count in used_seeds:
            if _overlap((ext.first_seed, ext.max_k), (start, count)):
                raise SpecError(f"{where}.first_seed", f"seeds [{ext.first_seed}, {ext.first_seed + ext.max_k}) "
                                f"overlap those of {what} [{start}, {start + count})",
                                f"a first seed >= {start + count} (fresh seeds)")
        used_seeds.append((f"confirm.extend[{i}]", ext.first_seed, ext.max_k))
    if confirmation.total_level >= 0.5:
        raise SpecError(f"confirm.extend[{len(confirmation.extend) - 1}].level", f"the levels add up to "
                        f"{confirmation.total_level:g} per cell (the union bound over its tries)",
                        f"levels whose sum with confirm.level ({confirmation.level:g}) stays below 0.5")


def check_extension_cells(confirmation: Confirmation | None, configs: list[Config]) -> None:
    """Every cell of ``confirm.extend`` names a temperature and family the sweep's configurations have."""
    if confirmation is None:
        return
    have = {(c.overrides.get(TEMPERATURE), config_family(c.overrides)) for c in configs}
    for i, ext in enumerate(confirmation.extend):
        for j, cell in enumerate(ext.cells):
            if (cell.temperature, cell.family) not in have:
                shown = ", ".join(f"T = {t:g} {f}" for t, f in sorted(have, key=str))
                raise SpecError(f"confirm.extend[{i}].cells[{j}]", f"no configuration of family {cell.family!r} at "
                                f"T = {cell.temperature:g}", shown)


def config_family(overrides: Mapping[str, Any]) -> str | None:
    """A configuration's family as the tables name it: its sampler, or its plugin's name."""
    sampler = overrides.get("scheme.sampler")
    return overrides.get("scheme.plugin") if sampler == "plugin" else sampler


def attacked_prompts(fraction: float, per_task: int, tasks: int) -> int:
    """Prompts a run attacks: the first ``ceil(fraction * per_task)`` of each task's."""
    return math.ceil(fraction * per_task - 1e-9) * tasks


def min_confirm_prompts(fraction: float, tasks: int) -> int | None:
    """The fewest confirmation prompts per task with an interval for quality and R (at least
    :data:`MIN_CONFIRM_PROMPTS` prompts and as many attacked ones); None when nothing is attacked."""
    if not fraction:
        return None
    return next(p for p in range(1, 10_000) if p * tasks >= MIN_CONFIRM_PROMPTS
                and attacked_prompts(fraction, p, tasks) >= MIN_CONFIRM_PROMPTS)


def _single_valued(path: Path, board: Mapping[str, Any], configs: list[Config]) -> None:
    """A sweep whose runs would mix generators, engines or judges is refused, naming the setting."""
    for dotted in SINGLE_VALUED:
        values = {json.dumps(c.overrides[dotted], default=str) for c in configs if dotted in c.overrides}
        if _lookup(board, dotted) and any(dotted not in c.overrides for c in configs):
            node: Any = board
            for part in dotted.split("."):
                node = node[part]
            values.add(json.dumps(node, default=str))
        if len(values) > 1:
            shown = ", ".join(sorted(values))
            raise SpecError(f"{path}: {dotted}", f"the runs would mix {len(values)} values ({shown}); runs of "
                            "different models, engines or judges cannot be compared",
                            "one value for the whole sweep (set it in base)")


#: The scheme keys when sweeps were first recorded (fixed: part of every recorded configuration's identity).
FIRST_SCHEME_KEYS = ("scheme.sampler", "scheme.randomness", "scheme.window", "scheme.key_length", "scheme.delta",
                     "scheme.gamma", "scheme.skip_prob", "scheme.score", "scheme.psi", "scheme.trials",
                     "scheme.alpha", "scheme.binary_code")
#: Scheme keys added since (every other key the parts declare): left out of a config's identity while null, so that
#: adding a block (and its null key) keeps every recorded configuration's id and evidence.
LATER_SCHEME_KEYS = tuple(k for k in SCHEME_KEYS if k not in FIRST_SCHEME_KEYS)


def config_id(overrides: Mapping[str, Any]) -> str:
    """Stable identity of a config: blake2b of its overrides as sorted, compact JSON (10 hex digits); a null
    :data:`LATER_SCHEME_KEYS` entry does not count."""
    kept = {k: v for k, v in overrides.items() if not (k in LATER_SCHEME_KEYS and v is None)}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=5).hexdigest()


def available(sweeps_dir: Path) -> list[str]:
    """Names of the sweep definitions in ``sweeps_dir`` (``<name>.yaml``)."""
    return sorted(p.stem for p in sweeps_dir.glob("*.yaml"))


def _lookup(board: Mapping[str, Any], dotted: str) -> bool:
    """Whether ``dotted`` names an existing entry of the params mapping ``board``."""
    node: Any = board
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


#: The params section configurations of one pack may differ in (plus the key, which is no param).
VARYING = "scheme"


def apply_overrides(board: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``board`` with each dotted override set (the entries must exist; see :func:`_lookup`)."""
    merged = copy.deepcopy(dict(board))
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = merged
        for part in parents:
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return merged


def pack_key(board: Mapping[str, Any], overrides: Mapping[str, Any]) -> str:
    """What the jobs of one pack share: the board with a job's overrides, less ``scheme`` and the key."""
    merged = apply_overrides(board, overrides)
    return json.dumps({k: v for k, v in merged.items() if k not in (VARYING, "key")}, sort_keys=True, default=str)


def _params_keys(board: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every dotted path of ``board`` down to non-mapping values (shown as the allowed keys in errors)."""
    keys: list[str] = []
    for key, value in board.items():
        dotted = f"{prefix}{key}"
        keys += _params_keys(value, f"{dotted}.") if isinstance(value, Mapping) else [dotted]
    return keys


def _check_keys(where: str, mapping: Mapping[str, Any], board: Mapping[str, Any]) -> None:
    for dotted in mapping:
        if dotted in FORBIDDEN:
            raise SpecError(f"{where}: {dotted}", "the watermark key is never a sweep param (it would be stored "
                            "with the experiment); set MMW_KEY in the environment instead")
        if not _lookup(board, dotted):
            raise SpecError(f"{where}: {dotted}", "not a param of params.yaml",
                            ", ".join(k for k in _params_keys(board) if k not in FORBIDDEN))


def _axis(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _raw_definition(name: str, sweeps_dir: Path, chain: tuple[str, ...]) -> Any:
    """The YAML mapping of ``sweeps_dir/<name>.yaml`` with its ``extends`` resolved: the named definition's keys,
    overridden by this file's (``base`` merged key by key, this file's entries winning), so a definition that
    races or rescales another grid does not copy it. ``chain``: the definitions already being read (a cycle is
    refused)."""
    path = sweeps_dir / f"{name}.yaml"
    if not path.is_file():
        where = f"{sweeps_dir / (chain[-1] + '.yaml')}: extends" if chain else "sweep"
        raise SpecError(where, f"unknown sweep {name!r} (no {path})", ", ".join(available(sweeps_dir)) or "none found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(str(path), f"not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict) or "extends" not in raw:
        return raw
    parent = raw.pop("extends")
    if not isinstance(parent, str) or parent in chain + (name,):
        problem = (f"{parent!r} extends itself through {' -> '.join(chain + (name, parent))}"
                   if isinstance(parent, str) else f"{parent!r} is not a sweep name")
        raise SpecError(f"{path}: extends", problem, "the name of another definition in " + str(sweeps_dir))
    merged = dict(_raw_definition(parent, sweeps_dir, chain + (name,)))
    base = {**(merged.get("base") or {}), **(raw.pop("base", None) or {})}
    merged.update(raw)
    if base:
        merged["base"] = base
    return merged


def read_definition(name: str, board: Mapping[str, Any] | None = None,
                    sweeps_dir: Path = SWEEPS_DIR) -> tuple[Path, SweepFile]:
    """Read and validate ``sweeps_dir/<name>.yaml`` (against the params mapping ``board`` when given); an unknown
    name is a SpecError listing the available ones, any other error names the file and the key in it."""
    path = sweeps_dir / f"{name}.yaml"
    raw = _raw_definition(name, sweeps_dir, ())
    try:
        return path, validate(SweepFile, raw, "", context={"board": board})
    except SpecError as err:
        raise SpecError(f"{path}: {err.key}" if err.key else str(path), err.problem, err.allowed) from None


def expand(name: str, board: Mapping[str, Any], sweeps_dir: Path = SWEEPS_DIR, validate: bool = True) -> Sweep:
    """Expand the sweep ``name`` against the params mapping ``board`` (the repository's params.yaml).

    Returns every config, in definition order: for each grid entry, each temperature, the Cartesian product of
    its lists. Raises SpecError naming the entry for any key that is not a param, any value the params
    validation or SchemeSpec rejects, and for an empty grid. ``validate=False`` skips the params validation
    (SchemeSpec still runs) for callers that only count.
    """
    path, definition = read_definition(name, board, sweeps_dir)
    base = definition.base
    temperatures = _axis(board.get("model", {}).get("temperature") if definition.temperatures is None
                         else definition.temperatures)
    configs: dict[str, Config] = {}
    validated: set[str] = set()
    for index, grid in enumerate(definition.grids):
        label = grid.get("name", f"#{index}")
        where = f"{path}: {definition.grid_label(index)}"
        axes = {key: _axis(value) for key, value in grid.items() if key != "name"}
        for temperature in temperatures:
            for values in itertools.product(*axes.values()):
                point = dict(zip(axes, values, strict=True))
                overrides = {**base, **{key: None for key in SCHEME_KEYS}, TEMPERATURE: temperature, **point}
                overrides = dict(sorted(overrides.items()))
                merged = apply_overrides(board, overrides)
                scheme = {k: v for k, v in merged["scheme"].items() if k != "key"}
                try:
                    SchemeSpec.from_params(scheme)
                    rest = json.dumps({k: v for k, v in merged.items() if k != "scheme"}, sort_keys=True, default=str)
                    if validate and rest not in validated:
                        parse_params(merged)
                        validated.add(rest)
                except SpecError as err:
                    shown = ", ".join(f"{k}={v}" for k, v in point.items())
                    raise SpecError(f"{where} [{TEMPERATURE}={temperature}, {shown}]: {err.key}", err.problem,
                                    err.allowed) from None
                cid = config_id(overrides)
                configs.setdefault(cid, Config(config_id=cid, grid=str(label), overrides=overrides))
    _single_valued(path, board, list(configs.values()))
    confirmation = definition.confirmation(board)
    try:
        check_extension_cells(confirmation, list(configs.values()))
    except SpecError as err:
        raise SpecError(f"{path}: {err.key}", err.problem, err.allowed) from None
    tuning_offset, tuning = definition.tuning(board)
    schedule = None
    tasks, pool = definition.tasks(board), definition.pool(board)
    from mmw.tasks import check_range

    try:
        check_range(tasks, tuning, tuning_offset, pool)  # the tuning runs' prompts, in their own pool
    except SpecError as err:
        raise SpecError(f"{path}: base: {err.key}", err.problem, err.allowed) from None
    per_baseline = list(Counter(pack_key(board, c.overrides) for c in configs.values()).values())
    if definition.adaptive is not None:
        try:
            schedule = schedule_from(definition.adaptive, tuning if confirmation else None,
                                     confirmation.max_tries if confirmation else None, per_baseline, len(tasks),
                                     cost_for_pack(definition.pack))
        except SpecError as err:
            raise SpecError(f"{path}: {err.key}", err.problem, err.allowed) from None
    return Sweep(name=name, description=definition.description, configs=list(configs.values()),
                 reevaluate=definition.reevaluate, confirmation=confirmation, schedule=schedule,
                 tuning_offset=tuning_offset, tuning=tuning, tasks=len(tasks), pack=definition.pack,
                 per_baseline=tuple(per_baseline), task_names=tuple(tasks), pool=pool)

