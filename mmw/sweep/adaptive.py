"""The adaptive (racing) sweep: prompts go where a cell's decision is made.

The uniform grid runs every configuration on every tuning prompt. Most configurations of a cell are clearly
infeasible or clearly larger than the best one long before that. A **race** runs the tuning prompts in rounds
(prompt shards, cumulative ``schedule.shards`` prompts per task) and, after each round, drops what is out of every
cell it could answer. A group of configurations (temperature x family) answers one cell per constraint
(:data:`PAPER_CONSTRAINTS`); ``keep`` = the confirmation's ``max_tries``, so the fallbacks survive too. Two rules
say when a configuration is **out** of a cell (``schedule.rule``):

* ``union`` (:func:`eliminate`): confidently out. Its relative-quality upper bound is below ``1 - loss``, or its R
  upper bound is at or below ``min R`` (confidently infeasible), or its size lower bound lies above the upper
  bound of the ``keep``-th smallest configuration that is confidently feasible (confidently larger than the
  cell's leaders), every bound at the union-bound level below. A cell also stops when no contender can be
  decided by the remaining prompts (:func:`decidable`).
* ``screen`` (:func:`screen`): unlikely to matter. From one-sigma bounds, the grid's estimates at the last shard
  are predicted (Student-t, shrunk for the prompts already seen) and each contender's chance of being among the
  grid's ``keep`` first candidates is drawn; per cell and round the least likely ones go, as many as fit in
  ``level`` of summed chance. It aims at the grid's answer at a fraction of its prompts; the per-cell error
  guarantee is confirmation's (disjoint prompts, fresh keys and seeds), not the race's.

A configuration is **dropped** when it is out of every cell of its group that is still running; survivors get
the next shard. A cell stops when its budget share is spent (:func:`plan_round`); its contenders then stop
unless another cell still needs them.

After the last round each cell ranks its contenders on their point estimates as the grid does (feasible on the
estimates, smallest median size first) and the candidates go to confirmation exactly as
:mod:`mmw.sweep.confirm` does: disjoint prompts, fresh keys and seeds, one-sided bounds at ``level /
max_tries``. The uniform grid is the degenerate schedule: one round, every configuration, the whole budget
(:meth:`Schedule.uniform`).

**Bounds and their correction** (the union rule; the screen reads the same bounds at :data:`ONE_SIGMA`). Per
configuration and round: relative quality (the ratio of paired sums, a
normal bound from its delta-method standard error), the median size (distribution-free, by binomial order
statistics) and R. R is the hull area of :func:`mmw.sweep.confirm.hull_resistance`, nondecreasing in every
``W_A`` and ``W_0`` and nonincreasing in every ``Q_A`` (an attack that keeps more quality while losing the mark
lowers the hull), so Clopper-Pearson bounds on the ``W``'s and normal bounds on the ``Q``'s, taken at their
corners, bound R. Every bound is one-sided at ``alpha = level / (rounds x C x J)`` (Bonferroni; ``C``
configurations of the group, ``J`` = :func:`bounds_per_config` one-sided bounds of one configuration at one
round). The schedule's prompt counts are fixed before anything runs, so the set of bounds that *could* be
consulted is fixed in advance and the union bound covers all of them simultaneously with probability
``>= 1 - level`` per group, whatever the data-dependent choice of which ones are looked at (a dropped
configuration's later bounds are simply never used). On that event no dropped configuration is feasible-and-among
the ``keep`` smallest feasible ones of a cell: the race never loses a cell's true answer. The quality and Q bounds
are asymptotic (normal), the others exact.

**Units and cost.** A unit is one configuration on one prompt shard (key ``config_id x shard``); a round's units
are independent jobs. Cost is time: a fixed cost per unit (process start-ups, model loads, DVC) plus a cost per
prompt (:class:`CostModel`); a shard's baseline is paid once per temperature and shared by the configurations.
The cost model also prices units that hold several configurations of one baseline and shard (one process, one
model load: ``configs_per_unit``), which a sweep's ``pack`` setting runs (:mod:`mmw.sweep.pack`).

Array shapes: leading batch dimensions ``...`` (simulated sweeps), ``C`` configurations of a group, ``X`` cells
(constraints), ``n`` prompts, ``m`` attacks counted in R, ``n_a`` attacked prompts. Missing values are NaN.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import polars as pl
from scipy import stats

from mmw.errors import SpecError
from mmw.io import write_table
from mmw.selection import PAPER_CONSTRAINTS, Constraints
from mmw.sweep.confirm import MIN_PROMPTS, AttackEvidence, hull_resistance
from mmw.validation import Integer, Section, allowed, validate

#: Reason codes of :func:`eliminate` and :func:`screen` (0: still contending).
IN, QUALITY, RESISTANCE, SIZE = 0, 1, 2, 3
REASONS = ("", "quality", "R", "size")
#: The elimination rules of :class:`Schedule`.
RULES = ("union", "screen")
#: One-sided level of a one-standard-error bound (the screen's bounds: estimate -/+ 1 SE).
ONE_SIGMA = float(stats.norm.sf(1.0))
#: Draws of the screen's predictive simulation per configuration.
SCREEN_DRAWS = 400


# -- settings ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostModel:
    """Seconds of work: a unit pays ``unit_s`` fixed (start-ups, model loads, DVC) + ``prompt_s`` per prompt of
    each configuration it holds; a shard's baseline (per temperature, shared by every configuration):
    ``baseline_unit_s`` + ``baseline_prompt_s`` per prompt. Linear in prompts: valid while a unit's prompts fill the
    accelerator's batch.

    ``configs_per_unit``: how many configurations of one group and shard a unit holds (one process, one model
    load, the fixed cost paid once; 0: all of them, one unit per group and round): a sweep's ``pack`` setting
    (:mod:`mmw.sweep.pack`; 1, the default, is one ``dvc exp run`` per configuration).

    ``decode_rows`` > 0 prices generation apart (``prompt_s`` is then the rest of a configuration's stages): a
    decode of up to ``decode_rows`` rows costs ``decode_s`` whatever its rows (the decode floor: a step costs about
    the same for 12 rows as for 296 on a GPU), and a unit's configurations are decoded together,
    ``decode_rows // prompts`` to a decode (:mod:`mmw.sweep.decode`); a configuration with more prompts than
    ``decode_rows`` takes ``ceil(prompts / decode_rows)`` decodes of its own. ``decode_rows`` 0: generation is in
    ``prompt_s``, linear in prompts (valid while a unit's prompts fill the accelerator's batch)."""

    unit_s: float
    prompt_s: float
    baseline_unit_s: float = 0.0
    baseline_prompt_s: float = 0.0
    configs_per_unit: int = 1
    decode_s: float = 0.0
    decode_rows: int = 0

    def __post_init__(self) -> None:
        for name in ("unit_s", "prompt_s", "baseline_unit_s", "baseline_prompt_s", "decode_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise SpecError(f"cost.{name}", f"{value!r} is not a number of seconds >= 0", "a number >= 0")
        per = self.configs_per_unit
        if isinstance(per, bool) or not isinstance(per, int) or per < 0:
            raise SpecError("cost.configs_per_unit", f"{per!r} is not an integer >= 0",
                            "an integer >= 1, or 0 (every configuration of a group and shard in one unit)")
        rows = self.decode_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise SpecError("cost.decode_rows", f"{rows!r} is not an integer >= 0",
                            "an integer >= 1 (rows a decode holds), or 0 (generation priced per prompt)")

    def unit(self, prompts: float | np.ndarray) -> float | np.ndarray:
        """Seconds of one configuration on ``prompts`` prompts in a unit of its own."""
        return self.unit_s + self.prompt_s * prompts + self.decodes(1, prompts) * self.decode_s

    def decodes(self, configs: float | np.ndarray, prompts: float | np.ndarray) -> float | np.ndarray:
        """Decodes that ``configs`` configurations on ``prompts`` prompts each take, packed ``configs_per_unit``
        to a unit and stacked within a unit (0 when ``decode_rows`` is 0)."""
        configs, prompts = np.asarray(configs, dtype=float), np.asarray(prompts, dtype=float)
        if not self.decode_rows:
            return np.zeros(np.broadcast(configs, prompts).shape) if np.ndim(configs) or np.ndim(prompts) else 0.0
        per_decode = np.maximum(1.0, np.floor(self.decode_rows / np.maximum(prompts, 1.0)))
        batches = np.ceil(prompts / self.decode_rows)  # decodes a configuration needs on its own
        if self.configs_per_unit == 0:
            stacked = np.ceil(configs / per_decode)
        else:
            full, rest = np.floor(configs / self.configs_per_unit), np.mod(configs, self.configs_per_unit)
            stacked = full * np.ceil(self.configs_per_unit / per_decode) + np.ceil(rest / per_decode)
        out = stacked * batches
        return float(out) if np.ndim(out) == 0 else out

    def units(self, configs: float | np.ndarray, prompts: float | np.ndarray) -> float | np.ndarray:
        """Seconds of ``configs`` configurations of one group on one shard of ``prompts`` prompts, packed
        ``configs_per_unit`` to a unit: ``ceil(configs / configs_per_unit)`` fixed costs + every prompt (+ the
        unit's decodes, :meth:`decodes`)."""
        configs = np.asarray(configs, dtype=float)
        packed = np.where(configs > 0, 1.0, 0.0) if self.configs_per_unit == 0 else np.ceil(
            configs / self.configs_per_unit)
        out = packed * self.unit_s + configs * self.prompt_s * prompts + np.asarray(
            self.decodes(configs, prompts)) * self.decode_s
        return float(out) if out.ndim == 0 else out

    def share(self, configs: float, prompts: float) -> float:
        """One configuration's share of a round of ``configs`` configurations (:meth:`units` / ``configs``)."""
        return float(self.units(configs, prompts)) / configs if configs else 0.0

    def baseline(self, prompts: float | np.ndarray) -> float | np.ndarray:
        return self.baseline_unit_s + self.baseline_prompt_s * prompts + (
            np.ceil(np.asarray(prompts, dtype=float) / self.decode_rows) * self.decode_s if self.decode_rows else 0.0)

    def with_fixed(self, unit_s: float, configs_per_unit: int | None = None) -> CostModel:
        """The same model with another fixed cost per unit (and packing)."""
        return dataclasses.replace(self, unit_s=unit_s, configs_per_unit=self.configs_per_unit
                                   if configs_per_unit is None else configs_per_unit)


#: One H100, 8B-shaped models, 296 prompts x 1,024 tokens (bench/RESULTS.md, "Cost model for the paper's grid"):
#: 302.5 s a configuration, 191 s a baseline; of which fixed per unit the measured 70-120 s of stage start-ups and
#: loads (midpoint 95 s) and, for the baseline's four stages, 60 s.
GPU_STAGED = CostModel(unit_s=95.0, prompt_s=(302.5 - 95.0) / 296, baseline_unit_s=60.0,
                       baseline_prompt_s=(191.0 - 60.0) / 296)
#: One H100, packed units that decode their configurations together (bench/RESULTS.md, "One decode for a pack";
#: 8B-shaped models, 1,024 tokens): a decode of up to 296 rows 58.3 s (measured on 8 configurations x 12 prompts;
#: one configuration's 12 rows took 30-58 s, the full 296-row batch 50.3 s); the rest of a configuration's stages
#: 0.61 s a prompt (7.3 s at 12 prompts; at 296 this is above the staged model's 302.5 - 95 - 50.3 = 157 s); 20 s
#: a unit (the first configuration's first-time work and the imports); a baseline 12 s + 0.27 s a prompt + its decode.
GPU_PACKED = CostModel(unit_s=20.0, prompt_s=0.61, baseline_unit_s=12.0, baseline_prompt_s=(191.0 - 60.0 - 50.3) / 296,
                       configs_per_unit=0, decode_s=58.3, decode_rows=296)


def cost_for_pack(pack: int) -> CostModel:
    """The cost model of a sweep run with ``pack`` configurations a unit: one ``dvc exp run`` each (``GPU_STAGED``)
    for 1, packs that decode together (``GPU_PACKED``) otherwise."""
    return GPU_STAGED if pack == 1 else GPU_PACKED.with_fixed(GPU_PACKED.unit_s, pack)


def bounds_per_config(m: int) -> int:
    """One-sided bounds of one configuration at one round: quality low/high, size low/high, and R's two corners
    of ``2m + 1`` coordinate bounds each."""
    return 4 + 2 * (2 * m + 1)


@dataclass(frozen=True)
class Schedule:
    """A race's rounds.

    * ``shards``: cumulative tuning prompts per task after each round, strictly increasing (round ``r`` runs the
      prompts ``[shards[r-1], shards[r])`` of every task, from the tuning offset);
    * ``level`` in (0, 1): the chance, per group, that any bound of the race is wrong;
    * ``budget_s``: tuning seconds of the whole race (None: unlimited), shared equally by the cells;
    * ``keep``: leaders kept per cell (the confirmation's ``max_tries``);
    * ``corrected``: False tests every bound at ``level`` itself (no multiplicity correction: the reckless
      negative control of the simulation study, never a sweep setting);
    * ``rule``: the elimination rule. ``"union"`` (:func:`eliminate`): drop only what is confidently out, with
      every bound at the union-bound level of :meth:`alpha`; the race then never loses a cell's true answer with
      probability ``>= 1 - level``. ``"screen"`` (:func:`screen`): drop what is unlikely to be among the grid's
      ``keep`` first candidates at the last shard, at most ``level`` of predictive chance per cell and round;
      it targets agreement with the grid at a fraction of its cost, and leaves the error guarantee to
      confirmation.
    """

    shards: tuple[int, ...]
    level: float = 0.05
    budget_s: float | None = None
    keep: int = 2
    corrected: bool = True
    rule: str = "union"

    def __post_init__(self) -> None:
        if isinstance(self.level, bool) or not isinstance(self.level, int | float) or not 0 < self.level < 1:
            raise SpecError("adaptive.level", f"{self.level!r} is outside (0, 1)", "a number in (0, 1), e.g. 0.05")
        shards = self.shards
        if (not shards or any(isinstance(s, bool) or not isinstance(s, int) for s in shards)
                or shards[0] < 1 or any(b <= a for a, b in zip(shards, shards[1:], strict=False))):
            raise SpecError("adaptive.shards", f"{list(shards)!r} is not a strictly increasing list of prompts per "
                            "task", "integers >= 1, increasing, e.g. [4, 16, 64]")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise SpecError("adaptive.keep", f"{self.keep!r} is not a positive integer", "an integer >= 1")
        if self.rule not in RULES:
            raise SpecError("adaptive.rule", f"{self.rule!r} is not an elimination rule", " or ".join(RULES))

    @classmethod
    def uniform(cls, tuning: int, keep: int = 2) -> Schedule:
        """The grid: one round, every configuration, every tuning prompt, nothing dropped."""
        return cls(shards=(tuning,), level=0.5, budget_s=None, keep=keep)

    @property
    def rounds(self) -> int:
        return len(self.shards)

    def shard(self, r: int) -> tuple[int, int]:
        """``(offset, per_task)`` of round ``r``'s prompts within the tuning prompts of each task."""
        start = self.shards[r - 1] if r else 0
        return start, self.shards[r] - start

    def alpha(self, n_configs: int, attacks: int) -> float:
        """The one-sided level of every bound of a group of ``n_configs`` (see the module docstring); the screen
        reads its standard errors off one-sigma bounds (:data:`ONE_SIGMA`)."""
        if self.rule == "screen":
            return ONE_SIGMA
        if not self.corrected:
            return self.level
        return self.level / (self.rounds * max(n_configs, 1) * bounds_per_config(attacks))

    def round_cost(self, r: int, running: int | Sequence[int], tasks: int, cost: CostModel) -> float:
        """Seconds of round ``r`` for ``running`` configurations (one count, or the count of each baseline: packs
        never span baselines), packed ``cost.configs_per_unit`` to a unit (baselines not included)."""
        prompts = self.shard(r)[1] * tasks
        return float(sum(cost.units(c, prompts) for c in _counts(running)))

    def check(self, tuning: int | None, n_configs: int | Sequence[int], tasks: int, cost: CostModel,
              confirm: bool = True, max_tries: int | None = None) -> None:
        """Refuse a schedule that cannot run (SpecError naming the setting): its shards overrun the tuning prompts
        (they would reach the confirmation prompts), there is no confirmation stage, ``keep`` differs from the
        confirmation's ``max_tries``, the first shard is too small for a bound, or the budget does not pay for
        round 1 (every configuration on the first shard)."""
        if not confirm or tuning is None:
            raise SpecError("adaptive", "the race needs a confirmation stage (a `confirm` section with held-out "
                            "prompts)", "add confirm: {prompts: N} to the sweep")
        if self.shards[-1] > tuning:
            raise SpecError("adaptive.shards", f"the last round reaches {self.shards[-1]} prompts per task, beyond "
                            f"the {tuning} tuning prompts (it would use confirmation prompts)",
                            f"a last value <= {tuning}")
        if self.shards[0] * tasks < MIN_PROMPTS:
            raise SpecError("adaptive.shards", f"round 1 has {self.shards[0] * tasks} prompt(s): too few for a "
                            "bound", f"at least {math.ceil(MIN_PROMPTS / max(tasks, 1))} per task")
        if max_tries is not None and self.keep != max_tries:
            raise SpecError("adaptive.keep", f"{self.keep} leaders kept but confirmation tries {max_tries}",
                            f"{max_tries} (confirm.max_tries)")
        first = self.round_cost(0, n_configs, tasks, cost)
        if self.budget_s is not None and self.budget_s < first:
            raise SpecError("adaptive.budget_s", f"{self.budget_s:g} s is less than one round "
                            f"({sum(_counts(n_configs))} configurations on {self.shards[0]} prompts per task: "
                            f"{first:,.0f} s)", f"at least {math.ceil(first)}")


def _counts(configs: int | Sequence[int]) -> list[int]:
    """Configurations per baseline: one count is one baseline."""
    return [configs] if isinstance(configs, int) else list(configs)


def packed_units(configs: int | Sequence[int], per_unit: int) -> int:
    """Units that ``configs`` configurations (per baseline) take, ``per_unit`` to a unit (0: one per baseline)."""
    return sum((1 if c else 0) if per_unit == 0 else math.ceil(c / per_unit) for c in _counts(configs))


class AdaptiveSection(Section):
    """A sweep definition's ``adaptive:`` section as written; the rules between its values are
    :class:`Schedule`'s."""

    shards: list[Integer] = allowed("[int, ...] (cumulative tuning prompts per task), e.g. [4, 16, 64]", default=[])
    level: float = allowed("a number in (0, 1), e.g. 0.05", default=0.05)
    budget_s: float | None = allowed("a number of seconds > 0", gt=0.0, default=None)
    keep: Integer | None = allowed("an integer >= 1 (default: confirm.max_tries, which it must equal)", default=None)
    rule: str = allowed(" or ".join(RULES) + " (the elimination rule)", default="screen")


def schedule_from(raw: Any, tuning: int | None, confirm_tries: int | None, n_configs: int | Sequence[int],
                  tasks: int, cost: CostModel = GPU_STAGED) -> Schedule:
    """The ``adaptive:`` section of a sweep definition (:class:`AdaptiveSection`), checked against the sweep
    (:meth:`Schedule.check`) before anything runs. One round is the uniform grid (``--uniform``), not a race."""
    section = validate(AdaptiveSection, raw, "adaptive")
    keep = section.keep if section.keep is not None else confirm_tries if confirm_tries is not None else 2
    schedule = Schedule(shards=tuple(section.shards), level=section.level, budget_s=section.budget_s, keep=keep,
                        rule=section.rule)
    if schedule.rounds < 2:
        raise SpecError("adaptive.shards", f"{list(schedule.shards)!r} is one round: that is the uniform grid, "
                        "not a race", "at least two increasing values, e.g. [4, 16] (or run --uniform)")
    schedule.check(tuning, n_configs, tasks, cost, confirm=confirm_tries is not None, max_tries=confirm_tries)
    return schedule


# -- bounds -----------------------------------------------------------------------------------------------------

def _ratio_bounds(num: np.ndarray, den: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum(num) / sum(den)`` over the last axis (pairs with a missing side dropped) and its one-sided normal
    bounds at ``alpha`` from the delta-method standard error."""
    both = ~(np.isnan(num) | np.isnan(den))
    x, y = np.where(both, num, 0.0), np.where(both, den, 0.0)
    n = both.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = x.sum(-1) / y.sum(-1)
        resid = np.where(both, x - estimate[..., None] * y, 0.0)
        se = np.sqrt((resid ** 2).sum(-1) / np.maximum(n - 1, 1) / n) / (y.sum(-1) / n)
    z = stats.norm.isf(alpha)
    se = np.where(n >= 2, se, np.inf)
    return estimate, estimate - z * se, estimate + z * se


def _proportion_bounds(hits: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Share of 1s over the last axis (NaN missing) and its one-sided Clopper-Pearson bounds at ``alpha``."""
    seen = ~np.isnan(hits)
    k, n = np.where(seen, hits, 0.0).sum(-1), seen.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = k / n
    low = np.where(k > 0, stats.beta.ppf(alpha, k, n - k + 1), 0.0)
    high = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, n - k), 1.0)
    return estimate, np.where(n > 0, low, 0.0), np.where(n > 0, high, 1.0)


def median_bounds(sizes: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median over the last axis (inf = undetected, NaN = missing) and its distribution-free one-sided bounds at
    ``alpha``: the order statistics ``X_(l)`` and ``X_(n+1-l)`` with ``l`` the largest rank for which
    ``P(Binomial(n, 1/2) <= l - 1) <= alpha`` (no bound, -inf / inf, when ``n`` is too small)."""
    n = (~np.isnan(sizes)).sum(-1)
    ordered = np.sort(np.where(np.isnan(sizes), np.inf, sizes), axis=-1)  # NaN (missing) after every value
    last = max(sizes.shape[-1] - 1, 0)

    def order_stat(index: np.ndarray) -> np.ndarray:
        if not sizes.shape[-1]:
            return np.full(sizes.shape[:-1], np.nan)
        return np.take_along_axis(ordered, np.clip(index, 0, last)[..., None], -1)[..., 0]

    with np.errstate(invalid="ignore"):
        median = np.where(n > 0, (order_stat((n - 1) // 2) + order_stat(n // 2)) / 2, np.nan)
    rank = stats.binom.ppf(alpha, n, 0.5).astype(int)  # smallest k with P(B <= k) >= alpha: l = k (1-based)
    rank = np.where(stats.binom.cdf(rank - 1, n, 0.5) <= alpha, rank, rank - 1)
    valid = rank >= 1
    low, high = order_stat(rank - 1), order_stat(n - rank)
    return median, np.where(valid, low, -np.inf), np.where(valid, high, np.inf)


@dataclass(frozen=True)
class Tuning:
    """Per-prompt tuning results of configurations, prompts aligned and in shard order.

    * ``watermarked``, ``baseline``: ratings ``(..., C, n)`` (the baseline of the same prompt, shared);
    * ``sizes``: ``(..., C, n)`` tokens to detection of each watermarked text (inf: undetected);
    * ``attacked``: the attacked prompts as the confirmation reads them (:class:`~mmw.sweep.confirm.AttackEvidence`),
      with the configurations ``C`` on its run axis: ``detected`` / ``rating_attacked`` ``(..., C, m, n_a)``,
      ``rating_reference`` / ``no_attack`` ``(..., C, n_a)``.
    """

    watermarked: np.ndarray
    baseline: np.ndarray
    sizes: np.ndarray
    attacked: AttackEvidence

    def map(self, prompts: Callable[[np.ndarray], np.ndarray],
            attacked: Callable[[np.ndarray], np.ndarray] | None = None) -> Tuning:
        """The same results with ``prompts`` applied to every per-prompt array and ``attacked`` (default: the
        same function) to every per-attacked-prompt one."""
        on_attacked = attacked or prompts
        a = self.attacked
        return Tuning(prompts(self.watermarked), prompts(self.baseline), prompts(self.sizes),
                      AttackEvidence(on_attacked(a.detected), on_attacked(a.rating_attacked),
                                     on_attacked(a.rating_reference), on_attacked(a.no_attack)))


@dataclass(frozen=True)
class Bounds:
    """Point estimates and one-sided bounds, each ``(..., C)``; ``prompts``: how many prompts they rest on."""

    quality: np.ndarray
    quality_low: np.ndarray
    quality_high: np.ndarray
    resistance: np.ndarray
    resistance_low: np.ndarray
    resistance_high: np.ndarray
    size: np.ndarray
    size_low: np.ndarray
    size_high: np.ndarray
    prompts: np.ndarray

    def where(self, mask: np.ndarray, other: Bounds) -> Bounds:
        """These bounds where ``mask`` (``(..., C)``), ``other``'s elsewhere."""
        return Bounds(**{f: np.where(mask, getattr(self, f), getattr(other, f)) for f in self.__dataclass_fields__})


def race_bounds(tuning: Tuning, alpha: float) -> Bounds:
    """Every configuration's estimates and bounds at ``alpha`` each (see the module docstring)."""
    quality, q_low, q_high = _ratio_bounds(tuning.watermarked, tuning.baseline, alpha)
    size, s_low, s_high = median_bounds(tuning.sizes, alpha)
    attacked = tuning.attacked
    w_a, w_a_low, w_a_high = _proportion_bounds(attacked.detected, alpha)
    reference = np.broadcast_to(attacked.rating_reference[..., None, :], attacked.rating_attacked.shape)
    q_a, q_a_low, q_a_high = _ratio_bounds(attacked.rating_attacked, reference, alpha)
    w_0, w_0_low, w_0_high = _proportion_bounds(attacked.no_attack, alpha)

    def hull(q: np.ndarray, w: np.ndarray, w0: np.ndarray) -> np.ndarray:
        return hull_resistance(np.clip(q, 0.0, 1.0), np.clip(w, 0.0, 1.0), np.clip(w0, 0.0, 1.0))

    r = hull(q_a, w_a, w_0)
    r_low = np.nan_to_num(hull(q_a_high, w_a_low, w_0_low), nan=0.0)
    r_high = np.nan_to_num(hull(q_a_low, w_a_high, w_0_high), nan=1.0)
    prompts = np.broadcast_to((~np.isnan(tuning.watermarked)).sum(-1), quality.shape)
    return Bounds(quality, q_low, q_high, r, r_low, r_high, size, s_low, s_high, prompts)


# -- the elimination rule ---------------------------------------------------------------------------------------

def eliminate(bounds: Bounds, contending: np.ndarray, constraints: Sequence[Constraints], keep: int
              ) -> np.ndarray:
    """Reason codes ``(..., X, C)``: for each cell (constraint) ``x`` and configuration, :data:`QUALITY` /
    :data:`RESISTANCE` (confidently infeasible) or :data:`SIZE` (size lower bound above the ``keep``-th smallest
    size upper bound among the cell's confidently feasible contenders), else :data:`IN`. ``contending``
    ``(..., X, C)``: who is still in each cell (a configuration already out stays out, code kept by the caller).
    """
    codes = []
    for x, constraint in enumerate(constraints):
        alive = contending[..., x, :]
        q_min, r_min = constraint.min_relative_quality, constraint.min_tamper_resistance
        with np.errstate(invalid="ignore"):
            bad_q = bounds.quality_high < q_min
            bad_r = (bounds.resistance_high <= r_min) if r_min > 0 else np.zeros_like(bad_q)
            sure = (bounds.quality_low >= q_min) & ((bounds.resistance_low > r_min) if r_min > 0 else True)
        sure &= alive & np.isfinite(bounds.size_high)
        ranked = np.sort(np.where(sure, bounds.size_high, np.inf), axis=-1)
        threshold = ranked[..., keep - 1] if ranked.shape[-1] >= keep else np.full(ranked.shape[:-1], np.inf)
        larger = bounds.size_low > threshold[..., None]
        code = np.where(bad_q, QUALITY, np.where(bad_r, RESISTANCE, np.where(larger, SIZE, IN)))
        codes.append(np.where(alive, code, IN))
    return np.stack(codes, axis=-2)


def screen(bounds: Bounds, contending: np.ndarray, constraints: Sequence[Constraints], keep: int, seen: float,
           level: float, seed: int = 0, draws: int = SCREEN_DRAWS) -> np.ndarray:
    """Reason codes ``(..., X, C)`` of the screening rule: per cell, drop the configurations least likely to be
    among the grid's ``keep`` first candidates once the last shard is in, as many as fit in ``level`` of summed
    chance.

    ``bounds`` are one-sigma bounds (:data:`ONE_SIGMA`), read as standard errors: quality and R by half their
    interval, the median size on the log scale (infinite when undetected; an open bound counts as 3, a factor
    of 20). ``seen``: the share of the last shard's prompts the bounds rest on. The grid's estimates at the last
    shard are predicted as Student-t (``prompts - 1`` degrees of freedom: the standard errors are themselves
    estimated) around today's, the standard errors shrunk by ``sqrt(1 - seen)`` (the prompts still to come; the
    ones seen are shared); ``draws`` joint draws of every contender (seeded by ``seed``:
    deterministic) give each one's chance ``p`` of being feasible on the grid's point rule (quality ``>= 1 -
    loss``, R ``>= min R``) with fewer than ``keep`` feasible contenders smaller (ties of undetected ones by
    index, as the grid's stable sort). A cell's contenders are dropped in increasing ``p`` while their sum stays
    ``<= level``, so each round loses one of the grid's ``keep`` candidates with chance about ``level`` at most
    (under the normal prediction). Reason: ``quality`` or ``R`` when that alone makes the configuration more
    likely infeasible than not, else ``size``. A contender without a quality estimate is never dropped."""
    shrink = math.sqrt(max(1.0 - seen, 0.0))
    rng = np.random.default_rng(seed)
    shape = bounds.quality.shape

    df = np.maximum(np.broadcast_to(bounds.prompts, shape) - 1, 1).astype(float)

    def draw(estimate: np.ndarray, low: np.ndarray, high: np.ndarray, cap: float = np.inf) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            se = np.minimum(np.nan_to_num((high - low) / 2, nan=cap, posinf=cap), cap) * shrink
        return estimate + rng.standard_t(df, (draws, *shape)) * se

    quality = draw(bounds.quality, bounds.quality_low, bounds.quality_high)
    resistance = draw(bounds.resistance, bounds.resistance_low, bounds.resistance_high)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_size = np.log(bounds.size)
        log_draw = draw(log_size, np.log(np.maximum(bounds.size_low, 0.0)), np.log(bounds.size_high), cap=3.0)
    log_draw = np.where(np.isinf(log_size), np.inf, log_draw)
    tie = np.broadcast_to(np.arange(shape[-1], dtype=float), shape)
    unknown = ~np.isfinite(bounds.quality)
    codes = []
    for x, constraint in enumerate(constraints):
        alive = contending[..., x, :]
        q_min, r_min = constraint.min_relative_quality, constraint.min_tamper_resistance
        q_ok = quality >= q_min
        r_ok = resistance >= r_min if r_min > 0 else np.ones_like(q_ok)
        feasible = q_ok & r_ok & alive
        key = np.where(feasible, np.where(np.isinf(log_draw), 1e6 + tie, log_draw), np.inf)
        if shape[-1] > keep:
            kth = np.partition(key, keep - 1, axis=-1)[..., keep - 1:keep]
            top = feasible & (key <= kth)
        else:
            top = feasible
        p = np.where(unknown | ~alive, np.inf, top.mean(0))
        order = np.argsort(p, axis=-1, kind="stable")
        ranked = np.take_along_axis(p, order, -1)
        out_sorted = np.cumsum(np.where(np.isfinite(ranked), ranked, np.inf), axis=-1) <= level
        out = np.zeros(shape, bool)
        np.put_along_axis(out, order, out_sorted, -1)
        p_q, p_r = q_ok.mean(0), r_ok.mean(0)
        reason = np.where((p_q < 0.5) & (p_q <= p_r), QUALITY, np.where(p_r < 0.5, RESISTANCE, SIZE))
        codes.append(np.where(out & alive, reason, IN))
    return np.stack(codes, axis=-2)


def plan_round(contending: np.ndarray, active: np.ndarray, spent: np.ndarray, unit_s: float, budget_cell: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Who runs the next round: ``(running (..., C), active (..., X), charge (..., X))``.

    A configuration runs when a still-active cell contends for it; its unit (``unit_s`` seconds) is charged in
    equal shares to those cells. A cell whose ``spent + charge`` would exceed ``budget_cell`` stops (its
    contenders then run only for other cells); repeated until no cell stops."""
    active = active.copy()
    while True:
        holders = (contending & active[..., None]).sum(-2)  # (..., C)
        running = holders > 0
        share = np.where(running, unit_s / np.maximum(holders, 1), 0.0)
        charge = np.einsum("...xc,...c->...x", (contending & active[..., None]).astype(float), share)
        over = active & (spent + charge > budget_cell * (1 + 1e-12))
        if not over.any():
            return running, active, np.where(active, charge, 0.0)
        active &= ~over


def decidable(bounds: Bounds, contending: np.ndarray, constraints: Sequence[Constraints], growth: float
              ) -> np.ndarray:
    """``(..., X)``: the cell has a contender whose bounds clear its constraints (quality, and R when the cell has
    an R constraint) within the schedule's remaining prompts, by the power planner's rule
    (:func:`mmw.sweep.plan.needed_prompts`: a one-sided bound's distance ``h`` to its estimate shrinks as
    ``1/sqrt(n)``, so it clears a constraint at gap ``g`` once the prompts grow by ``(h / g)^2``) — ``growth`` =
    last round's prompts / this round's; a confidently undetected contender (size lower bound infinite) does not
    count. A cell with none stops (futile: more tuning prompts cannot decide it at
    this scale); its contenders keep their place in its ranking."""
    def clears(estimate: np.ndarray, low: np.ndarray, threshold: float) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (estimate - low) ** 2 <= growth * (estimate - threshold) ** 2

    out = []
    for x, constraint in enumerate(constraints):
        ok = clears(bounds.quality, bounds.quality_low, constraint.min_relative_quality)
        if constraint.min_tamper_resistance > 0:
            ok &= clears(bounds.resistance, bounds.resistance_low, constraint.min_tamper_resistance)
        ok &= bounds.size_low < np.inf  # confidently undetected: never an answer, whatever its quality
        out.append((ok & contending[..., x, :]).any(-1))
    return np.stack(out, axis=-1)


def rank(bounds: Bounds, contending: np.ndarray, constraint: Constraints) -> np.ndarray:
    """Candidates of one cell ``(..., C)``: indices of the contenders feasible on their point estimates (the rule of
    :func:`mmw.selection.select`), smallest median size first; -1 pads."""
    with np.errstate(invalid="ignore"):
        feasible = contending & (bounds.quality >= constraint.min_relative_quality)
        if constraint.min_tamper_resistance > 0:
            feasible &= bounds.resistance >= constraint.min_tamper_resistance
    key = np.where(feasible, bounds.size, np.inf)
    order = np.argsort(key, axis=-1, kind="stable")
    return np.where(np.take_along_axis(feasible, order, -1), order, -1)


# -- one group's race (vectorised over simulated sweeps; the real runner uses it with no batch dimension) -------

@dataclass(frozen=True)
class RaceResult:
    """A group's race: ``candidates`` ``(..., X, C)`` per cell (-1 pads), ``codes`` ``(..., X, C)`` why each
    configuration left each cell (:data:`REASONS`), ``left_at`` ``(..., X, C)`` the round it left (-1: never),
    ``units`` ``(..., C)`` rounds each configuration ran, ``prompts`` ``(..., C)`` its prompts per task, ``cost_s``
    ``(...)`` units' seconds, ``cells_stopped`` ``(..., X)`` the round each cell stopped (budget or futile; -1: never),
    ``bounds`` the final :class:`Bounds`, ``round_units`` ``(..., rounds)`` configurations that ran each round
    (what :meth:`CostModel.units` prices under any fixed cost and packing)."""

    candidates: np.ndarray
    codes: np.ndarray
    left_at: np.ndarray
    units: np.ndarray
    prompts: np.ndarray
    cost_s: np.ndarray
    cells_stopped: np.ndarray
    bounds: Bounds
    round_units: np.ndarray


class Race:
    """The state of one group's race, round by round: :meth:`plan` says who runs round ``r``, :meth:`update`
    takes their bounds and applies the elimination rule. ``shape`` = batch + ``(C,)``; ``unit_cost(r)``: seconds
    of one unit of round ``r``; ``budget_cell``: each cell's share of the budget. The uniform grid
    (``Schedule.uniform``: one round, no budget) drops nothing."""

    def __init__(self, shape: tuple[int, ...], schedule: Schedule, constraints: Sequence[Constraints],
                 unit_cost: Callable[[int], float], budget_cell: float = math.inf) -> None:
        self.schedule, self.constraints, self.unit_cost, self.budget_cell = (schedule, list(constraints), unit_cost,
                                                                             budget_cell)
        x, batch = len(self.constraints), shape[:-1]
        self.shape = shape
        self.contending = np.ones(batch + (x, shape[-1]), bool)
        self.codes = np.zeros(batch + (x, shape[-1]), int)
        self.left_at = np.full(batch + (x, shape[-1]), -1)
        self.active = np.ones(batch + (x,), bool)
        self.spent = np.zeros(batch + (x,))
        self.stopped = np.full(batch + (x,), -1)
        self.futile = np.zeros(batch + (x,), bool)
        self.units = np.zeros(shape, int)
        self.prompts = np.zeros(shape, int)
        self.cost = np.zeros(batch)
        self.bounds: Bounds | None = None
        self.running = np.zeros(shape, bool)
        self.round_units = np.zeros(batch + (schedule.rounds,), int)
        self.uniform = schedule.rounds == 1 and schedule.budget_s is None

    def plan(self, r: int) -> np.ndarray:
        """``(..., C)``: the configurations that run round ``r`` (round 1: all of them)."""
        if r == 0:  # round 1 always runs in full (the budget was checked to pay for it)
            running, still = np.ones(self.shape, bool), self.active
            share = np.full(self.shape, self.unit_cost(0) / len(self.constraints))
            charge = np.einsum("...xc,...c->...x", self.contending.astype(float), share)
        else:
            running, still, charge = plan_round(self.contending, self.active, self.spent, self.unit_cost(r),
                                                self.budget_cell)
        self.stopped = np.where(self.active & ~still, r, self.stopped)
        self.active, self.spent = still, self.spent + charge
        self.running = running
        return running

    def update(self, r: int, fresh: Bounds) -> None:
        """Round ``r``'s bounds of the running configurations (others' values ignored): record, then drop."""
        running = self.running
        self.bounds = fresh if self.bounds is None else fresh.where(running, self.bounds)
        self.units += running
        self.round_units[..., r] = running.sum(-1)
        self.prompts = np.where(running, self.schedule.shards[r], self.prompts)
        self.cost = self.cost + running.sum(-1) * self.unit_cost(r)
        last = r + 1 == self.schedule.rounds
        if not self.uniform and not (last and self.schedule.rule == "screen"):
            judged = self.contending & running[..., None, :]
            if self.schedule.rule == "screen":
                new = screen(self.bounds, judged, self.constraints, self.schedule.keep,
                             self.schedule.shards[r] / self.schedule.shards[-1], self.schedule.level, seed=r)
            else:
                new = eliminate(self.bounds, judged, self.constraints, self.schedule.keep)
            leaving = new != IN
            self.codes = np.where(leaving, new, self.codes)
            self.left_at = np.where(leaving, r, self.left_at)
            self.contending &= ~leaving
            if r + 1 < self.schedule.rounds and self.schedule.rule == "union":
                futile = self.active & ~decidable(self.bounds, self.contending, self.constraints,
                                                  self.schedule.shards[-1] / self.schedule.shards[r])
                self.stopped = np.where(futile, r, self.stopped)
                self.futile |= futile
                self.active &= ~futile

    def result(self) -> RaceResult:
        assert self.bounds is not None, "no round ran"
        candidates = np.stack([rank(self.bounds, self.contending[..., i, :], constraint)
                               for i, constraint in enumerate(self.constraints)], axis=-2)
        return RaceResult(candidates, self.codes, self.left_at, self.units, self.prompts, self.cost, self.stopped,
                          self.bounds, self.round_units)


def race(observe: Callable[[int, np.ndarray], Bounds], shape: tuple[int, ...], schedule: Schedule,
         constraints: Sequence[Constraints], unit_cost: Callable[[int], float], budget_cell: float = math.inf
         ) -> RaceResult:
    """Race one group through ``schedule``: ``observe(r, running)`` runs round ``r`` for ``running``
    (``shape`` bool) and returns bounds on every prompt they have so far (:func:`race_bounds` at
    ``schedule.alpha``)."""
    state = Race(shape, schedule, constraints, unit_cost, budget_cell)
    for r in range(schedule.rounds):
        running = state.plan(r)
        if not running.any():
            break
        state.update(r, observe(r, running))
    return state.result()


# -- the real sweep: units, the round log, resume ---------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """One configuration on one prompt shard (round ``shard``): ``prompts.offset`` / ``prompts.per_task``."""

    config_id: str
    shard: int
    offset: int
    per_task: int

    @property
    def key(self) -> str:
        return f"{self.config_id}-r{self.shard}"


class UnitRunner(Protocol):
    """Runs units and reads back their per-prompt rows (:mod:`mmw.sweep.evidence`'s columns).

    ``run`` must skip units already done (a unit never runs twice); ``rows`` returns None for a unit not done."""

    def run(self, units: Sequence[Unit]) -> None: ...

    def rows(self, unit: Unit) -> pl.DataFrame | None: ...


class DvcUnitRunner:
    """:class:`UnitRunner` over a sweep's executor (local or Ray) and its evidence store (:mod:`mmw.sweep.units`):
    a unit is the race unit ``<sweep>-<config_id>-r<round>`` of :func:`mmw.sweep.units.sweep_units` (its
    configuration with ``prompts.offset`` = tuning offset + shard start and ``prompts.per_task`` = shard size, so a
    shard's baseline is shared by every configuration through DVC's run-cache). Units run through the sweep's
    :func:`mmw.sweep.run_units`: one with an evidence file (or an experiment ref) is done and never runs again,
    each one that finishes gets its evidence file as it lands, and its rows are read back from that file alone (a
    clone without experiment refs or DVC cache resumes the race)."""

    def __init__(self, repo: Path, sweep: Any, executor: Any, echo: Callable[[str], None] = print) -> None:
        from mmw.sweep.units import sweep_units

        self.repo, self.sweep, self.executor, self.echo = repo, sweep, executor, echo
        self.units = sweep_units(sweep)
        self.progress: list[Any] = []

    def name(self, unit: Unit) -> str:
        from mmw.sweep.units import race_name

        return race_name(self.sweep.name, unit.config_id, unit.shard)

    def job(self, unit: Unit) -> Any:
        from mmw.sweep.runner import Job

        stored = self.units[self.name(unit)]
        return Job(name=stored.experiment, config_id=stored.config_id, overrides=dict(stored.overrides))

    def run(self, units: Sequence[Unit]) -> None:
        from mmw.sweep import run_units

        label = f"{self.sweep.name}: round {units[0].shard + 1}" if units else self.sweep.name
        self.progress.append(run_units(self.repo, self.sweep, label, [self.job(u) for u in units], self.executor,
                                       self.echo))

    def rows(self, unit: Unit) -> pl.DataFrame | None:
        from mmw.sweep.units import read_unit, unit_path

        path = unit_path(self.repo, self.sweep.name, self.units[self.name(unit)])
        if not path.is_file():
            return None
        stored = read_unit(path)
        return stored.rows if stored.meta.get("has_rows") else None


LOG_SCHEMA = {"round": pl.Int64, "group": pl.String, "config_id": pl.String, "prompts_per_task": pl.Int64,
              "decision": pl.String, "reason": pl.String, "quality": pl.Float64, "quality_low": pl.Float64,
              "quality_high": pl.Float64, "resistance": pl.Float64, "resistance_low": pl.Float64,
              "resistance_high": pl.Float64, "size": pl.Float64, "size_low": pl.Float64, "size_high": pl.Float64,
              "cells_stopped": pl.String, "cells_left": pl.String, "schedule": pl.String}


def tuning_arrays(rows: pl.DataFrame, attacks: Sequence[str], size_column: str = "size_valid") -> Tuning:
    """One configuration's pooled per-prompt rows (every shard it ran) as :class:`Tuning` with ``C = 1``: prompts
    sorted by id, a failed attack missing (as :mod:`mmw.sweep.evidence` reads them)."""
    marked = rows.filter(pl.col("source") == "watermarked")
    prompts = sorted(marked["prompt_id"].unique().to_list())
    frame = pl.DataFrame({"prompt_id": prompts}, schema={"prompt_id": pl.String})

    def column(source_rows: pl.DataFrame, value: str, ids: list[str]) -> np.ndarray:
        base = pl.DataFrame({"prompt_id": ids}, schema={"prompt_id": pl.String})
        picked = source_rows.select("prompt_id", pl.col(value).cast(pl.Float64).alias("_v")).unique(
            "prompt_id", keep="first")
        return base.join(picked, on="prompt_id", how="left")["_v"].fill_null(np.nan).to_numpy()

    sizes = column(marked, size_column, prompts) if size_column in marked.columns else np.full(len(prompts), np.nan)
    detected_sizes = column(marked, "detected", prompts) if "detected" in marked.columns else np.ones(len(prompts))
    sizes = np.where(np.isnan(sizes) & (detected_sizes == 0), np.inf, sizes)
    attacked = rows.filter((pl.col("source") == "attack") & pl.col("in_R").fill_null(False))
    attacked_ids = sorted(attacked["prompt_id"].unique().to_list())
    ok = attacked.filter(pl.col("ok").fill_null(False))
    detected = np.stack([column(ok.filter(pl.col("attack") == a), "detected", attacked_ids) for a in attacks]) \
        if attacks else np.zeros((0, len(attacked_ids)))
    rating_attacked = np.stack([column(ok.filter(pl.col("attack") == a), "rating", attacked_ids)
                                for a in attacks]) if attacks else np.zeros((0, len(attacked_ids)))
    return Tuning(watermarked=column(marked, "rating", prompts)[None],
                  baseline=column(rows.filter(pl.col("source") == "baseline"), "rating", prompts)[None],
                  sizes=sizes[None],
                  attacked=AttackEvidence(
                      detected=detected[None], rating_attacked=rating_attacked[None],
                      rating_reference=column(marked, "rating", attacked_ids)[None],
                      no_attack=column(rows.filter(pl.col("source") == "retokenized"), "detected",
                                       attacked_ids)[None]))


def schedule_fingerprint(schedule: Schedule, groups: Mapping[str, Sequence[str]],
                         constraints: Sequence[Constraints]) -> str:
    """What a round log was made under: a resume under another schedule, grid or constraints is refused."""
    blob = json.dumps({"shards": schedule.shards, "level": schedule.level, "budget_s": schedule.budget_s,
                       "keep": schedule.keep, "groups": {k: list(v) for k, v in sorted(groups.items())},
                       "constraints": [[c.max_quality_loss, c.min_tamper_resistance] for c in constraints],
                       **({"rule": schedule.rule} if schedule.rule != "union" else {})})
    return hashlib.blake2b(blob.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class AdaptiveOutcome:
    """``candidates``: per group, per constraint ``(loss, min R)``, the config ids for confirmation (best first);
    ``log``: the round log (:data:`LOG_SCHEMA`); ``cost_s``: the units' seconds under the cost model."""

    candidates: dict[str, dict[tuple[float, float], list[str]]]
    log: pl.DataFrame
    cost_s: float


def _observe(runner: UnitRunner, schedule: Schedule, ids: Sequence[str], r: int, attacks: Sequence[str] | None,
             size_column: str) -> Bounds:
    """Bounds of every configuration of a group on all its shards up to ``r`` (NaN where none is stored).
    ``attacks``: the attacks counted in R (None: those the group's rows hold, ``in_R``)."""
    pooled = {}
    for cid in ids:
        frames = [f for f in (runner.rows(Unit(cid, s, *schedule.shard(s))) for s in range(r + 1)) if f is not None]
        if frames:
            pooled[cid] = pl.concat(frames, how="diagonal_relaxed")
    if attacks is None:
        attacks = sorted({a for rows in pooled.values() if "in_R" in rows.columns for a in rows.filter(
            (pl.col("source") == "attack") & pl.col("in_R").fill_null(False))["attack"].to_list()})
    alpha = schedule.alpha(len(ids), len(attacks))
    if size_column != "size_valid" and not any(
            size_column in rows.columns and rows[size_column].drop_nulls().len() for rows in pooled.values()):
        size_column = "size_valid"  # the runs do not write it: the table ranks by the valid size then too
    picked = [race_bounds(tuning_arrays(pooled[cid], attacks, size_column), alpha) if cid in pooled
              else Bounds(*[np.full(1, np.nan)] * 9, prompts=np.zeros(1, int)) for cid in ids]
    return Bounds(**{f: np.concatenate([getattr(b, f) for b in picked]) for f in Bounds.__dataclass_fields__})


def _log_rows(r: int, label: str, ids: Sequence[str], state: Race, fingerprint: str) -> pl.DataFrame:
    """Round ``r``'s decisions of one group: one row per configuration that ran it; ``cells_stopped`` names the
    group's cells that stopped at this round (futile: the planner's rule; budget: their share is spent)."""
    rows = []
    bounds = state.bounds
    assert bounds is not None
    stopped = "; ".join(f"{_cell(c)}: {'futile' if state.futile[i] else 'budget'}"
                        for i, c in enumerate(state.constraints) if state.stopped[i] == r) or None
    for j, cid in enumerate(ids):
        if not state.running[j]:
            continue
        out = [f"{_cell(c)}: {REASONS[state.codes[i, j]]}" for i, c in enumerate(state.constraints)
               if state.left_at[i, j] == r]
        left = [[c.max_quality_loss, c.min_tamper_resistance, REASONS[state.codes[i, j]]]
                for i, c in enumerate(state.constraints) if state.left_at[i, j] == r]
        dropped = bool((state.codes[:, j] != IN).all()) and bool((state.left_at[:, j] == r).any())
        rows.append({"round": r, "group": label, "config_id": cid, "prompts_per_task": state.schedule.shards[r],
                     "decision": "dropped" if dropped else "kept", "reason": "; ".join(out) or None,
                     "cells_stopped": stopped, "cells_left": json.dumps(left) if left else None,
                     "schedule": fingerprint, **{f: _finite(getattr(bounds, f)[j]) for f in LOG_SCHEMA
                                                 if f.startswith(("quality", "resistance", "size"))}})
    return pl.DataFrame(rows, schema=LOG_SCHEMA)


def run_adaptive(groups: Mapping[str, Sequence[str]], schedule: Schedule, runner: UnitRunner, log_path: Path,
                 tasks: int, attacks: Sequence[str] | None, cost: CostModel = GPU_STAGED,
                 constraints: Sequence[Constraints] | None = None,
                 size_column: str | Mapping[str, str] = "size_valid", copies: Sequence[Path] = (),
                 echo: Callable[[str], None] | None = None) -> AdaptiveOutcome:
    """Race every group (``label -> config ids``, e.g. ``"T=0.7 distribution_shift"``) through ``schedule`` with
    ``runner`` and return each cell's confirmation candidates (confirm them with :mod:`mmw.sweep.confirm`).

    Round by round over all groups: the round's units (every group's survivors) go to the runner as one batch of
    independent jobs, then each group's elimination runs and the round log (:data:`LOG_SCHEMA`) is rewritten
    atomically to ``log_path`` (Parquet) and to each of ``copies``; ``echo`` gets one line per round (how many
    configurations ran, were dropped and why, which cells stopped). ``size_column``: the per-prompt size the race
    ranks by, one for all groups or per group label. After a kill, a call resumes: logged rounds are replayed from
    the units' stored rows (the runner skips units already done, so no finished unit runs again) and the race goes
    on."""
    constraints = list(constraints or [Constraints(loss, r) for loss, r in PAPER_CONSTRAINTS])
    fingerprint = schedule_fingerprint(schedule, groups, constraints)
    previous = pl.read_parquet(log_path) if Path(log_path).is_file() else pl.DataFrame(schema=LOG_SCHEMA)
    if previous.height and set(previous["schedule"].unique().to_list()) != {fingerprint}:
        raise SpecError("adaptive", f"{log_path} was written by another schedule, grid or constraints",
                        "the same sweep definition, or remove the round log to start over")
    logged_rounds = set(previous["round"].unique().to_list())
    n_cells = len(groups) * len(constraints)
    budget_cell = math.inf if schedule.budget_s is None else schedule.budget_s / n_cells

    def unit_cost(r: int) -> float:
        return float(cost.unit(schedule.shard(r)[1] * tasks))

    states = {label: Race((len(ids),), schedule, constraints, unit_cost, budget_cell) for label, ids in groups.items()}
    frames = [previous]
    for r in range(schedule.rounds):
        running = {label: state.plan(r) for label, state in states.items()}
        units = [Unit(cid, r, *schedule.shard(r)) for label, ids in groups.items()
                 for cid, on in zip(ids, running[label], strict=True) if on]
        if not units:
            break
        runner.run(units)
        for label, ids in groups.items():
            if running[label].any():
                column = size_column if isinstance(size_column, str) else size_column[label]
                states[label].update(r, _observe(runner, schedule, ids, r, attacks, column))
        fresh = pl.concat([_log_rows(r, label, ids, states[label], fingerprint) for label, ids in groups.items()])
        if r not in logged_rounds:
            frames.append(fresh)
            log = pl.concat(frames).sort(["round", "group", "config_id"])
            for path in (log_path, *copies):
                write_table(log, path)
        if echo is not None:
            echo(round_line(fresh, schedule, r, replayed=r in logged_rounds))
    candidates = {}
    for label, ids in groups.items():
        result = states[label].result()
        candidates[label] = {(c.max_quality_loss, c.min_tamper_resistance):
                             [ids[i] for i in result.candidates[k] if i >= 0] for k, c in enumerate(constraints)}
    cost_s = float(sum(state.cost for state in states.values()))
    return AdaptiveOutcome(candidates, pl.concat(frames).sort(["round", "group", "config_id"]), cost_s)


def round_line(rows: pl.DataFrame, schedule: Schedule, r: int, replayed: bool = False) -> str:
    """One round's decisions in a line: configurations that ran, dropped (by reason), still running, cells
    stopped."""
    dropped = rows.filter(pl.col("decision") == "dropped")
    reasons: dict[str, int] = {}
    for text in dropped["reason"].drop_nulls().to_list():
        for why in sorted({part.split(": ", 1)[1] for part in text.split("; ")}):
            reasons[why] = reasons.get(why, 0) + 1
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
    stopped = [f"{group} ({text})" for group, text in rows.select("group", "cells_stopped").unique()
               .drop_nulls().sort("group").iter_rows()]
    start, size = schedule.shard(r)
    return (f"  round {r + 1}/{schedule.rounds}{' (replayed from evidence)' if replayed else ''}: prompts "
            f"[{start}, {start + size}) per task, {rows.height} configuration(s) ran; dropped {dropped.height}"
            + (f" ({why})" if why else "") + f", {rows.height - dropped.height} go on"
            + (f"; cells stopped: {'; '.join(stopped)}" if stopped else ""))


def _cell(constraint: Constraints) -> str:
    r = constraint.min_tamper_resistance
    return f"{constraint.max_quality_loss:.0%} q" + (f", R>{r:g}" if r else "")


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else (None if math.isnan(value) else value)


# -- collection: pooled shards, the race's exclusions, its cost ---------------------------------------------------

#: Per-prompt size columns and the metric each pools into (a median over the pooled prompts; inf: undetected).
POOLED_SIZES = {"size_valid": "all.size_valid", "size": "all.size", "size_anytime": "all.size_anytime"}


def pooled_metrics(rows: pl.DataFrame) -> tuple[dict[str, float | None], dict[str, dict[str, float | None]]]:
    """``(metrics, attacks)`` of one configuration from its shards' pooled per-prompt rows (one row per prompt:
    a prompt seen twice counts once): ``all.relative_quality`` (ratio of the paired sums), ``all.tamper_resistance``
    (the hull of :func:`mmw.sweep.confirm.hull_resistance` at the pooled ``Q_A``, ``W_A``, ``W_0``), the median of
    each size column present (inf: undetected in half or more), ``all.n_prompts``; per attack counted in R:
    ``watermarked`` (detection rate) and ``quality_retained``. The same estimates the race's bounds are centred
    on (:func:`race_bounds`)."""
    attacked = rows.filter((pl.col("source") == "attack") & pl.col("in_R").fill_null(False))
    attacks = sorted(attacked["attack"].unique().to_list())
    marked = rows.filter(pl.col("source") == "watermarked")
    metrics: dict[str, float | None] = {}
    tuning = None
    for column, metric in POOLED_SIZES.items():
        if column not in marked.columns or (column == "size_anytime" and marked[column].null_count() == marked.height):
            continue
        tuning = tuning_arrays(rows, attacks, column)
        metrics[metric] = _finite(median_bounds(tuning.sizes[0], 0.5)[0])
    tuning = tuning or tuning_arrays(rows, attacks)
    bounds = race_bounds(tuning, 0.05)
    metrics.update({"all.relative_quality": _finite(bounds.quality[0]),
                    "all.tamper_resistance": _finite(bounds.resistance[0]),
                    "all.n_prompts": float(bounds.prompts[0])})
    per_attack: dict[str, dict[str, float | None]] = {}
    evidence = tuning.attacked
    for index, name in enumerate(attacks):
        detected = evidence.detected[0, index]
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = float(np.nanmean(detected)) if (~np.isnan(detected)).any() else math.nan
            retained = _ratio_bounds(evidence.rating_attacked[0, index], evidence.rating_reference[0], 0.05)[0]
        per_attack[name] = {"watermarked": _finite(rate), "quality_retained": _finite(retained), "size": None}
    return metrics, per_attack


def cells_left(log: pl.DataFrame) -> dict[str, set[tuple[float, float]]]:
    """Config id -> the cells ``(quality loss, min R)`` the race took it out of (the round log's ``cells_left``):
    its confirmation ranks only the configurations still contending in each cell."""
    out: dict[str, set[tuple[float, float]]] = {}
    for config, text in log.select("config_id", "cells_left").drop_nulls().iter_rows():
        out.setdefault(config, set()).update((float(loss), float(r)) for loss, r, _ in json.loads(text))
    return out


def measured_costs(units: pl.DataFrame, n_configs: int, tuning: int, tasks: int) -> dict[str, float | int | str]:
    """The race's tuning cost against the uniform grid's, from measured unit times. ``units``: one row per
    finished unit (``role`` race or tuning, ``prompts`` per task, ``wall_s``). The grid's cost is its own measured
    tuning units when every configuration has one (``mmw sweep run --uniform``); else every configuration once on
    all ``tuning`` prompts per task at the least-squares line ``wall = fixed + per_prompt x prompts`` through the
    race's unit times (with one shard size only, proportional to the prompts: an upper bound when a unit's time is
    mostly fixed)."""
    race = units.filter((pl.col("role") == "race") & pl.col("wall_s").is_not_null())
    grid = units.filter((pl.col("role") == "tuning") & pl.col("wall_s").is_not_null())
    spent = float(race["wall_s"].sum()) if race.height else 0.0
    out: dict[str, float | int | str] = {"race_units": units.filter(pl.col("role") == "race").height,
                                         "race_tuning_s": round(spent, 1)}
    if grid["config_id"].n_unique() >= n_configs:
        uniform, how = float(grid["wall_s"].sum()), "measured: the grid's own tuning units (--uniform)"
        out.update(uniform_units=grid.height)
    elif race.height:
        prompts = race["prompts"].to_numpy().astype(float) * tasks
        wall = race["wall_s"].to_numpy().astype(float)
        if len(np.unique(prompts)) >= 2:
            per_prompt, fixed = np.polyfit(prompts, wall, 1)
            per_prompt, fixed = max(per_prompt, 0.0), max(fixed, 0.0)
            how = "least-squares line over the race's unit times"
        else:
            per_prompt, fixed = float(wall.mean() / prompts.mean()), 0.0
            how = "proportional to prompts (one shard size measured)"
        uniform = n_configs * (fixed + per_prompt * tuning * tasks)
        out.update(unit_fixed_s=round(float(fixed), 1), unit_per_prompt_s=round(float(per_prompt), 2))
    else:
        return out
    out.update({"uniform_tuning_s": round(uniform, 1), "cost_ratio": round(spent / uniform, 4) if uniform
                else math.nan, "uniform_estimate": how})
    return out


def dry_run_lines(schedule: Schedule, n_configs: int | Sequence[int], tuning: int, tasks: int,
                  cost: CostModel = GPU_STAGED) -> list[str]:
    """What ``mmw sweep run NAME --dry-run`` prints for a race: each round's prompts and at most how many units,
    the race's worst case (nothing dropped, capped by the budget) against the uniform grid, under ``cost`` (its
    ``configs_per_unit``: the sweep's pack size; ``n_configs``: one count, or the count per baseline)."""
    per = cost.configs_per_unit
    packing = "" if per == 1 else f", {'every configuration of a baseline' if per == 0 else per} to a unit"
    lines = [f"  race: {schedule.rounds} rounds, level {schedule.level:g} "
             f"{'per cell and round (screen)' if schedule.rule == 'screen' else 'per group (union)'}, "
             f"keep {schedule.keep} per cell, "
             f"budget {'none' if schedule.budget_s is None else f'{schedule.budget_s:,.0f} s'}; cost model "
             f"{cost.unit_s:g} s a unit + {cost.prompt_s:.3g} s a prompt"
             f"{f' + {cost.decode_s:g} s a decode of up to {cost.decode_rows} rows' if cost.decode_rows else ''}"
             f"{packing}"]
    worst = 0.0
    units = packed_units(n_configs, per)
    for r in range(schedule.rounds):
        start, size = schedule.shard(r)
        seconds = schedule.round_cost(r, n_configs, tasks, cost)
        worst += seconds
        lines.append(f"    round {r + 1}: prompts [{start}, {start + size}) per task ({size * tasks} a "
                     f"{'unit' if per == 1 else 'configuration'}), <= {units} units, <= {seconds / 3600:,.2f} h")
    if schedule.budget_s is not None:
        worst = min(worst, schedule.budget_s)
    uniform = float(sum(cost.units(c, tuning * tasks) for c in _counts(n_configs)))
    lines.append(f"  tuning cost: race worst case {worst / 3600:,.2f} h ({schedule.rounds * units} units at "
                 f"most) vs uniform grid {uniform / 3600:,.2f} h ({units} units of {tuning * tasks} prompts"
                 f"{'' if per == 1 else ' a configuration'}); confirmation runs extra in both")
    return lines
