"""Confirmed picks: each cell's tuning pick re-checked on held-out prompts with one-sided confidence bounds.

A pick is the smallest of many noisy measurements, so its own numbers are optimistic (the winner's curse). The
procedure here separates the two roles of the data:

1. **Tuning**: per cell (temperature x family x constraint) the candidates are the settings feasible on the tuning
   runs (point estimates, :func:`mmw.selection.select`), ranked by one kind of valid size (:func:`size_kind`).
2. **Confirmation**: the first candidate is re-run ``K`` times with fresh keys and seeds on a disjoint set of
   prompts. From those runs alone:

   * relative quality, paired by prompt against the same prompts' baseline: a one-sided lower bound that holds
     for any ratings in the judge's range and for prompts of different quality (:func:`mmw.betting.ratio_bounds`,
     a final-time betting test on the prompts' paired differences ``w - (1 - loss) b``, each prompt's K runs
     summed, with bets fixed before the data), confirmed when ``>= 1 - loss``;
   * tamper resistance ``R`` (the convex-hull area of :func:`mmw.metrics.tamper_resistance`): a one-sided lower
     bound by a bootstrap over the attacked prompts, confirmed when ``> min R``;
   * detection: the median size over the K runs must be finite.

   When the pick fails, the next candidates may be tried, at most ``max_tries`` in all; each try's bounds are at
   level ``level / max_tries`` (Bonferroni), so the chance that a cell is reported **confirmed** with a setting
   that truly violates a constraint is at most ``level`` per cell, fallbacks included.

Statuses per cell: ``confirmed``; ``not confirmed`` (reason ``quality``, ``R`` or ``undetected``: the upper bound
lies below the constraint, or the median size is infinite); ``unresolved`` (an interval straddles a constraint:
more prompts are needed, see :mod:`mmw.sweep.plan`); ``no feasible setting`` (nothing passed tuning); ``pending``
(the next try has no confirmation runs yet: run them and judge again).

Array shapes: ``K`` runs, ``n`` prompts, ``m`` attacks counted in ``R``, ``n_a`` attacked prompts, ``B``
bootstrap resamples; every bound function accepts extra leading batch dimensions (the simulator of
`bench/sweep_simulation.py` judges thousands of cells in one call). Missing values are NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
import polars as pl
from pydantic import AfterValidator, ValidationError

from mmw.betting import ratio_bounds
from mmw.errors import SpecError
from mmw.selection import PAPER_CONSTRAINTS, Constraints, median_mad, select
from mmw.validation import Integer, Section, allowed, spec_error

CONFIRMED, NOT_CONFIRMED, UNRESOLVED, NO_FEASIBLE, PENDING = (
    "confirmed", "not confirmed", "unresolved", "no feasible setting", "pending")
STATUSES = (CONFIRMED, NOT_CONFIRMED, UNRESOLVED, NO_FEASIBLE, PENDING)
#: Size columns a cell can be ranked by, in order of preference (``all.size`` is the paper's E, kept beside).
SIZE_ANYTIME, SIZE_VALID, SIZE_E = "all.size_anytime", "all.size_valid", "all.size"
#: The ratings' range: the judge grades 0..100 (:data:`mmw.judge.judge.MAX_GRADE`; not imported, it loads torch). The
#: quality bound holds for any ratings inside it.
RATING_MAX = 100.0
#: Fewest prompts for a bootstrap bound (as :data:`mmw.metrics.MIN_BOOTSTRAP_PAIRS`: fewer have too few distinct
#: resamples for a tail quantile).
MIN_PROMPTS = 5


#: The quality losses of the paper's constraints, each confirmed cell's first coordinate.
QUALITY_LOSSES = tuple(sorted({loss for loss, _ in PAPER_CONSTRAINTS}))


def _paper_loss(value: float) -> float:
    if value not in QUALITY_LOSSES:
        raise ValueError(f"got {value!r}: the paper's table has the constraints quality loss <= "
                         + " and <= ".join(f"{loss:.0%}".replace("%", " %") for loss in QUALITY_LOSSES))
    return value


def _distinct(values: list[float]) -> list[float]:
    if len(set(values)) < len(values):
        raise ValueError(f"got {values!r}: a loss is listed twice")
    return values


#: The R targets of the paper's constraints (0: none).
R_TARGETS = tuple(sorted({r for _, r in PAPER_CONSTRAINTS}))
#: What a plan or a definition says of a cell that no confirmation within the tasks' prompts can resolve.
CANNOT = "cannot be resolved with the prompts the tasks hold"


def _r_target(value: float) -> float:
    if value not in R_TARGETS:
        raise ValueError(f"got {value!r}: the paper's R targets are {list(R_TARGETS)}")
    return value


class ExtensionCell(Section):
    """One open cell of a later confirmation round (:class:`Extension`): which cell (temperature, family, and the
    R targets of its constraints), at how many held-out prompts per task and runs per prompt."""

    temperature: float = allowed("a temperature of the sweep, e.g. 1.0")
    family: str = allowed("a family of the sweep's table (a sampler, or a plugin's name), e.g. reweight")
    min_r: Annotated[list[Annotated[float, AfterValidator(_r_target)]], AfterValidator(_distinct)] = allowed(
        f"a non-empty subset of {list(R_TARGETS)} (the cells with and without the R target)", min_length=1,
        default=list(R_TARGETS))
    prompts: Integer = allowed("an integer >= 1 (held-out prompts per task)", ge=1)
    k: Integer = allowed("an integer >= 2 (runs per prompt: an interval over runs needs two)", ge=2)


class Extension(Section):
    """A later confirmation round, declared before its data: each listed cell that rounds before it left
    unresolved re-tests its candidate (the setting its last try judged) once, on ``prompts`` fresh held-out
    prompts per task from ``offset`` with ``k`` runs (seeds ``first_seed ..``, fresh keys), at level ``level``.

    Cells at one temperature share one prompt range (so their runs share each seed's baseline). The cell's chance
    of a false confirmation is at most the sum of the levels of every try it had (the union bound):
    :attr:`Confirmation.level` over the first rounds, plus ``level`` per later round that judged it."""

    name: str = allowed("a short name of the round, e.g. round 3")
    level: float = allowed("a number in (0, 0.5): this round's one try per cell", gt=0, lt=0.5)
    offset: Integer = allowed("an integer >= 0 (the round's first held-out prompt per task)", ge=0)
    first_seed: Integer = allowed("an integer >= 0 (seeds first_seed .. first_seed + k - 1)", ge=0)
    cells: list[ExtensionCell] = allowed("a non-empty list of {temperature, family, min_r, prompts, k}",
                                         min_length=1)

    def per_task(self, temperature: float) -> int | None:
        """The round's held-out prompts per task at ``temperature`` (None: no cell there)."""
        return next((c.prompts for c in self.cells if c.temperature == temperature), None)

    def seeds(self, k: int) -> list[int]:
        return list(range(self.first_seed, self.first_seed + k))

    @property
    def max_k(self) -> int:
        return max(c.k for c in self.cells)

    def cell(self, temperature: float, family: str, min_r: float) -> ExtensionCell | None:
        """The entry declaring the cell (``temperature``, ``family``, R target ``min_r``), or None."""
        return next((c for c in self.cells if c.temperature == temperature and c.family == family
                     and min_r in c.min_r), None)


class Confirmation(Section):
    """How a sweep's cells are confirmed: its definition's ``confirm`` section, the one model of it from the file
    to the tables (validated like every params section: a bad value is a SpecError naming ``confirm.<key>`` and
    what it accepts).

    * ``level`` in (0, 0.5): the per-cell chance of confirming a setting that violates a constraint;
    * ``max_tries`` >= 1: the pick plus at most ``max_tries - 1`` fallbacks; each try is tested at
      ``level / max_tries``;
    * ``resamples`` >= 200 bootstrap resamples of R's bound, ``seed`` of the resampling (deterministic bounds);
    * ``prompts`` held-out prompts per task from position ``offset`` (None as written: right after the tuning
      prompts; an expanded sweep's is resolved, :meth:`mmw.sweep.definition.SweepFile.confirmation`);
    * ``quality_losses``: the paper's quality-loss constraints whose cells are confirmed (both by default).
    """

    level: float = allowed("a number in (0, 0.5), e.g. 0.05", gt=0, lt=0.5, default=0.05)
    max_tries: Integer = allowed("an integer >= 1 (the pick plus fallbacks), e.g. 2", ge=1, default=2)
    resamples: Integer = allowed("an integer >= 200", ge=200, default=2000)
    seed: Integer = allowed("an integer >= 0", ge=0, default=0)
    prompts: Integer = allowed("an integer >= 1 (per task)", ge=1)
    offset: Integer | None = allowed("an integer >= 0 (default: after the tuning prompts)", ge=0, default=None)
    quality_losses: Annotated[list[Annotated[float, AfterValidator(_paper_loss)]], AfterValidator(_distinct)] = \
        allowed(f"a non-empty subset of {list(QUALITY_LOSSES)}", min_length=1, default=list(QUALITY_LOSSES))
    #: Later rounds for the cells the first ones left open (:class:`Extension`), in the order they run.
    extend: list[Extension] = allowed("a list of later rounds {name, level, offset, first_seed, cells}",
                                      default=[])

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise spec_error(err, type(self), "confirm") from None

    @property
    def per_try(self) -> float:
        """The level of each try's one-sided bounds."""
        return self.level / self.max_tries

    @property
    def total_level(self) -> float:
        """The most a cell judged in every round can err (the union bound over its tries): ``level`` over the
        first rounds plus each later round's level."""
        return self.level + sum(e.level for e in self.extend)

    def round_of_seed(self, seed: int | None) -> Extension | None:
        """The later round whose runs carry ``seed`` (None: the first rounds')."""
        return next((e for e in self.extend if seed is not None and e.first_seed <= seed < e.first_seed + e.max_k),
                    None)

    @property
    def constraints(self) -> tuple[tuple[float, float], ...]:
        """The paper's (quality loss, R) constraints this sweep confirms, in the paper's order."""
        return tuple(c for c in PAPER_CONSTRAINTS if c[0] in self.quality_losses)

    @property
    def overrides(self) -> dict[str, int]:
        """What a confirmation run sets on top of its config (``offset`` resolved)."""
        assert self.offset is not None, "an expanded sweep's confirmation has its offset"
        return {"prompts.offset": self.offset, "prompts.per_task": self.prompts}


# -- bootstrap over prompts -------------------------------------------------------------------------------------

def resample_counts(n: int, resamples: int, seed: int) -> np.ndarray:
    """Shape ``(n, B)``: how often each of ``n`` prompts is drawn in each of ``B`` bootstrap resamples.

    A resampled sum of per-prompt values ``x`` (shape ``(..., n)``) is then ``x @ counts``, shape ``(..., B)``."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    counts = np.zeros((resamples, n), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(resamples), n), draws.ravel()), 1.0)
    return counts.T


def _tails(samples: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper one-sided percentile bounds (level ``alpha`` each) along the last axis; NaN resamples
    (an empty denominator) count as missing."""
    return np.nanquantile(samples, alpha, axis=-1), np.nanquantile(samples, 1 - alpha, axis=-1)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def paired_sums(watermarked: np.ndarray, baseline: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt, the sums over runs of the ratings rated on both sides: shapes ``(..., K, n)`` -> ``(..., n)``
    twice (a pair with a missing side is dropped, as :func:`mmw.metrics.paired_relative_quality` does)."""
    both = ~(np.isnan(watermarked) | np.isnan(baseline))
    return np.where(both, watermarked, 0.0).sum(axis=-2), np.where(both, baseline, 0.0).sum(axis=-2)


def quality_bounds(watermarked: np.ndarray, baseline: np.ndarray, alpha: float, at: np.ndarray | float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Relative quality ``sum(w) / sum(b)`` over the paired (run, prompt) ratings and its one-sided lower and
    upper bounds at level ``alpha`` each, valid for any ratings in ``[0, RATING_MAX]`` and for prompts that are
    independent but not identically distributed (tasks and prompts may differ in quality; only the pooled ratio
    is tested, in any order of the prompts): the final-time betting bounds of :func:`mmw.betting.ratio_bounds` on
    each prompt's paired sums over the runs divided by ``K`` (so the prompts' pooled ratio is exactly the
    estimate, a prompt with missing runs weighing less), anchored at the constraint ``at`` (so ``low >= at`` is
    exactly the level-``alpha`` test there).

    Args:
        watermarked, baseline: ratings, shape ``(..., K, n)``; run k's baseline is the same prompt's baseline of
            run k's seed.
        at: the relative quality the bounds are judged against, ``(...)`` or a number.

    Returns:
        ``(estimate, low, high)``, each of the batch shape.
    """
    w, b = paired_sums(watermarked, baseline)
    estimate = _ratio(w.sum(axis=-1), b.sum(axis=-1))
    runs = watermarked.shape[-2]
    low, high = ratio_bounds(w / runs, b / runs, alpha, RATING_MAX, at)
    return estimate, low, high


def hull_resistance(quality: np.ndarray, watermarked: np.ndarray, no_attack: np.ndarray) -> np.ndarray:
    """``R`` for many attack sets at once: twice the area under the greatest convex minorant of the points
    ``(0, 0)``, ``(1, W_0)`` and the attacks ``(Q_A, W_A)`` on [0, 1] — the lower hull chain of
    :func:`mmw.metrics.tamper_frontier` (vertical edges carry no area).

    A convex minorant at ``x`` is the lowest chord through ``x`` between two points, and it is linear between the
    points' abscissas, so its area is a trapezoid sum over them.

    Args:
        quality, watermarked: ``(..., m)`` attack coordinates in [0, 1] (NaN: the attack is left out).
        no_attack: ``(...)`` the measured ``W_0``.

    Returns:
        ``(...)`` R in [0, 1] (NaN where ``W_0`` is NaN or no attack is usable, as
        :func:`mmw.metrics.tamper_resistance_of` returns None there).
    """
    usable = ~(np.isnan(quality) | np.isnan(watermarked))
    shape = no_attack.shape
    x = np.concatenate([np.zeros(shape + (1,)), np.ones(shape + (1,)), np.where(usable, quality, 0.0)], axis=-1)
    y = np.concatenate([np.zeros(shape + (1,)), no_attack[..., None], np.where(usable, watermarked, 0.0)], axis=-1)
    # A left-out attack becomes a copy of (0, 0), which never changes the minorant.
    f = y.copy()
    points = x.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(points):
            xi, yi = x[..., i:i + 1], y[..., i:i + 1]
            for j in range(points):
                xj, yj = x[..., j:j + 1], y[..., j:j + 1]
                bracket = (xi <= x) & (x <= xj) & (xj > xi)
                chord = yi + (yj - yi) * (x - xi) / np.where(xj > xi, xj - xi, 1.0)
                f = np.where(bracket & (chord < f), chord, f)
    order = np.argsort(x, axis=-1)
    xs, fs = np.take_along_axis(x, order, -1), np.take_along_axis(f, order, -1)
    area = (np.diff(xs, axis=-1) * (fs[..., 1:] + fs[..., :-1]) / 2).sum(axis=-1)
    r = np.clip(2 * area, 0.0, 1.0)
    return np.where(np.isnan(no_attack) | ~usable.any(axis=-1), np.nan, r)


@dataclass(frozen=True)
class AttackEvidence:
    """The attacked prompts of K runs (prompts aligned across runs; NaN = missing or the attack failed).

    * ``detected``: ``(..., K, m, n_a)`` 1/0, the attacked text still detected;
    * ``rating_attacked``: ``(..., K, m, n_a)`` the attacked text's rating;
    * ``rating_reference``: ``(..., K, n_a)`` the rating of the watermarked text it came from;
    * ``no_attack``: ``(..., K, n_a)`` 1/0, the watermarked text detected from its text (``W_0``'s rows).
    """

    detected: np.ndarray
    rating_attacked: np.ndarray
    rating_reference: np.ndarray
    no_attack: np.ndarray

    @property
    def n_prompts(self) -> int:
        return int(self.no_attack.shape[-1])


def _resistance_sums(attacks: AttackEvidence) -> tuple[np.ndarray, ...]:
    """Per prompt, sums over runs: detections and their count ``(..., m, n_a)``; the paired attacked and
    reference ratings ``(..., m, n_a)``; ``W_0``'s detections and count ``(..., n_a)``."""
    det = attacks.detected
    seen = ~np.isnan(det)
    ref = np.broadcast_to(attacks.rating_reference[..., None, :], attacks.rating_attacked.shape)
    both = ~(np.isnan(attacks.rating_attacked) | np.isnan(ref))
    w0_seen = ~np.isnan(attacks.no_attack)
    return (np.where(seen, det, 0.0).sum(-3), seen.sum(-3).astype(float),
            np.where(both, attacks.rating_attacked, 0.0).sum(-3), np.where(both, ref, 0.0).sum(-3),
            np.where(w0_seen, attacks.no_attack, 0.0).sum(-2), w0_seen.sum(-2).astype(float))


def _resistance_of_sums(det: np.ndarray, n_det: np.ndarray, att: np.ndarray, ref: np.ndarray, w0: np.ndarray,
                        n_w0: np.ndarray) -> np.ndarray:
    """``R`` from summed (or resampled-summed) prompt totals: ``W_A = det / n_det``, ``Q_A = clip(att / ref)``."""
    quality = np.clip(_ratio(att, ref), 0.0, 1.0)
    return hull_resistance(quality, _ratio(det, n_det), _ratio(w0, n_w0))


def resistance_bounds(attacks: AttackEvidence, alpha: float, counts: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``R`` pooled over the K runs and its one-sided lower and upper bounds at level ``alpha`` each, by
    resampling the attacked prompts (every run and attack of a prompt together). ``counts``:
    :func:`resample_counts` for ``n_a``. Returns ``(estimate, low, high)`` of the batch shape."""
    sums = _resistance_sums(attacks)
    estimate = _resistance_of_sums(*(s.sum(-1) for s in sums))
    samples = _resistance_of_sums(*(np.moveaxis(s @ counts, -1, 0) for s in sums))  # (B, ...)
    low, high = _tails(np.moveaxis(samples, 0, -1), alpha)
    return estimate, low, high


# -- one candidate, one cell ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Evidence:
    """Confirmation runs of one setting: K runs on the same ``n`` confirmation prompts.

    ``watermarked`` / ``baseline``: ratings ``(K, n)``; ``sizes``: ``(K,)`` each run's size in the cell's size
    kind (inf or NaN = undetected); ``attacks``: the attacked prompts, or None when no attack counts in R.
    """

    watermarked: np.ndarray
    baseline: np.ndarray
    sizes: np.ndarray
    attacks: AttackEvidence | None = None

    @property
    def k(self) -> int:
        return int(self.watermarked.shape[0])

    @property
    def n_prompts(self) -> int:
        return int(self.watermarked.shape[1])


@dataclass(frozen=True)
class Check:
    """The verdict on one try: ``status`` (confirmed / not confirmed / unresolved), ``reason`` (for not
    confirmed: ``quality``, ``R`` or ``undetected``; for unresolved: the constraints whose interval straddles),
    the estimates and one-sided bounds at ``alpha``, and the size median and MAD over the runs."""

    config_id: str
    status: str
    reason: str | None
    alpha: float
    quality: float | None
    quality_low: float | None
    quality_high: float | None
    resistance: float | None
    resistance_low: float | None
    resistance_high: float | None
    size_median: float | None
    size_mad: float | None
    k: int
    n_prompts: int
    n_attacked: int


def _num(value: np.ndarray | float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def verdict(undetected: np.ndarray, q_low: np.ndarray, q_high: np.ndarray, r_low: np.ndarray, r_high: np.ndarray,
            constraints: Constraints) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised statuses and reasons from bounds (NaN bounds: unknown, never confirming).

    Confirmed: detected, ``q_low >= 1 - loss`` and (when ``min R > 0``) ``r_low > min R``. Not confirmed:
    undetected, or ``q_high < 1 - loss`` (quality), or ``r_high <= min R`` (R). Otherwise unresolved."""
    q_min, r_min = constraints.min_relative_quality, constraints.min_tamper_resistance
    with np.errstate(invalid="ignore"):
        q_ok, q_bad = q_low >= q_min, q_high < q_min
        if r_min > 0:
            r_ok, r_bad = r_low > r_min, r_high <= r_min
        else:
            r_ok, r_bad = np.ones_like(q_ok), np.zeros_like(q_ok)
    status = np.where(undetected | q_bad | r_bad, NOT_CONFIRMED, np.where(q_ok & r_ok, CONFIRMED, UNRESOLVED))
    reason = np.where(undetected, "undetected", np.where(q_bad, "quality", np.where(r_bad, "R", np.where(
        status == UNRESOLVED, np.where(~q_ok & ~r_ok, "quality, R", np.where(~q_ok, "quality", "R")), ""))))
    return status, reason


def check(config_id: str, evidence: Evidence, constraints: Constraints, confirmation: Confirmation) -> Check:
    """Judge one try of a cell on its confirmation runs at level ``confirmation.per_try``."""
    alpha = confirmation.per_try
    if evidence.k < 2:
        raise SpecError("reevaluate.k", f"{evidence.k} confirmation run(s) of {config_id}", "an integer >= 2")
    if evidence.n_prompts < MIN_PROMPTS:
        raise SpecError("confirm.prompts", f"{evidence.n_prompts} confirmation prompt(s) of {config_id}: too few "
                        "for an interval", f"at least {MIN_PROMPTS} per run")
    q, q_low, q_high = quality_bounds(evidence.watermarked, evidence.baseline, alpha,
                                      constraints.min_relative_quality)
    r = r_low = r_high = np.float64(np.nan)
    n_attacked = 0
    if evidence.attacks is not None:
        n_attacked = evidence.attacks.n_prompts
        if constraints.min_tamper_resistance > 0 and n_attacked < MIN_PROMPTS:
            raise SpecError("attacks.fraction", f"{n_attacked} attacked confirmation prompt(s) of {config_id}: too "
                            "few for an interval of R", f"at least {MIN_PROMPTS} attacked prompts per run")
        a_counts = resample_counts(n_attacked, confirmation.resamples, confirmation.seed + 1)
        r, r_low, r_high = resistance_bounds(evidence.attacks, alpha, a_counts)
    sizes = [float(s) if math.isfinite(s) else None for s in np.asarray(evidence.sizes, dtype=float)]
    median, mad = median_mad(sizes)
    undetected = np.asarray(median is None or math.isinf(median))
    status, reason = verdict(undetected, q_low, q_high, r_low, r_high, constraints)
    return Check(config_id=config_id, status=str(status), reason=str(reason) or None, alpha=alpha,
                 quality=_num(q), quality_low=_num(q_low), quality_high=_num(q_high), resistance=_num(r),
                 resistance_low=_num(r_low), resistance_high=_num(r_high), size_median=median, size_mad=mad,
                 k=evidence.k, n_prompts=evidence.n_prompts, n_attacked=n_attacked)


@dataclass(frozen=True)
class CellOutcome:
    """A cell's result: ``status``, ``reason``, the confirmed ``pick`` (None unless confirmed), every try
    judged so far (``tries``), the candidate whose confirmation runs are needed next (``pending``, or None) and
    the tuning ranking (``candidates``, best first)."""

    status: str
    reason: str | None
    pick: str | None
    tries: tuple[Check, ...] = field(default_factory=tuple)
    pending: str | None = None
    candidates: tuple[str, ...] = field(default_factory=tuple)


def confirm_cell(candidates: Sequence[str], evidence: Mapping[str, Evidence], constraints: Constraints,
                 confirmation: Confirmation) -> CellOutcome:
    """Walk the tuning ranking: judge each of the first ``confirmation.max_tries`` candidates on its confirmation
    runs until one is confirmed. A candidate without evidence stops the walk (status ``pending``).

    After the tries: ``unresolved`` when any try was, else ``not confirmed`` with the first try's reason."""
    candidates = tuple(candidates)
    if not candidates:
        return CellOutcome(NO_FEASIBLE, None, None, candidates=candidates)
    tries: list[Check] = []
    for config_id in candidates[:confirmation.max_tries]:
        if config_id not in evidence:
            return CellOutcome(PENDING, None, None, tuple(tries), config_id, candidates)
        tried = check(config_id, evidence[config_id], constraints, confirmation)
        tries.append(tried)
        if tried.status == CONFIRMED:
            return CellOutcome(CONFIRMED, None, config_id, tuple(tries), None, candidates)
    unresolved = [t for t in tries if t.status == UNRESOLVED]
    if unresolved:
        return CellOutcome(UNRESOLVED, unresolved[0].reason, None, tuple(tries), None, candidates)
    return CellOutcome(NOT_CONFIRMED, tries[0].reason, None, tuple(tries), None, candidates)


# -- tuning: one size kind per cell, ranked candidates ----------------------------------------------------------

def valid_size_measured(runs: pl.DataFrame) -> bool:
    """Whether any of ``runs`` has a valid size: then a null one is an undetected median, not a run that predates
    the valid sizes."""
    return SIZE_VALID in runs.columns and runs[SIZE_VALID].null_count() < runs.height


def size_kind(cell: pl.DataFrame, valid_measured: bool | None = None) -> str:
    """The size a cell is ranked by: ``all.size_anytime`` when the column exists and every setting of the cell
    has a sum score and a value for it; else ``all.size_valid`` when the runs measured it — ``valid_measured``
    (whether any run of the sweep has a value; default: any setting of this cell has one) — since a run's metrics
    write an undetected median as null, a null there means "undetected" (an unknown size fails the selection rule);
    else the paper's E (``all.size``, not a valid size: kept so that runs that predate the valid sizes still
    rank)."""
    def complete(column: str) -> bool:
        return column in cell.columns and cell.height > 0 and cell[column].null_count() == 0
    sums = "scheme.score" in cell.columns and cell["scheme.score"].eq("sum").all()
    if sums and complete(SIZE_ANYTIME):
        return SIZE_ANYTIME
    if valid_measured is None:
        valid_measured = valid_size_measured(cell)
    if valid_measured and SIZE_VALID in cell.columns:
        return SIZE_VALID
    return SIZE_E


def ranked_candidates(cell: pl.DataFrame, constraints: Constraints, kind: str | None = None
                      ) -> tuple[str, list[str]]:
    """``(size kind, config ids)``: the cell's settings feasible on the tuning runs (point estimates, the rule of
    :func:`mmw.selection.select`), smallest size of that kind first. ``cell`` needs ``config_id``, ``experiment``,
    the size columns, ``all.relative_quality``, ``all.tamper_resistance``."""
    kind = kind or size_kind(cell)
    table = cell
    if kind != SIZE_E:
        table = table.drop(SIZE_E, strict=False).with_columns(pl.col(kind).alias(SIZE_E))
    for column, dtype in (("all.fpr_ci_high", pl.Float64), ("kind", pl.String), ("name", pl.String)):
        if column not in table.columns:
            default = "experiment" if column == "kind" else None
            table = table.with_columns(pl.lit(default, dtype=dtype).alias(column))
    if table["name"].null_count():
        table = table.with_columns(pl.col("config_id").alias("name"))
    return kind, select(table, constraints).feasible["config_id"].to_list()
