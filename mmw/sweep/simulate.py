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
:class:`Truth` and the per-run draws (:func:`draw_runs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from mmw.selection import Constraints
from mmw.sweep.confirm import (
    CONFIRMED,
    NO_FEASIBLE,
    NOT_CONFIRMED,
    UNRESOLVED,
    AttackEvidence,
    ConfirmSettings,
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
    rating_mean: float = 6.0
    rating_sd: float = 1.5

    @property
    def n_settings(self) -> int:
        return int(self.truth.relative_quality.shape[0])


@dataclass(frozen=True)
class Runs:
    """Draws of runs for a batch of sweeps, one setting each: ratings ``(S, K, n)``, sizes ``(S, K)`` (median
    per run) and the attacked prompts (:class:`AttackEvidence`, ``n_a`` = the first prompts)."""

    watermarked: np.ndarray
    baseline: np.ndarray
    sizes: np.ndarray
    attacks: AttackEvidence


def draw_runs(scenario: Scenario, setting: np.ndarray, n: int, k: int, rng: np.random.Generator,
              baseline: np.ndarray | None = None) -> Runs:
    """``K`` runs on ``n`` prompts of setting ``setting[s]`` in each sweep ``s`` (shape ``(S,)``).

    ``baseline`` ``(S, K, n)`` shares one baseline between settings (a sweep's configs share the seed's
    baseline); by default each run draws its own (a fresh seed per re-run)."""
    truth, sweeps = scenario.truth, setting.shape[0]
    if baseline is None:
        difficulty = np.maximum(rng.normal(scenario.rating_mean, scenario.rating_sd, (sweeps, 1, n)), 1.0)
        baseline = difficulty * (1 + rng.normal(0, 0.1, (sweeps, k, n)))
    rho = truth.relative_quality[setting][:, None, None]
    watermarked = rho * baseline * (1 + rng.normal(0, scenario.quality_sd, (sweeps, k, n)))
    sizes = np.median(truth.size[setting][:, None, None] * np.exp(rng.normal(0, 0.5, (sweeps, k, n))), axis=-1)
    n_a = max(1, round(n * scenario.attacked_fraction))
    m = truth.survival.shape[1]
    survival = truth.survival[setting][:, None, :, None]
    detected = (rng.random((sweeps, k, m, n_a)) < survival).astype(float)
    reference = watermarked[..., :n_a]
    attacked = (truth.retained[setting][:, None, :, None] * reference[:, :, None, :]
                * (1 + rng.normal(0, scenario.quality_sd, (sweeps, k, m, n_a))))
    no_attack = (rng.random((sweeps, k, n_a)) < truth.no_attack[setting][:, None, None]).astype(float)
    return Runs(watermarked, baseline, sizes, AttackEvidence(detected, attacked, reference, no_attack))


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


def simulate(scenario: Scenario, sweeps: int, settings: ConfirmSettings, seed: int = 0, confirm: bool = True,
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
        counts = resample_counts(scenario.n_confirm, settings.resamples, settings.seed)
        a_counts = resample_counts(n_a, settings.resamples, settings.seed + 1)
        open_ = old_pick >= 0
        for t in range(min(settings.max_tries, scenario.n_settings)):
            active = np.flatnonzero(open_ & (candidates[:, t] >= 0))
            for start in range(0, active.size, chunk):
                rows = active[start:start + chunk]
                runs = draw_runs(scenario, candidates[rows, t], scenario.n_confirm, scenario.k, rng)
                _, q_low, q_high = quality_bounds(runs.watermarked, runs.baseline, settings.per_try, counts)
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
