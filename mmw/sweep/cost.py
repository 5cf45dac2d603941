"""The sweep's cost model: what a unit of configurations costs in wall time, priced before anything runs
(the budget, the dry run) and measured after (the race against the grid).

**Units and cost.** A unit is one configuration on one prompt shard (key ``config_id x shard``); a round's units
are independent jobs. Cost is time: a fixed cost per unit (process start-ups, model loads, DVC) plus a cost per
prompt (:class:`CostModel`); a shard's baseline is paid once per temperature and shared by the configurations.
The cost model also prices units that hold several configurations of one baseline and shard (one process, one
model load: ``configs_per_unit``), which a sweep's ``pack`` setting runs (:mod:`mmw.sweep.pack`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from mmw.errors import SpecError


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


def config_counts(configs: int | Sequence[int]) -> list[int]:
    """Configurations per baseline: one count is one baseline."""
    return [configs] if isinstance(configs, int) else list(configs)


def packed_units(configs: int | Sequence[int], per_unit: int) -> int:
    """Units that ``configs`` configurations (per baseline) take, ``per_unit`` to a unit (0: one per baseline)."""
    return sum((1 if c else 0) if per_unit == 0 else math.ceil(c / per_unit) for c in config_counts(configs))


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
