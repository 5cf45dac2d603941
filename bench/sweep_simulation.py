"""Synthetic sweeps with known truth: how often a procedure reports a cell as answered while its pick truly
violates a constraint.

A simulated cell has ``C`` settings with known true relative quality, tamper resistance (attack survival and
retained quality per attack, detection without attack) and size. Every run draws per-prompt ratings, detections
and sizes around them with the noise measured on the embedded models (relative quality per prompt SD 0.18-0.22;
R's within-config SD ~0.23 at 3 attacked texts; the trade-off scenario reproduces 0.16-0.21 and 0.12-0.24, from
Bernoulli detections). One simulated sweep:

* **tuning**: one run of every setting on ``n_tuning`` prompts (a shared baseline, as a sweep's configs share the
  seed's baseline); candidates = settings feasible on the point estimates, ranked by measured size;
* **old procedure**: the first candidate is the answer (what ``table.md`` reported before confirmation);
* **confirmation** (:mod:`mmw.sweep.confirm`): the candidates, in order, up to ``max_tries``, each re-run ``K``
  times on ``n_confirm`` fresh prompts and judged by the same bounds and :func:`~mmw.sweep.confirm.verdict` as a
  real sweep.

Everything is vectorised over sweeps (numpy), so thousands of sweeps take seconds. The adaptive sweep reuses
:class:`Truth` and the per-run draws (:func:`draw_runs`): :func:`simulate_adaptive` races configurations of the
paper grid's shape against the uniform grid on the same simulated prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from mmw.selection import PAPER_CONSTRAINTS, Constraints
from mmw.sweep.cost import CostModel
from mmw.sweep.race import Race
from mmw.sweep.race_bounds import Bounds, Tuning, race_bounds
from mmw.sweep.schedule import Schedule
from mmw.sweep.confirm import (
    CONFIRMED,
    NO_FEASIBLE,
    NOT_CONFIRMED,
    UNRESOLVED,
    AttackEvidence,
    RATING_MAX,
    Confirmation,
    hull_resistance,
    quality_bounds,
    resample_counts,
    resistance_bounds,
    verdict,
)

#: Per-prompt SD of relative quality measured with the embedded judge (0.18-0.22).
QUALITY_SD = 0.2


@dataclass(frozen=True)
class Truth:
    """True parameters of ``C`` settings (``m`` attacks counted in R).

    * ``relative_quality`` ``(C,)``: expected watermarked / baseline rating;
    * ``size`` ``(C,)``: median tokens to detection of one text (per-text sizes are log-normal around it);
    * ``survival`` ``(C, m)``: chance an attacked text is still detected (``W_A``);
    * ``retained`` ``(C, m)``: expected attacked / watermarked rating (``Q_A``, <= 1);
    * ``no_attack`` ``(C,)``: chance a watermarked text is detected (``W_0``).
    """

    relative_quality: np.ndarray
    size: np.ndarray
    survival: np.ndarray
    retained: np.ndarray
    no_attack: np.ndarray

    @property
    def resistance(self) -> np.ndarray:
        """True ``R`` per setting ``(C,)``."""
        return hull_resistance(self.retained, self.survival, self.no_attack)

    def violates(self, constraints: Constraints) -> np.ndarray:
        """``(C,)`` bool: the setting truly breaks a constraint (quality below, or R not above, its bound)."""
        bad = self.relative_quality < constraints.min_relative_quality
        if constraints.min_tamper_resistance > 0:
            bad |= self.resistance <= constraints.min_tamper_resistance
        return bad

    @staticmethod
    def trade_off(n: int = 8, quality_at_strongest: float = 0.82, max_size: float = 300.0) -> Truth:
        """A δ-like axis: stronger settings are smaller and more robust but cost more quality (relative quality
        from 1.02 down to ``quality_at_strongest``), so the smallest feasible setting sits at the quality bound —
        where the winner's curse bites."""
        s = np.linspace(0.0, 1.0, n)
        return Truth(relative_quality=1.02 - (1.02 - quality_at_strongest) * s,
                     size=max_size * np.exp(-3.0 * s),
                     survival=np.stack([0.15 + 0.6 * s, 0.05 + 0.45 * s], axis=1),
                     retained=np.tile([0.9, 0.6], (n, 1)),
                     no_attack=0.7 + 0.3 * s)


