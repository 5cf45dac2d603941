"""The race's bounds: per configuration and round, one-sided bounds on relative quality, the median size and R,
from the tuning rows of its shards.

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

Array shapes: leading batch dimensions ``...`` (simulated sweeps), ``C`` configurations of a group, ``X`` cells
(constraints), ``n`` prompts, ``m`` attacks counted in R, ``n_a`` attacked prompts. Missing values are NaN.

"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats

from mmw.sweep.confirm import AttackEvidence, hull_resistance


#: One-sided level of a one-standard-error bound (the screen's bounds: estimate -/+ 1 SE).
ONE_SIGMA = float(stats.norm.sf(1.0))


def ratio_bounds(num: np.ndarray, den: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    quality, q_low, q_high = ratio_bounds(tuning.watermarked, tuning.baseline, alpha)
    size, s_low, s_high = median_bounds(tuning.sizes, alpha)
    attacked = tuning.attacked
    w_a, w_a_low, w_a_high = _proportion_bounds(attacked.detected, alpha)
    reference = np.broadcast_to(attacked.rating_reference[..., None, :], attacked.rating_attacked.shape)
    q_a, q_a_low, q_a_high = ratio_bounds(attacked.rating_attacked, reference, alpha)
    w_0, w_0_low, w_0_high = _proportion_bounds(attacked.no_attack, alpha)

    def hull(q: np.ndarray, w: np.ndarray, w0: np.ndarray) -> np.ndarray:
        return hull_resistance(np.clip(q, 0.0, 1.0), np.clip(w, 0.0, 1.0), np.clip(w0, 0.0, 1.0))

    r = hull(q_a, w_a, w_0)
    r_low = np.nan_to_num(hull(q_a_high, w_a_low, w_0_low), nan=0.0)
    r_high = np.nan_to_num(hull(q_a_low, w_a_high, w_0_high), nan=1.0)
    prompts = np.broadcast_to((~np.isnan(tuning.watermarked)).sum(-1), quality.shape)
    return Bounds(quality, q_low, q_high, r, r_low, r_high, size, s_low, s_high, prompts)


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
