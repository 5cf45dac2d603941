"""Power planner: how many prompts an unresolved cell needs, and what that costs.

A one-sided bound's distance from its estimate shrinks about as ``1 / sqrt(n)`` (the bootstrap bound of R; the
betting bound of quality, :mod:`mmw.betting`, as ``a / n + b / sqrt(n)`` down to a small offset of its fixed bets,
``c var / (2 m)``, which lies below the floor of any confirmation the tasks' prompts allow). A cell whose interval at
``n`` prompts (half-width ``h = estimate - lower bound``) straddles its constraint ``c`` resolves — the bound
clears ``c`` on the side of the estimate — once ``h * sqrt(n / n') < |estimate - c|``, i.e. at

    n' = n * (h / |estimate - c|)^2

prompts (quality: all confirmation prompts; R: the attacked ones, scaled back to prompts by the attacked share).
This is a plan from the measured per-prompt variance, not a promise: the estimate itself moves with more prompts,
and a true value at the constraint never resolves (``n' = inf``).

A sweep collected without confirmation (its picks re-run K times on their own tuning prompts, as the committed
``small`` sweep) is planned as a pilot (:func:`pilot_table`): each picked cell's estimate is the mean of its K
re-runs' run-level relative quality and R, its one-sided bound a normal one (``z`` at the per-try level) from the
spread of those re-runs: for quality the SD pooled over every pick (the judge's noise does not depend on the
config), for R the cell's own (it shrinks towards 0 and 1). Those re-runs repeat the same few prompts, so their
spread holds generation and judge noise but not prompt-to-prompt differences: the pilot's prompt counts are lower
bounds. No plan goes below the smallest confirmation set the definition accepts (five prompts and five attacked
ones).

**Runs per prompt.** A prompt's paired difference ``w - q b`` averaged over K runs has variance
``s_p + s_g / K``: prompt-level ``s_p`` and generation run-to-run ``s_g`` (the judge in expected mode is
deterministic and adds nothing). On the committed confirmation rows generation is ~98 % of it at K = 5
(:data:`GENERATION_SHARE`), so more runs per prompt shrink the needed prompts almost in proportion, and a plan
may trade prompts for runs. Each cell is planned at the K in :data:`RUN_CHOICES` whose confirmation costs least
on the GPU cost model (:data:`mmw.sweep.cost.GPU_STAGED`: K runs, each a configuration and a fresh seed's baseline
at that many prompts, fixed costs included) among those whose prompts fit the tasks' pools; the plan says which K
(``k``). R's need is not scaled with K (its bootstrap spread is not measured per run): conservative.

**The floor.** Whatever the noise, no valid test confirms with fewer than
``log(1/alpha) / log(1 + d / (q H))`` prompts for a margin of ``d`` rating points above ``q`` times the
baseline (``H = 100``; at ``q = 0.99`` this is ``log(1/alpha) / -log(1 - d / (d + 99))``; :func:`mmw.betting.floor`
proves it and gives the shipped test's own best case, a few per cent higher). The plan takes the margin at the
measured estimate with a baseline rating of 100 (``d = (estimate - q) 100``), the most favourable case, so the
floor it states (``floor_prompts``) is one no confirmation can go below. A cell whose floor or whose needed
prompts exceed what the tasks hold past the confirmation offset (in the extended pool, ``prompts.pool: extended``,
which a confirmation round past the paper's prompts takes) is answered ``cannot be resolved with the prompts the
tasks hold`` (``resolvable`` false) instead of being planned.

Cost: the K confirmation runs at ``n'`` prompts, from the sweep's measured run times (a line through the tuning
and confirmation runs' median wall times against their prompt counts: fixed per-run cost plus per-prompt cost),
and on the GPU from the measured full-scale cost model of bench/RESULTS.md (one H100, 8B-shaped models,
296 prompts x 1,024 tokens: 302.5 s a config + 191 s a fresh seed's baseline), scaled linearly in prompts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl
from scipy.stats import norm

from mmw.betting import floor
from mmw.errors import SpecError
from mmw.sweep.cells import RANDOMNESS_CONSTRAINT
from mmw.sweep.confirm import CANNOT, RATING_MAX, Confirmation
from mmw.sweep.cost import GPU_STAGED, CostModel
from mmw.sweep.definition import min_confirm_prompts

#: Full-scale cost model, one H100 (bench/RESULTS.md "Cost model for the paper's grid, measured end to end").
GPU_CONFIG_S, GPU_BASELINE_S, GPU_PROMPTS = 302.5, 191.0, 296
#: Share of a prompt's variance of ``w - q b`` (K = :data:`GENERATION_K` runs averaged) that is generation
#: run-to-run noise; the rest is prompt-level (measured on the committed confirmation rows, ../shared/DESIGN.md
#: section 6: ~98 %, prompt-level near 0).
GENERATION_SHARE, GENERATION_K = 0.98, 5
#: Runs per prompt a plan may choose (two at least: an interval over runs needs two).
RUN_CHOICES = tuple(range(2, 21))


def relative_variance(k: int, k_now: int) -> float:
    """Variance of a prompt's mean ``w - q b`` over ``k`` runs relative to ``k_now`` runs (the module docstring)."""
    def variance(runs: int) -> float:
        return (1 - GENERATION_SHARE) + GENERATION_SHARE * GENERATION_K / runs
    return variance(k) / variance(k_now)