@dataclass(frozen=True)
class Scenario:
    """A simulated cell: its settings, constraint, scale (prompts, runs) and noise."""

    truth: Truth
    constraints: Constraints
    n_tuning: int = 40
    n_confirm: int = 60
    k: int = 3
    attacked_fraction: float = 1 / 3
    quality_sd: float = QUALITY_SD
    rating_mean: float = 50.0
    rating_sd: float = 12.5

    @property
    def n_settings(self) -> int:
        return int(self.truth.relative_quality.shape[0])


class UncorrectedSchedule(Schedule):
    """The reckless negative control of the study (never a sweep setting): a race that tests every bound at
    ``level`` itself, with no multiplicity correction."""

    def alpha(self, n_configs: int, attacks: int) -> float:
        return super().alpha(n_configs, attacks) if self.rule == "screen" else self.level


@dataclass(frozen=True)
class SimulatedRuns:
    """Draws of runs for a batch of sweeps, one setting each: ratings ``(S, K, n)``, sizes ``(S, K)`` (median
    per run) and the attacked prompts (:class:`AttackEvidence`, ``n_a`` = the first prompts)."""

    watermarked: np.ndarray
    baseline: np.ndarray
    sizes: np.ndarray
    attacks: AttackEvidence


def draw_runs(scenario: Scenario, setting: np.ndarray, n: int, k: int, rng: np.random.Generator,
              baseline: np.ndarray | None = None) -> SimulatedRuns:
    """``K`` runs on ``n`` prompts of setting ``setting[s]`` in each sweep ``s`` (shape ``(S,)``).

    ``baseline`` ``(S, K, n)`` shares one baseline between settings (a sweep's configs share the seed's
    baseline); by default each run draws its own (a fresh seed per re-run)."""
    truth, sweeps = scenario.truth, setting.shape[0]
    if baseline is None:
        difficulty = np.maximum(rng.normal(scenario.rating_mean, scenario.rating_sd, (sweeps, 1, n)), 1.0)
        baseline = difficulty * (1 + rng.normal(0, 0.1, (sweeps, k, n)))
    rho = truth.relative_quality[setting][:, None, None]
    # Ratings are judge grades in [0, RATING_MAX]; the clip is hit less than once in a million draws.
    baseline = np.clip(baseline, 0.0, RATING_MAX)
    watermarked = np.clip(rho * baseline * (1 + rng.normal(0, scenario.quality_sd, (sweeps, k, n))), 0.0, RATING_MAX)
    sizes = np.median(truth.size[setting][:, None, None] * np.exp(rng.normal(0, 0.5, (sweeps, k, n))), axis=-1)
    n_a = max(1, round(n * scenario.attacked_fraction))
    m = truth.survival.shape[1]
    survival = truth.survival[setting][:, None, :, None]
    detected = (rng.random((sweeps, k, m, n_a)) < survival).astype(float)
    reference = watermarked[..., :n_a]
    attacked = (truth.retained[setting][:, None, :, None] * reference[:, :, None, :]
                * (1 + rng.normal(0, scenario.quality_sd, (sweeps, k, m, n_a))))
    no_attack = (rng.random((sweeps, k, n_a)) < truth.no_attack[setting][:, None, None]).astype(float)
    return SimulatedRuns(watermarked, baseline, sizes, AttackEvidence(detected, attacked, reference, no_attack))


def _tuning(scenario: Scenario, sweeps: int, rng: np.random.Generator) -> np.ndarray:
    """Candidates per sweep ``(S, C)``: setting indices feasible on one tuning run, smallest measured size first;
    -1 pads."""
    c = scenario.n_settings
    difficulty = np.maximum(rng.normal(scenario.rating_mean, scenario.rating_sd, (sweeps, 1, scenario.n_tuning)), 1.0)
    baseline = difficulty * (1 + rng.normal(0, 0.1, (sweeps, 1, scenario.n_tuning)))
    quality = np.empty((sweeps, c))
    resistance = np.empty((sweeps, c))
    size = np.empty((sweeps, c))
    for j in range(c):
        runs = draw_runs(scenario, np.full(sweeps, j), scenario.n_tuning, 1, rng, baseline)
        quality[:, j] = runs.watermarked.sum((-2, -1)) / runs.baseline.sum((-2, -1))
        a = runs.attacks
        att = a.rating_attacked.sum((1, 3)) / a.rating_reference.sum((1, 2))[:, None]
        resistance[:, j] = hull_resistance(np.clip(att, 0, 1), a.detected.mean((1, 3)), a.no_attack.mean((1, 2)))
        size[:, j] = runs.sizes[:, 0]
    feasible = (quality >= scenario.constraints.min_relative_quality) & (
        resistance >= scenario.constraints.min_tamper_resistance)
    key = np.where(feasible, size, np.inf)
    order = np.argsort(key, axis=1, kind="stable")
    return np.where(np.take_along_axis(feasible, order, 1), order, -1)


