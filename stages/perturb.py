"""Stage ``perturb``: every attack of params ``attacks.specs`` on the first ``attacks.fraction`` of each task."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl

from mmw.attacks import build_attack
from mmw.io import GENERATIONS, PERTURBED, read_table, write_table
from mmw.params import derive_seed, load_params
from mmw.stages.common import timed

PERTURBED_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "attack": pl.String, "family": pl.String,
                    "in_R": pl.Boolean, "text": pl.String, "ok": pl.Boolean, "error": pl.String}


def attacked_subset(generations: pl.DataFrame, fraction: float) -> pl.DataFrame:
    """The first ``ceil(fraction * n)`` rows of each task, in table (= prompt) order.

    Rounding up keeps at least one attacked text per task for any ``fraction > 0`` (the paper attacks the first
    third of each task).
    """
    position = pl.int_range(pl.len()).over("task")
    size = (pl.len().over("task") * fraction).ceil()
    return generations.filter(position < size) if fraction > 0 else generations.clear()


def run(params_path: Path) -> None:
    """Write ``data/perturbed.parquet``: one row per (attacked prompt, attack); ``text`` null when ``ok`` is false.

    Each text's attack seed hashes (seed, prompt_id, attack name), so results do not depend on batching, on
    which other attacks run, or on the process.
    """
    with timed("perturb") as info:
        params = load_params(params_path)
        attacks = [build_attack(spec, f"attacks.specs[{i}]") for i, spec in enumerate(params.attacks.specs)]
        subset = attacked_subset(read_table(GENERATIONS["watermarked"]), params.attacks.fraction)
        texts = subset["text"].to_list()
        frames, seconds = [], {}
        for attack in attacks:
            started = time.perf_counter()
            seeds = [derive_seed(params.seed, "attack", prompt_id, attack.name) for prompt_id in subset["prompt_id"]]
            outcomes = attack.apply_batch(texts, seeds)
            seconds[attack.name] = round(time.perf_counter() - started, 3)
            frames.append(pl.DataFrame({
                "prompt_id": subset["prompt_id"],
                "task": subset["task"],
                "attack": [attack.name] * len(outcomes),
                "family": [attack.family] * len(outcomes),
                "in_R": [attack.in_R] * len(outcomes),
                "text": [o.text if o.ok else None for o in outcomes],
                "ok": [o.ok for o in outcomes],
                "error": [o.error for o in outcomes],
            }, schema=PERTURBED_SCHEMA))
        table = pl.concat(frames) if frames else pl.DataFrame(schema=PERTURBED_SCHEMA)
        write_table(table, PERTURBED)
        info.update(rows=table.height, failed=int((~table["ok"]).sum()), attack_seconds=seconds,
                    attacked_per_task=subset.group_by("task").len().sort("task").rows())