def quality_floor(estimate: float | None, limit: float, alpha: float) -> float | None:
    """Fewest prompts any valid test needs to resolve a pooled ratio ``estimate`` against ``limit`` at level
    ``alpha`` (either way), at the most favourable baseline rating (100): ``log(1/alpha) / log(1 + d / s)`` with
    the margin ``d = |estimate - limit| 100`` rating points and ``s`` the largest loss of one prompt (``limit 100``
    to confirm, ``100`` to show it short); inf on the limit, None unknown."""
    if estimate is None or not math.isfinite(estimate):
        return None
    margin = abs(estimate - limit) * RATING_MAX
    scale = limit * RATING_MAX if estimate >= limit else RATING_MAX
    return float(floor(margin, scale, alpha)[0]) if margin > 0 else math.inf


def task_pools(tasks: Sequence[str]) -> dict[str, int]:
    """Prompts each task holds for a confirmation: in the extended pool, which held-out rounds past the tuning runs'
    pool take (:func:`mmw.sweep.units.held_out`; tasks built from the pipeline's own outputs are left out: their
    count is known only after a run)."""
    from mmw.tasks import EXTENDED_POOL, pool_sizes

    return pool_sizes(tasks, EXTENDED_POOL)


def check_request(per_task: int, offset: int, pools: Mapping[str, int], floor_prompts: float | None = None,
                  pool: str = "extended") -> None:
    """Refuse a confirmation of ``per_task`` prompts per task from ``offset`` that a task cannot hold (``pools``:
    its prompts in ``pool``), or whose prompts in all lie below ``floor_prompts`` (:func:`quality_floor`).

    Raises:
        SpecError: naming the task, its count and the pool, or the floor.
    """
    for task, size in pools.items():
        if offset + per_task > size:
            raise SpecError("--prompts", f"{per_task} per task from prompt {offset}: task {task} holds {size} prompts "
                            f"in the {pool} pool", f"at most {max(size - offset, 0)} per task")
    tasks = max(len(pools), 1)
    total = per_task * tasks
    if floor_prompts is not None and total < floor_prompts:
        needed = math.ceil(floor_prompts / tasks) if math.isfinite(floor_prompts) else math.inf
        most = min((size - offset for size in pools.values()), default=math.inf)
        allowed = f"at least {needed} per task" if needed <= most else \
            f"none: that margin {CANNOT} (at most {most} per task past prompt {offset})"
        raise SpecError("--prompts", f"{total} confirmation prompts are below the distribution-free floor of "
                        f"{floor_prompts:,.0f} prompts for that margin: no valid test confirms with fewer", allowed)