def simulate(scenario: Scenario, sweeps: int, settings: Confirmation, seed: int = 0, confirm: bool = True,
             chunk: int = 100) -> pl.DataFrame:
    """One row per simulated sweep (one cell each): the old procedure's pick and whether it truly violates a
    constraint (``old_pick``, ``old_false``), and the confirmation procedure's ``status``, ``reason``, ``pick``,
    ``tries`` and ``false_confirmed`` (confirmed while the confirmed setting truly violates).

    ``confirm=False`` switches confirmation off: the first candidate is reported confirmed as the old procedure
    did (the negative control the simulation test must catch)."""
    rng = np.random.default_rng(seed)
    candidates = _tuning(scenario, sweeps, rng)
    violates = scenario.truth.violates(scenario.constraints)
    old_pick = candidates[:, 0]
    status = np.where(old_pick < 0, NO_FEASIBLE, UNRESOLVED).astype(object)
    reason = np.full(sweeps, "", dtype=object)
    first_reason = np.full(sweeps, "", dtype=object)
    any_unresolved = np.zeros(sweeps, bool)
    pick = np.full(sweeps, -1)
    tries = np.zeros(sweeps, int)
    if not confirm:
        status[old_pick >= 0], pick = CONFIRMED, old_pick
    else:
        n_a = max(1, round(scenario.n_confirm * scenario.attacked_fraction))
        a_counts = resample_counts(n_a, settings.resamples, settings.seed + 1)
        open_ = old_pick >= 0
        for t in range(min(settings.max_tries, scenario.n_settings)):
            active = np.flatnonzero(open_ & (candidates[:, t] >= 0))
            for start in range(0, active.size, chunk):
                rows = active[start:start + chunk]
                runs = draw_runs(scenario, candidates[rows, t], scenario.n_confirm, scenario.k, rng)
                _, q_low, q_high = quality_bounds(runs.watermarked, runs.baseline, settings.per_try,
                                                  scenario.constraints.min_relative_quality)
                r_low = r_high = np.full(rows.size, np.nan)
                if scenario.constraints.min_tamper_resistance > 0:
                    _, r_low, r_high = resistance_bounds(runs.attacks, settings.per_try, a_counts)
                undetected = ~np.isfinite(np.median(runs.sizes, axis=-1))
                st, why = verdict(undetected, q_low, q_high, r_low, r_high, scenario.constraints)
                tries[rows] += 1
                first_reason[rows] = np.where(first_reason[rows] == "", why, first_reason[rows])
                any_unresolved[rows] |= st == UNRESOLVED
                won = rows[st == CONFIRMED]
                status[won], pick[won] = CONFIRMED, candidates[won, t]
                open_[won] = False
        closed = (old_pick >= 0) & (status != CONFIRMED)
        status[closed] = np.where(any_unresolved[closed], UNRESOLVED, NOT_CONFIRMED)
        reason[closed] = first_reason[closed]
    return pl.DataFrame({
        "old_pick": old_pick, "old_false": (old_pick >= 0) & violates[np.maximum(old_pick, 0)],
        "status": status.astype(str), "reason": reason.astype(str), "pick": pick, "tries": tries,
        "false_confirmed": (pick >= 0) & violates[np.maximum(pick, 0)],
    })


