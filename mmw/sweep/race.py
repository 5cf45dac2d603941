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

Array shapes: leading batch dimensions ``...`` (simulated sweeps), ``C`` configurations of a group, ``X`` cells
(constraints), ``n`` prompts, ``m`` attacks counted in R, ``n_a`` attacked prompts. Missing values are NaN.

"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mmw.selection import Constraints
from mmw.sweep.race_bounds import Bounds
from mmw.sweep.schedule import Schedule


#: Reason codes of :func:`eliminate` and :func:`screen` (0: still contending).
IN, QUALITY, RESISTANCE, SIZE = 0, 1, 2, 3


REASONS = ("", "quality", "R", "size")


#: Draws of the screen's predictive simulation per configuration.
SCREEN_DRAWS = 400


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