def check_confirmation(definition: Any, repo: Any, per_task: int, margin: float | None, alpha: float) -> None:
    """Refuse a confirmation of ``per_task`` prompts per task for the sweep ``definition`` (:class:`Sweep`) in
    ``repo`` (:func:`check_request`): past the confirmation offset (a pilot's: after its tuning prompts) every task
    must hold them, and with a ``margin`` in rating points their count must reach the floor at the strictest
    quality limit the sweep confirms (a pilot: the paper's 1 %), at the per-try level ``alpha``."""
    from mmw.board import load_board

    tasks = definition.configs[0].overrides.get("prompts.tasks") if definition.configs else None
    if tasks is None:
        tasks = load_board(repo / "params.yaml").prompts.tasks
    confirmation = definition.confirmation
    if confirmation is not None and confirmation.offset is not None:
        offset, losses = confirmation.offset, confirmation.quality_losses
    else:
        offset, losses = definition.tuning_offset + (definition.tuning or 0), [0.01]
    limit = 1 - min(losses)
    cell_floor = None if margin is None else quality_floor(limit + margin / RATING_MAX, limit, alpha)
    check_request(per_task, offset, task_pools(list(tasks)), cell_floor)


def confirmation_cost(k: int, prompts: float, model: CostModel = GPU_STAGED) -> float:
    """GPU seconds of ``k`` confirmation runs at ``prompts`` prompts: each a configuration and a fresh seed's
    baseline."""
    return k * float(model.unit(prompts) + model.baseline(prompts))


def needed_prompts(estimate: float | None, low: float | None, threshold: float, n: int) -> float | None:
    """Prompts for the one-sided bound to clear ``threshold`` (see the module docstring); None when unknown,
    ``n`` when it already does, inf when the estimate sits on the threshold."""
    if estimate is None or low is None or n <= 0:
        return None
    half = estimate - low
    gap = abs(estimate - threshold)
    if gap == 0:
        return math.inf
    return float(max(n, math.ceil(round(n * (half / gap) ** 2, 9))))


def run_time_model(results: pl.DataFrame, reevaluation_walls: list[tuple[int, float]], tuning_prompts: int
                   ) -> tuple[float, float] | None:
    """``(fixed s, s per prompt)`` of one run on this machine: a line through (prompts, wall) of the tuning runs
    (``results.wall_s`` at ``tuning_prompts``) and the confirmation runs (``(prompts, wall_s)`` pairs). With one
    prompt count only, all time is charged per prompt (an upper bound). None without any timing."""
    points = [(tuning_prompts, w) for w in results["wall_s"].drop_nulls().to_list()] if "wall_s" in results.columns \
        else []
    points += reevaluation_walls
    if not points:
        return None
    counts = sorted({p for p, _ in points})
    medians = [float(np.median([w for p, w in points if p == c])) for c in counts]
    if len(counts) < 2:
        return 0.0, medians[0] / counts[0]
    slope, intercept = np.polyfit(counts, medians, 1)
    return max(float(intercept), 0.0), max(float(slope), 0.0)


#: The status :func:`pilot_table` gives every cell it plans.
PILOT = "pilot"


def attack_fraction(results: pl.DataFrame, default: float = 1 / 3) -> float:
    """The share of each task's prompts a sweep's runs attack (``attacks.fraction``); ``default`` when the runs
    do not record it."""
    if "attacks.fraction" not in results.columns:
        return default
    return float(results["attacks.fraction"].drop_nulls().median() or 0.0)