def false_confirmation_rates(result: pl.DataFrame) -> dict[str, float]:
    """Share of simulated cells reported answered with a truly violating setting, old vs confirmed, and the
    shares of the confirmation statuses."""
    n = result.height
    rates = {"sweeps": float(n), "old": float(result["old_false"].sum()) / n,
             "confirmed": float(result["false_confirmed"].sum()) / n}
    for status in (CONFIRMED, NOT_CONFIRMED, UNRESOLVED, NO_FEASIBLE):
        rates[f"share {status}"] = float((result["status"] == status).sum()) / n
    return rates


# -- the adaptive sweep against the uniform grid, on the paper grid's shape ----------------------------------------

#: Per temperature, how much a distortion-free sampler's text varies (0: deterministic, never watermarked) —
#: a synthetic stand-in: lower temperature, larger watermarks.
_ENTROPY = {0.0: 0.0, 0.3: 0.45, 0.7: 0.8, 1.0: 1.0}
_DF_SIZE = {"exponential": 30.0, "inverse_transform": 40.0, "binary": 45.0}
MAX_TOKENS = 1024


def config_truth(overrides: dict, jitter: np.ndarray) -> tuple[float, float, tuple[float, float], float]:
    """Synthetic truth of one paper-grid config ``(relative quality, median size, (W_A swap, W_A typo), W_0)``
    from its params: distribution shift trades quality for size through δ; the distortion-free samplers keep
    quality (except short fixed keys, which repeat) and are undetectable at T = 0; windows and skips cost
    robustness; fixed keys and align/edit scores cost size. ``jitter`` (2 normals) spreads configs that share a
    rule. Plausible shapes, not measurements: what the simulation needs is a spread of configs on both sides of
    each constraint."""
    t = float(overrides["model.temperature"])
    sampler, score, randomness = overrides["scheme.sampler"], overrides["scheme.score"], overrides["scheme.randomness"]
    window = overrides.get("scheme.window") or 0
    key_length = overrides.get("scheme.key_length") or 0
    skip = overrides.get("scheme.skip_prob") or 0.0
    score_factor = {"sum": 1.0, "align": 1.4, "edit": 1.8}[score]
    if sampler == "distribution_shift":
        s = (float(overrides["scheme.delta"]) - 1.0) / 4.0
        quality = 1.01 - 0.2 * s - (0.03 if randomness == "window" and window == 0 else 0.0)
        quality -= 0.1 / key_length if key_length else 0.0
        size = 250.0 * np.exp(-2.2 * s) / (0.35 + 0.65 * _ENTROPY[t]) * score_factor * (1 + 0.05 * window)
        survival = (0.25 + 0.6 * s - 0.03 * window, 0.1 + 0.4 * s - 0.02 * window)
        no_attack = 0.75 + 0.25 * s
    else:
        quality = 1.0 - (0.25 / key_length if key_length else (0.03 if window == 1 else 0.0))
        entropy = _ENTROPY[t]
        size = np.inf if entropy == 0 else (_DF_SIZE[sampler] / entropy * (1 + 3 * skip) * (1 + 0.1 * window)
                                            * score_factor * (1 + 0.15 * np.log2(key_length) if key_length else 1))
        robust = 0.0 if entropy == 0 else 0.55 - 0.04 * window - 2.0 * skip
        survival = (robust, robust / 2)
        no_attack = 0.0 if entropy == 0 else 0.95 - skip
    quality += 0.01 * float(jitter[0])
    size *= float(np.exp(0.15 * jitter[1]))
    return quality, (size if size <= MAX_TOKENS else np.inf), tuple(float(np.clip(v, 0.01, 0.99)) for v in survival), \
        float(np.clip(no_attack, 0.0, 0.99))


def paper_groups(configs: list, seed: int = 0) -> dict[str, tuple[list[str], Truth]]:
    """The paper grid's groups (temperature x family, :func:`mmw.sweep.collect.family` of the sampler) with the
    synthetic truth of each config (:func:`config_truth`; the jitter is fixed by ``seed``, so every simulated sweep
    shares one truth)."""
    rng = np.random.default_rng(seed)
    grouped: dict[str, list] = {}
    for config in configs:
        o = config.overrides
        grouped.setdefault(f"T={o['model.temperature']:g} {o['scheme.sampler']}", []).append(config)
    out = {}
    for label, members in grouped.items():
        rows = [config_truth(c.overrides, rng.normal(size=2)) for c in members]
        out[label] = ([c.config_id for c in members], Truth(
            relative_quality=np.array([r[0] for r in rows]), size=np.array([r[1] for r in rows]),
            survival=np.array([r[2] for r in rows]), retained=np.tile([0.9, 0.6], (len(rows), 1)),
            no_attack=np.array([r[3] for r in rows])))
    return out


