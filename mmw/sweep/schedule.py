"""An adaptive sweep's settings (the definition's ``adaptive`` section) as a :class:`Schedule`: the shards, the
level, the elimination rule, the budget, and the dry run's lines that price it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ValidationError

from mmw.errors import SpecError
from mmw.sweep.confirm import MIN_PROMPTS
from mmw.sweep.cost import GPU_STAGED, CostModel, config_counts, packed_units
from mmw.sweep.race_bounds import ONE_SIGMA
from mmw.validation import Integer, Section, allowed, spec_error, validate


#: The elimination rules of :class:`Schedule`.
RULES = ("union", "screen")


def bounds_per_config(m: int) -> int:
    """One-sided bounds of one configuration at one round: quality low/high, size low/high, and R's two corners
    of ``2m + 1`` coordinate bounds each."""
    return 4 + 2 * (2 * m + 1)


def _increasing(shards: list[int]) -> list[int]:
    if not shards or shards[0] < 1 or any(b <= a for a, b in zip(shards, shards[1:], strict=False)):
        raise ValueError(f"{shards!r} is not a strictly increasing list of prompts per task")
    return shards


class Schedule(Section):
    """A race's rounds: a sweep definition's ``adaptive`` section, the one model of it from the file to the race
    (validated like every params section: a bad value is a SpecError naming ``adaptive.<key>``).

    * ``shards``: cumulative tuning prompts per task after each round, strictly increasing (round ``r`` runs the
      prompts ``[shards[r-1], shards[r])`` of every task, from the tuning offset);
    * ``level`` in (0, 1): the chance, per group, that any bound of the race is wrong;
    * ``budget_s``: tuning seconds of the whole race (None: unlimited), shared equally by the cells;
    * ``keep``: leaders kept per cell, the confirmation's ``max_tries`` (a definition that leaves it out gets
      that, :func:`schedule_from`);
    * ``rule``: the elimination rule. ``"union"`` (:func:`eliminate`): drop only what is confidently out, with
      every bound at the union-bound level of :meth:`alpha`; the race then never loses a cell's true answer with
      probability ``>= 1 - level``. ``"screen"`` (:func:`screen`, the default): drop what is unlikely to be among
      the grid's ``keep`` first candidates at the last shard, at most ``level`` of predictive chance per cell and
      round; it targets agreement with the grid at a fraction of its cost, and leaves the error guarantee to
      confirmation.
    """

    shards: Annotated[list[Integer], AfterValidator(_increasing)] = allowed(
        "[int, ...] (cumulative tuning prompts per task, strictly increasing), e.g. [4, 16, 64]")
    level: float = allowed("a number in (0, 1), e.g. 0.05", gt=0.0, lt=1.0, default=0.05)
    budget_s: float | None = allowed("a number of seconds > 0", gt=0.0, default=None)
    keep: Integer = allowed("an integer >= 1 (default: confirm.max_tries, which it must equal)", ge=1, default=2)
    rule: Literal["union", "screen"] = allowed(" or ".join(RULES) + " (the elimination rule)", default="screen")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise spec_error(err, type(self), "adaptive") from None

    @classmethod
    def uniform(cls, tuning: int, keep: int = 2) -> Schedule:
        """The grid: one round, every configuration, every tuning prompt, nothing dropped."""
        return cls(shards=[tuning], level=0.5, budget_s=None, keep=keep, rule="union")

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
        return self.level / (self.rounds * max(n_configs, 1) * bounds_per_config(attacks))

    def round_cost(self, r: int, running: int | Sequence[int], tasks: int, cost: CostModel) -> float:
        """Seconds of round ``r`` for ``running`` configurations (one count, or the count of each baseline: packs
        never span baselines), packed ``cost.configs_per_unit`` to a unit (baselines not included)."""
        prompts = self.shard(r)[1] * tasks
        return float(sum(cost.units(c, prompts) for c in config_counts(running)))

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
                            f"({sum(config_counts(n_configs))} configurations on {self.shards[0]} prompts per task: "
                            f"{first:,.0f} s)", f"at least {math.ceil(first)}")


def schedule_from(section: Schedule | Mapping[str, Any], tuning: int | None, confirm_tries: int | None,
                  n_configs: int | Sequence[int], tasks: int, cost: CostModel = GPU_STAGED) -> Schedule:
    """The ``adaptive:`` section of a sweep definition (a :class:`Schedule`, or its mapping, validated here), its
    ``keep`` the confirmation's ``max_tries`` where the file leaves it out, checked against the sweep
    (:meth:`Schedule.check`) before anything runs. One round is the uniform grid (``--uniform``), not a race."""
    schedule = section if isinstance(section, Schedule) else validate(Schedule, section, "adaptive")
    if "keep" not in schedule.model_fields_set and confirm_tries is not None:
        schedule = schedule.model_copy(update={"keep": confirm_tries})
    if schedule.rounds < 2:
        raise SpecError("adaptive.shards", f"{list(schedule.shards)!r} is one round: that is the uniform grid, "
                        "not a race", "at least two increasing values, e.g. [4, 16] (or run --uniform)")
    schedule.check(tuning, n_configs, tasks, cost, confirm=confirm_tries is not None, max_tries=confirm_tries)
    return schedule


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
    uniform = float(sum(cost.units(c, tuning * tasks) for c in config_counts(n_configs)))
    lines.append(f"  tuning cost: race worst case {worst / 3600:,.2f} h ({schedule.rounds * units} units at "
                 f"most) vs uniform grid {uniform / 3600:,.2f} h ({units} units of {tuning * tasks} prompts"
                 f"{'' if per == 1 else ' a configuration'}); confirmation runs extra in both")
    return lines