def pilot_table(table: pl.DataFrame, results: pl.DataFrame, reevaluations: pl.DataFrame, level: float,
                max_tries: int) -> pl.DataFrame:
    """The columns :func:`plan_table` reads, for a sweep collected without confirmation: one row (status
    :data:`PILOT`) per cell of the old paper table (``config_id`` of the pick) whose pick has at least two
    finished re-runs. ``quality`` / ``resistance``: the mean of the re-runs' ``all.relative_quality`` /
    ``all.tamper_resistance``; ``*_low``: that mean minus ``z * SD / sqrt(K)`` with ``z`` the normal quantile at
    ``level / max_tries``; ``n_prompts`` / ``n_attacked``: the prompts and attacked prompts of one run."""
    z = float(norm.ppf(1 - level / max_tries))
    done = reevaluations.filter(pl.col("status") == "done") if reevaluations.height else reevaluations
    fraction = attack_fraction(results)
    per_task = int(results["prompts.per_task"].drop_nulls().median() or 1) if "prompts.per_task" in results.columns \
        else 1
    prompts = int(results["all.relative_quality_n"].drop_nulls().median() or 0) \
        if "all.relative_quality_n" in results.columns else 0
    tasks = max(1, round(prompts / per_task)) if prompts else 3
    attacked = math.ceil(fraction * per_task - 1e-9) * tasks

    def values(config_id: str, metric: str) -> list[float]:
        runs = done.filter(pl.col("config_id") == config_id) if done.height else done
        return [v for v in runs[metric].to_list() if v is not None and math.isfinite(v)] if runs.height else []

    def mean_low(found: list[float], sd: float | None = None) -> tuple[float | None, float | None]:
        if len(found) < 2:
            return None, None
        mean = float(np.mean(found))
        return mean, mean - z * (float(np.std(found, ddof=1)) if sd is None else sd) / math.sqrt(len(found))

    picked = table["config_id"].drop_nulls().unique().to_list() if "config_id" in table.columns else []
    groups = [v for v in (values(c, "all.relative_quality") for c in picked) if len(v) >= 2]
    pooled = math.sqrt(sum(float(np.var(v, ddof=1)) * (len(v) - 1) for v in groups)
                       / sum(len(v) - 1 for v in groups)) if groups else None
    rows = []
    for row in table.filter(pl.col("config_id").is_not_null()).iter_rows(named=True):
        quality = values(row["config_id"], "all.relative_quality")
        q, q_low = mean_low(quality, pooled)
        r, r_low = mean_low(values(row["config_id"], "all.tamper_resistance"))
        if q is None:
            continue
        rows.append({"temperature": row["temperature"], "family": row["family"],
                     "max_quality_loss": row["max_quality_loss"], "min_tamper_resistance": row["min_tamper_resistance"],
                     "config_id": row["config_id"], "status": PILOT, "reason": None, "quality": q,
                     "quality_low": q_low, "resistance": r, "resistance_low": r_low, "k": len(quality),
                     "n_prompts": prompts or per_task * tasks, "n_attacked": attacked})
    schema = {"temperature": pl.Float64, "family": pl.String, "max_quality_loss": pl.Float64,
              "min_tamper_resistance": pl.Float64, "config_id": pl.String, "status": pl.String,
              "reason": pl.String, "quality": pl.Float64, "quality_low": pl.Float64, "resistance": pl.Float64,
              "resistance_low": pl.Float64, "k": pl.Int64, "n_prompts": pl.Int64, "n_attacked": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def _toward(estimate: float | None, threshold: float) -> str | None:
    """Which way a cell resolves once its bound clears the threshold: ``pass`` (the estimate meets it) or
    ``fail``."""
    if estimate is None:
        return None
    return "pass" if estimate >= threshold else "fail"


def plan_table(table: pl.DataFrame, k: int, tasks: int, attacked_share: float,
               time_model: tuple[float, float] | None, min_per_task: int = 1, alpha: float | None = None,
               available: int | None = None) -> pl.DataFrame:
    """One row per cell that is not resolved (status unresolved, or :data:`PILOT`): the prompts needed for
    quality and for R at the runs per prompt it chose, per task, which way each is heading (``quality_toward`` /
    ``r_toward``: pass | fail), the chosen runs per prompt (``k``), the distribution-free floor of prompts
    (``floor_prompts``), whether the tasks' prompts can resolve it (``resolvable``; ``note`` says why not) and
    the cost of the K confirmation runs at that scale (CPU seconds on this machine's measured runs, H100 hours
    from the cost model).

    ``table``: the confirmed table (:func:`mmw.sweep.cells.confirmed_table`) or :func:`pilot_table`; ``k``: the
    runs its bounds were measured on; ``tasks``: prompt tasks; ``attacked_share``: attacked / confirmation
    prompts; ``min_per_task``: the smallest confirmation set per task (no plan goes below it); ``alpha``: the
    per-try level (default: the table's ``alpha`` column, else 0.025); ``available``: prompts per task past the
    confirmation offset in the smallest task (None: unlimited)."""
    rows: list[dict[str, Any]] = []
    for row in table.filter(pl.col("status").is_in(["unresolved", PILOT])).iter_rows(named=True):
        n, n_a = row["n_prompts"] or 0, row["n_attacked"] or 0
        k_now = int(row.get("k") or k)
        limit = 1 - row["max_quality_loss"]
        level = alpha if alpha is not None else (row.get("alpha") or 0.025)
        q_need = needed_prompts(row["quality"], row["quality_low"], limit, n)
        cell_floor = quality_floor(row["quality"], limit, level)
        r_need = None
        if row["min_tamper_resistance"]:
            attacked = needed_prompts(row["resistance"], row["resistance_low"], row["min_tamper_resistance"], n_a)
            r_need = None if attacked is None else attacked / max(attacked_share, 1e-9)
        best: tuple[float, int, float | None, int] | None = None  # (cost, K, quality prompts, per task)
        for runs in RUN_CHOICES:
            q_at = None if q_need is None else (q_need if math.isinf(q_need) else
                                                max(q_need * relative_variance(runs, k_now), 1.0))
            needs = [v for v in (q_at, r_need, cell_floor) if v is not None]
            if not needs or any(math.isinf(v) for v in needs):
                continue
            per_task = max(math.ceil(round(max(needs) / max(tasks, 1), 9)), min_per_task)
            if available is not None and per_task > available:
                continue
            cost = confirmation_cost(runs, per_task * tasks)
            if best is None or cost < best[0]:
                best = (cost, runs, q_at, per_task)
        known = q_need is not None or r_need is not None
        resolvable = best is not None
        chosen_k, q_plan, per_task = (best[1], best[2], best[3]) if best else (None, q_need, None)
        cpu = gpu = None
        if per_task is not None and chosen_k is not None:
            prompts = per_task * tasks
            if time_model is not None:
                cpu = chosen_k * (time_model[0] + time_model[1] * prompts)
            gpu = chosen_k * (GPU_CONFIG_S + GPU_BASELINE_S) * prompts / GPU_PROMPTS / 3600
        rows.append({"temperature": row["temperature"], "family": row["family"],
                     "max_quality_loss": row["max_quality_loss"],
                     "min_tamper_resistance": row["min_tamper_resistance"], "config_id": row["config_id"],
                     "reason": row["reason"], "n_prompts": n, "quality": row["quality"],
                     "quality_toward": _toward(row["quality"], limit),
                     "resistance": row["resistance"] if row["min_tamper_resistance"] else None,
                     "r_toward": _toward(row["resistance"], row["min_tamper_resistance"])
                     if row["min_tamper_resistance"] else None,
                     "quality_prompts": q_plan, "r_prompts": r_need, "floor_prompts": cell_floor, "k": chosen_k,
                     "resolvable": resolvable if known else None, "note": None if resolvable or not known else CANNOT,
                     "prompts_per_task": per_task, "cpu_s": cpu, "h100_hours": gpu})
    schema = {"temperature": pl.Float64, "family": pl.String, "max_quality_loss": pl.Float64,
              "min_tamper_resistance": pl.Float64, "config_id": pl.String, "reason": pl.String,
              "n_prompts": pl.Int64, "quality": pl.Float64, "quality_toward": pl.String, "resistance": pl.Float64,
              "r_toward": pl.String, "quality_prompts": pl.Float64, "r_prompts": pl.Float64,
              "floor_prompts": pl.Float64, "k": pl.Int64, "resolvable": pl.Boolean, "note": pl.String,
              "prompts_per_task": pl.Int64, "cpu_s": pl.Float64, "h100_hours": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def run_tasks(results: pl.DataFrame) -> list[str]:
    """The prompt tasks of a sweep's runs (``prompts.tasks``, written as a list), empty when not recorded."""
    if "prompts.tasks" not in results.columns or not results["prompts.tasks"].drop_nulls().len():
        return []
    written = str(results["prompts.tasks"].drop_nulls()[0]).strip("[]")
    return [t.strip().strip("'\"") for t in written.split(",") if t.strip()]


def available_prompts(results: pl.DataFrame, offset: int) -> int | None:
    """Prompts per task past ``offset`` in the smallest of the runs' tasks (None: unknown)."""
    pools = task_pools(run_tasks(results))
    return max(min(pools.values()) - offset, 0) if pools else None


def randomness_cells(randomness: pl.DataFrame) -> pl.DataFrame:
    """The confirmed text-dependent vs fixed randomness table (:func:`mmw.sweep.cells.confirmed_randomness`) as
    cells of the paper's table: ``family`` = ``randomness: <kind>``, its constraint (quality loss <= 10 %, no R)."""
    (loss, r_min), = RANDOMNESS_CONSTRAINT
    return randomness.with_columns(
        pl.format("randomness: {}", "randomness_kind").alias("family"), pl.lit(loss).alias("max_quality_loss"),
        pl.lit(r_min).alias("min_tamper_resistance"), pl.lit(0, dtype=pl.Int64).alias("n_attacked"),
        pl.lit(None, dtype=pl.Float64).alias("resistance"), pl.lit(None, dtype=pl.Float64).alias("resistance_low"))


def sweep_plan(table: pl.DataFrame, results: pl.DataFrame, reevaluations: pl.DataFrame, confirmation: Confirmation,
               tuning: int, k: int, randomness: pl.DataFrame | None = None) -> pl.DataFrame:
    """:func:`plan_table` for a collected sweep, over every unresolved cell of the paper's table and (when given)
    of the confirmed randomness table: tasks and the attacked share from the confirmed cells, the run time model
    from the tuning runs (``tuning`` prompts per task) and the confirmation runs (``confirmation.prompts`` per
    task, their ``wall_s``); no plan below the smallest confirmation set the definition accepts."""
    if randomness is not None and randomness.height and table.height:
        cells = randomness_cells(randomness)
        table = pl.concat([table, cells.select([c for c in table.columns if c in cells.columns])],
                          how="diagonal_relaxed")
    measured = table.filter(pl.col("n_prompts").is_not_null() & (pl.col("n_prompts") > 0))
    # The runs' own task list; else the smallest judged cell (a cell a later round judged holds more prompts than
    # rounds 1-2's ``confirmation.prompts`` per task, so any other cell would count too many tasks).
    tasks = len(run_tasks(results)) or (
        max(1, round(int(measured["n_prompts"].min()) / confirmation.prompts)) if measured.height else 1)
    share = float((measured["n_attacked"] / measured["n_prompts"]).median()) if measured.height else 1 / 3
    walls = []
    if "wall_s" in reevaluations.columns:
        temperature = dict(zip(results["config_id"], results["model.temperature"], strict=True)) \
            if "model.temperature" in results.columns else {}
        for row in reevaluations.filter(pl.col("wall_s").is_not_null()).iter_rows(named=True):
            later = confirmation.round_of_seed(row.get("seed"))
            per_task = confirmation.prompts if later is None else later.per_task(temperature.get(row["config_id"]))
            if per_task is not None:
                walls.append((per_task * tasks, float(row["wall_s"])))
    model = run_time_model(results, walls, tuning * tasks)
    plan = plan_table(table, k, tasks, share, model, min_confirm_prompts(attack_fraction(results, share), tasks) or 1,
                      confirmation.per_try, available_prompts(results, next_offset(confirmation)))
    return with_declared_rounds(plan, table, confirmation, tasks, model)


def with_declared_rounds(plan: pl.DataFrame, table: pl.DataFrame, confirmation: Confirmation, tasks: int,
                         model: tuple[float, float] | None) -> pl.DataFrame:
    """The plan with each cell that a later round (``confirm.extend``) declares but has not judged yet shown as
    that round's: its runs per prompt, prompts per task, their cost on this machine, and a note naming the round
    (its runs are what resolves the cell next, not a new plan)."""
    if not confirmation.extend or plan.height == 0:
        return plan
    judged = {}
    if "round" in table.columns:
        judged = {(r["temperature"], r["family"], r["max_quality_loss"], r["min_tamper_resistance"]): r["round"]
                  for r in table.iter_rows(named=True)}
    judged_k = {(r["temperature"], r["family"], r["max_quality_loss"], r["min_tamper_resistance"]): r.get("k")
                for r in table.iter_rows(named=True)}
    rows = plan.to_dicts()
    for row in rows:
        key = (row["temperature"], row["family"], row["max_quality_loss"], row["min_tamper_resistance"])
        for extension in confirmation.extend:
            cell = extension.cell(row["temperature"], row["family"], row["min_tamper_resistance"])
            if cell is None or judged.get(key) == extension.name:
                continue
            prompts = cell.prompts * tasks
            if row["quality_prompts"] is not None and math.isfinite(row["quality_prompts"]):
                # The need at the round's K: from the plan's K back to the measured one (none fitted: the need is
                # already at the measured K), then to the round's.
                k_now = judged_k.get(key) or GENERATION_K
                at_measured = row["quality_prompts"] / (1.0 if row["k"] is None else relative_variance(row["k"], k_now))
                row["quality_prompts"] = max(at_measured * relative_variance(cell.k, k_now), 1.0)
            row.update(k=cell.k, prompts_per_task=cell.prompts, resolvable=None,
                       note=f"{extension.name}: {cell.prompts} per task, K = {cell.k} (its runs pending)",
                       cpu_s=None if model is None else cell.k * (model[0] + model[1] * prompts),
                       h100_hours=cell.k * (GPU_CONFIG_S + GPU_BASELINE_S) * prompts / GPU_PROMPTS / 3600)
            break
    return pl.DataFrame(rows, schema=plan.schema)


def next_offset(confirmation: Confirmation) -> int:
    """The first held-out prompt per task that no confirmation round has used: a next round's fresh prompts start
    there."""
    ends = [(confirmation.offset or 0) + confirmation.prompts]
    ends += [e.offset + max(c.prompts for c in e.cells) for e in confirmation.extend]
    return max(ends)


def pilot_plan(table: pl.DataFrame, results: pl.DataFrame, reevaluations: pl.DataFrame, level: float,
               max_tries: int, k: int) -> pl.DataFrame:
    """:func:`plan_table` for a sweep collected without confirmation (:func:`pilot_table`): every picked cell,
    the run time model from its runs (all at one prompt count: charged per prompt, an upper bound)."""
    pilot = pilot_table(table, results, reevaluations, level, max_tries)
    prompts = int(pilot["n_prompts"][0]) if pilot.height else 1
    per_task = int(results["prompts.per_task"].drop_nulls().median() or 1) if "prompts.per_task" in results.columns \
        else 1
    tasks = max(1, round(prompts / per_task))
    share = float(pilot["n_attacked"][0]) / prompts if pilot.height else 1 / 3
    walls = []
    if "wall_s" in reevaluations.columns:
        walls = [(prompts, float(w)) for w in reevaluations["wall_s"].drop_nulls().to_list()]
    offset = int(results["prompts.offset"].drop_nulls().max() or 0) if "prompts.offset" in results.columns else 0
    return plan_table(pilot, k, tasks, share, run_time_model(results, walls, prompts),
                      min_confirm_prompts(attack_fraction(results), tasks) or 1, level / max_tries,
                      available_prompts(results, offset + per_task))