def draw_tuning(truth: Truth, sweeps: int, n: int, rng: np.random.Generator, quality_sd: float = QUALITY_SD,
                rating_mean: float = 50.0, rating_sd: float = 12.5):
    """Per-prompt tuning results of every config of a group in ``sweeps`` sweeps on ``n`` prompts (in shard
    order; every third prompt attacked; one shared baseline per sweep), with :func:`draw_runs`' noise model."""
    c = truth.relative_quality.shape[0]
    difficulty = np.maximum(rng.normal(rating_mean, rating_sd, (sweeps, 1, n)), 1.0)
    baseline = np.broadcast_to(difficulty * (1 + rng.normal(0, 0.1, (sweeps, 1, n))), (sweeps, c, n))
    baseline = np.clip(baseline, 0.0, RATING_MAX)
    watermarked = np.clip(truth.relative_quality[:, None] * baseline * (1 + rng.normal(0, quality_sd, (sweeps, c, n))),
                          0.0, RATING_MAX)
    sizes = truth.size[:, None] * np.exp(rng.normal(0, 0.5, (sweeps, c, n)))
    sizes = np.where(sizes > MAX_TOKENS, np.inf, sizes)
    attacked = np.arange(0, n, 3)
    m = truth.survival.shape[1]
    detected = (rng.random((sweeps, c, m, attacked.size)) < truth.survival[:, :, None]).astype(float)
    reference = watermarked[..., attacked]
    rating_attacked = (truth.retained[:, :, None] * reference[:, :, None, :]
                       * (1 + rng.normal(0, quality_sd, (sweeps, c, m, attacked.size))))
    no_attack = (rng.random((sweeps, c, attacked.size)) < truth.no_attack[:, None]).astype(float)
    return Tuning(watermarked, baseline, sizes, AttackEvidence(detected, rating_attacked, reference, no_attack))


def _prefix(tuning, n: int):
    """The first ``n`` prompts of a :class:`~mmw.sweep.race_bounds.Tuning` (their attacked ones too)."""
    n_a = -(-n // 3)
    return tuning.map(lambda values: values[..., :n], lambda values: values[..., :n_a])


def _bounds_of(data: Tuning, running: np.ndarray, n: int, alpha: float) -> Bounds:
    """:func:`~mmw.sweep.race_bounds.race_bounds` on the first ``n`` prompts of the running configs only (``(S, C)``
    mask; the others get NaN, which :class:`~mmw.sweep.race.Race` ignores)."""
    part = _prefix(data, n)
    picked = race_bounds(part.map(lambda values: values[running]), alpha)
    out = {}
    for f in Bounds.__dataclass_fields__:
        full = np.full(running.shape, np.nan)
        full[running] = getattr(picked, f)
        out[f] = full
    return Bounds(**out)


def _confirm_verdicts(truth: Truth, pairs: np.ndarray, constraints: list[Constraints], settings: Confirmation,
                      n_confirm: int, k: int, rng: np.random.Generator, quality_sd: float = QUALITY_SD
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Confirmation runs (K on ``n_confirm`` fresh prompts) of config ``pairs[i]``, judged for every constraint:
    statuses and reasons ``(P, X)``."""
    scenario = Scenario(truth, constraints[0], n_confirm=n_confirm, k=k, quality_sd=quality_sd)
    runs = draw_runs(scenario, pairs, n_confirm, k, rng)
    n_a = max(1, round(n_confirm * scenario.attacked_fraction))
    quality = {q: quality_bounds(runs.watermarked, runs.baseline, settings.per_try, q)[1:]
               for q in {c.min_relative_quality for c in constraints}}  # each bound anchored at its constraint
    _, r_low, r_high = resistance_bounds(runs.attacks, settings.per_try,
                                         resample_counts(n_a, settings.resamples, settings.seed + 1))
    undetected = ~np.isfinite(np.median(runs.sizes, axis=-1))
    out = [verdict(undetected, *quality[c.min_relative_quality], r_low, r_high, c) for c in constraints]
    return np.stack([o[0] for o in out], axis=1), np.stack([o[1] for o in out], axis=1)


def _walk(candidates: np.ndarray, status_of: Callable, max_tries: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Confirmation of one cell per row: candidates ``(S, C)``; ``status_of(row, config)`` the try's status.
    Returns status, pick (-1) and the tried configs ``(S, max_tries)`` (-1)."""
    sweeps = candidates.shape[0]
    status = np.where(candidates[:, 0] < 0, NO_FEASIBLE, NOT_CONFIRMED).astype(object)
    pick = np.full(sweeps, -1)
    tried = np.full((sweeps, max_tries), -1)
    for s in range(sweeps):
        unresolved = False
        for t in range(min(max_tries, candidates.shape[1])):
            config = candidates[s, t]
            if config < 0:
                break
            tried[s, t] = config
            st = status_of(s, config)
            if st == CONFIRMED:
                status[s], pick[s] = CONFIRMED, config
                break
            unresolved |= st == UNRESOLVED
        if status[s] != CONFIRMED and candidates[s, 0] >= 0:
            status[s] = UNRESOLVED if unresolved else NOT_CONFIRMED
    return status, pick, tried


def simulate_adaptive(groups: dict[str, tuple[list[str], Truth]], schedule: Schedule, sweeps: int, tuning: int,
                      n_confirm: int, k: int, settings: Confirmation, cost: CostModel, tasks: int = 3, seed: int = 0,
                      chunk: int = 100, budget_fraction: float | None = None, quality_sd: float = QUALITY_SD
                      ) -> pl.DataFrame:
    """One row per simulated sweep x group x constraint (cell): the uniform grid's and the race's status, pick
    and whether the pick truly violates the constraint, on the **same** simulated data (the race sees prefixes of
    the grid's tuning prompts; a config confirmed by both is judged on the same confirmation runs), and per row
    the tuning and confirmation seconds of the group (repeated on its cells: sum over one cell per group).

    ``schedule``: :class:`mmw.sweep.schedule.Schedule` (cumulative per-task prompts; its budget is ignored when
    ``budget_fraction`` is given: the race's budget is then that share of the grid's tuning cost); ``tuning``:
    tuning prompts per task of the grid; ``cost``: :class:`mmw.sweep.cost.CostModel`."""
    constraints = [Constraints(loss, r) for loss, r in PAPER_CONSTRAINTS]
    rng = np.random.default_rng(seed)
    n_total = tuning * tasks
    total_configs = sum(len(ids) for ids, _ in groups.values())
    grid_unit = float(cost.unit(n_total))
    if budget_fraction is not None:
        schedule = schedule.model_copy(update={"budget_s": budget_fraction * total_configs * grid_unit})
    budget_cell = np.inf if schedule.budget_s is None else schedule.budget_s / (len(groups) * len(constraints))
    uniform = Schedule.uniform(tuning, schedule.keep)
    frames = []
    for label, (ids, truth) in groups.items():
        violates = np.stack([truth.violates(c) for c in constraints])  # (X, C)
        best = []  # per cell, the keep truly smallest feasible (and detected) configs
        for x in range(len(constraints)):
            ok = np.flatnonzero(~violates[x] & np.isfinite(truth.size))
            best.append(ok[np.argsort(truth.size[ok], kind="stable")][:schedule.keep])
        c = len(ids)
        for start in range(0, sweeps, chunk):
            size = min(chunk, sweeps - start)
            data = draw_tuning(truth, size, n_total, rng, quality_sd)
            alpha = schedule.alpha(c, truth.survival.shape[1])
            results, plans = {}, {}
            for name, plan in (("uniform", uniform), ("adaptive", schedule)):
                state = Race((size, c), plan, constraints, lambda r, plan=plan: float(cost.unit(plan.shard(r)[1] *
                                                                                               tasks)), budget_cell)
                for r in range(plan.rounds):
                    running = state.plan(r)
                    if not running.any():
                        break
                    state.update(r, _bounds_of(data, running, plan.shards[r] * tasks, alpha))
                results[name] = state.result()
                plans[name] = plan
            # Confirmation runs, drawn once per (sweep, config) that either procedure tries.
            needed = np.unique(np.concatenate([
                (np.arange(size)[:, None, None] * c + results[n].candidates[:, :, :settings.max_tries]).reshape(-1)
                [results[n].candidates[:, :, :settings.max_tries].reshape(-1) >= 0] for n in results]))
            statuses, _ = _confirm_verdicts(truth, needed % c, constraints, settings, n_confirm, k, rng, quality_sd)
            where = {int(p): i for i, p in enumerate(needed)}
            tried_by = {name: [set() for _ in range(size)] for name in results}
            rows = []
            for x, constraint in enumerate(constraints):
                row = {"group": label, "cell": x, "max_quality_loss": constraint.max_quality_loss,
                       "min_tamper_resistance": constraint.min_tamper_resistance}
                columns = {}
                for name, result in results.items():
                    plan = plans[name]
                    status, pick, tried = _walk(result.candidates[:, x, :], lambda s, cfg, x=x:
                                                statuses[where[s * c + cfg], x], settings.max_tries)
                    for s, t in enumerate(tried):
                        tried_by[name][s].update(int(v) for v in t if v >= 0)
                    columns[f"{name}_status"] = status.astype(str)
                    columns[f"{name}_pick"] = pick
                    columns[f"{name}_false"] = (pick >= 0) & violates[x][np.maximum(pick, 0)]
                    columns[f"{name}_tuning_s"] = result.cost_s
                    # The race's own guarantee: a cell's truly smallest feasible configs are never dropped.
                    columns[f"{name}_lost"] = (result.codes[:, x, best[x]] != 0).any(-1) if best[x].size else \
                        np.zeros(size, bool)
                    columns[f"{name}_units"] = result.units.sum(-1)
                    columns[f"{name}_round_units"] = result.round_units.tolist()
                    columns[f"{name}_round_prompts"] = [[plan.shard(r)[1] * tasks for r in range(plan.rounds)]] * size
                    columns[f"{name}_tried"] = tried.tolist()  # the configurations confirmation tried (-1 pads)
                    columns[f"{name}_left_at"] = result.left_at[:, x, :].tolist()  # round each left the cell
                rows.append(pl.DataFrame({"sweep": np.arange(start, start + size), **row, **columns}))
            confirmed_configs = {f"{name}_confirm_configs": [len(t) for t in tried_by[name]] for name in results}
            frames += [r.with_columns(pl.Series(k, v) for k, v in confirmed_configs.items()) for r in rows]
    return pl.concat(frames)


def priced(result: pl.DataFrame, name: str, cost: CostModel, n_confirm: int, k: int, tasks: int = 3
           ) -> tuple[float, float]:
    """``(tuning, confirmation)`` seconds of ``name`` (uniform / adaptive) summed over the result's sweeps and
    groups under ``cost``: each group's round ``r`` is ``cost.units(configurations that ran it, its prompts)``
    (so any fixed cost and packing prices the same simulated decisions); confirmation is K runs of every distinct
    configuration the group tried, packed alike."""
    per_group = result.filter(pl.col("cell") == 0)
    units = np.array(per_group[f"{name}_round_units"].to_list(), dtype=float)
    prompts = np.array(per_group[f"{name}_round_prompts"].to_list(), dtype=float)
    tuning = float(np.sum(cost.units(units, prompts)))
    tried = per_group[f"{name}_confirm_configs"].to_numpy().astype(float)
    return tuning, float(k * np.sum(cost.units(tried, n_confirm * tasks)))


def adaptive_summary(result: pl.DataFrame, cost: CostModel, n_confirm: int, k: int, tasks: int = 3) -> dict[str, float]:
    """Agreement on the cells the grid resolves (status confirmed, not confirmed or no feasible setting: same
    status and same pick), cost ratios (tuning units; and with confirmation: K runs per distinct config tried,
    baselines aside; :func:`priced`), and both procedures' false-confirmation rates."""
    resolved = result.filter(pl.col("uniform_status") != UNRESOLVED)
    agree = resolved.filter((pl.col("adaptive_status") == pl.col("uniform_status"))
                            & (pl.col("adaptive_pick") == pl.col("uniform_pick")))
    costs = {name: priced(result, name, cost, n_confirm, k, tasks) for name in ("uniform", "adaptive")}
    out = {"sweeps": float(result["sweep"].n_unique()), "cells": float(result.height),
           "resolved": resolved.height / result.height, "resolved_cells": float(resolved.height),
           "agreement": agree.height / max(resolved.height, 1),
           "tuning_ratio": costs["adaptive"][0] / costs["uniform"][0]}
    for name in ("uniform", "adaptive"):
        out[f"{name}_tuning_s"] = costs[name][0] / out["sweeps"]
        out[f"{name}_total_s"] = sum(costs[name]) / out["sweeps"]
        out[f"{name}_false"] = float(result[f"{name}_false"].mean())
        out[f"{name}_confirmed"] = float((result[f"{name}_status"] == CONFIRMED).mean())
        # Per group (the race's level is per group): any cell lost a truly smallest feasible config.
        out[f"{name}_lost"] = float(result.group_by(["sweep", "group"]).agg(pl.col(f"{name}_lost").any())
                                    [f"{name}_lost"].mean())
    out["total_ratio"] = out["adaptive_total_s"] / out["uniform_total_s"]
    return out


def _distinct_tried(name: str) -> pl.Expr:
    """Per aggregation group: how many distinct configurations ``name``'s confirmation tried (-1 pads)."""
    tried = pl.col(f"{name}_tried").list.explode()
    return tried.filter(tried >= 0).n_unique()


def tried_per_group(result: pl.DataFrame, name: str = "uniform") -> float:
    """Mean over (sweep, group) of the distinct configurations ``name``'s confirmation tried in the group's cells."""
    return float(result.group_by("sweep", "group").agg(tried=_distinct_tried(name))["tried"].mean())


def oracle_priced(result: pl.DataFrame, first: int, tuning: int, cost: CostModel, n_confirm: int, k: int,
                  tasks: int = 3) -> tuple[float, float]:
    """``(tuning, confirmation)`` seconds of the **oracle race**: round 1 runs every configuration on the first
    ``first`` prompts per task (as every race does), then only the configurations the uniform grid's
    confirmation went on to try in some cell of the group run the remaining ``tuning - first`` prompts, in one
    round. It knows after round 1 what the grid will try, so it agrees with the grid in every cell: a floor on
    what any race with that round 1 pays for full agreement (confirmation as the grid's)."""
    per_group = result.group_by("sweep", "group", maintain_order=True).agg(
        configs=pl.col("uniform_round_units").first().list.first(), tried=_distinct_tried("uniform"),
        confirm=pl.col("uniform_confirm_configs").first())
    configs, tried = (per_group[c].to_numpy().astype(float) for c in ("configs", "tried"))
    spent = np.sum(cost.units(configs, first * tasks)) + np.sum(cost.units(tried, (tuning - first) * tasks))
    confirm = k * np.sum(cost.units(per_group["confirm"].to_numpy().astype(float), n_confirm * tasks))
    return float(spent), float(confirm)


def informed_priced(result: pl.DataFrame, cost: CostModel, n_confirm: int, k: int, tasks: int = 3
                    ) -> tuple[float, float]:
    """``(tuning, confirmation)`` seconds of the race **told after round 1 which cells the grid leaves
    unresolved**: those cells hold no configuration from round 2 on and confirm nothing; every other cell keeps
    exactly the race's decisions (a cell's screen does not depend on the other cells), so its answers, and the
    agreement on the cells the grid resolves, are the race's. A configuration runs round ``r`` when a cell the grid
    resolves still holds it (it left that cell at round ``r`` or later, or never)."""
    total_tuning = total_confirm = 0.0
    for _, part in result.group_by("sweep", "group"):
        resolved = part.filter(pl.col("uniform_status") != UNRESOLVED)
        units = part["adaptive_round_units"][0].to_list()
        prompts = part["adaptive_round_prompts"][0].to_list()
        total_tuning += float(cost.units(units[0], prompts[0]))
        if resolved.height:
            left = np.array(resolved["adaptive_left_at"].to_list())  # (cells, C)
            for r in range(1, len(units)):
                if units[r]:
                    held = int(((left < 0) | (left >= r)).any(0).sum())
                    total_tuning += float(cost.units(held, prompts[r]))
            tried = np.array(resolved["adaptive_tried"].to_list())
            total_confirm += k * float(cost.units(np.unique(tried[tried >= 0]).size, n_confirm * tasks))
    return total_tuning, total_confirm
