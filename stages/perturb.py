"""Stage ``perturb``: every attack of params ``attacks.specs`` on the first ``attacks.fraction`` of each task."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import polars as pl

from mmw.attacks import Attack, build_attacks
from mmw.io import GENERATIONS, PERTURBED, PERTURBED_SCHEMA, PartsStore, plan_units, read_table, write_table
from mmw.io import row_key as store_row_key
from mmw.params import load_params
from mmw.seeds import derive_seed
from mmw.stages.timing import timed


def attacked_subset(generations: pl.DataFrame, fraction: float) -> pl.DataFrame:
    """The first ``ceil(fraction * n)`` rows of each task, in table (= prompt) order.

    Rounding up keeps at least one attacked text per task for any ``fraction > 0`` (the paper attacks the first
    third of each task).
    """
    position = pl.int_range(pl.len()).over("task")
    size = (pl.len().over("task") * fraction).ceil()
    return generations.filter(position < size) if fraction > 0 else generations.clear()


#: Texts per stored part: an interrupted run loses at most this many attacked texts per attack.
CHUNK = 8


def parts_dir() -> Path:
    """Finished chunks of an unfinished run (``data/perturbed.parquet.parts/``), removed once the table is written."""
    return PERTURBED.with_name(PERTURBED.name + ".parts")


def attack_fingerprint(attack: Attack, seed: int) -> str:
    """Everything an attacked text depends on besides its input: the attack (name, family, every parameter) and the
    pipeline seed. Stored rows are reused only under the same fingerprint, so a resumed run never mixes params."""
    return "\x00".join([attack.name, attack.family, repr(sorted(attack.params.items())), str(seed)])


def row_key(fingerprint: str, prompt_id: str, text: str) -> str:
    """Identity of one attacked text: the attack fingerprint, the prompt and the exact input text."""
    return store_row_key(fingerprint, prompt_id, text)


def run(params_path: Path, on_chunk_done: Callable[[int], None] | None = None) -> None:
    """Write ``data/perturbed.parquet``: one row per (attacked prompt, attack); ``text`` null when ``ok`` is false.

    Each text's attack seed hashes (seed, prompt_id, attack name), so results do not depend on batching, on
    which other attacks run, or on the process. Resumable like generation (``mmw.io.PartsStore``): per attack,
    the texts are cut into chunks of ``CHUNK`` planned over every text, and each finished chunk is stored
    (atomically) under ``parts_dir()``; a rerun reuses exactly the chunks whose attack, parameters, seed, prompts
    and input texts match, and attacks only the rest. ``on_chunk_done(rows_stored)`` runs after each stored chunk
    (tests use it to interrupt a run).
    """
    with timed("perturb") as info:
        params = load_params(params_path, ("seed", "attacks"))
        attacks = build_attacks(params.attacks.specs)  # validates only: models load on first use
        generations = read_table(GENERATIONS["watermarked"], columns=("prompt_id", "task", "text"))
        subset = attacked_subset(generations, params.attacks.fraction)
        texts, prompt_ids, tasks = subset["text"].to_list(), subset["prompt_id"].to_list(), subset["task"].to_list()
        store = PartsStore(parts_dir(), PERTURBED_SCHEMA, "chunks")
        frames, seconds, reused, stored_rows = [], {}, 0, 0
        for attack in attacks:
            started = time.perf_counter()
            fingerprint = attack_fingerprint(attack, params.seed)
            keys = [row_key(fingerprint, pid, text) for pid, text in zip(prompt_ids, texts, strict=True)]

            def attack_chunk(rows: list[int], attack: Attack = attack) -> pl.DataFrame:
                seeds = [derive_seed(params.seed, "attack", prompt_ids[i], attack.name) for i in rows]
                outcomes = attack.apply_batch([texts[i] for i in rows], seeds)
                return pl.DataFrame({
                    "prompt_id": [prompt_ids[i] for i in rows], "task": [tasks[i] for i in rows],
                    "attack": [attack.name] * len(rows), "family": [attack.family] * len(rows),
                    "in_R": [attack.in_R] * len(rows), "text": [o.text if o.ok else None for o in outcomes],
                    "ok": [o.ok for o in outcomes], "error": [o.error for o in outcomes],
                }, schema=PERTURBED_SCHEMA)

            def chunk_done(rows_in_attack: int, before: int = stored_rows) -> None:
                if on_chunk_done is not None:
                    on_chunk_done(before + rows_in_attack)

            rows = store.run(keys, plan_units(range(len(keys)), CHUNK), attack_chunk, chunk_done)
            reused += store.reused_rows
            stored_rows += store.computed_rows
            seconds[attack.name] = round(time.perf_counter() - started, 3)
            frames.append(rows.select(list(PERTURBED_SCHEMA)))
        table = pl.concat(frames) if frames else pl.DataFrame(schema=PERTURBED_SCHEMA)
        write_table(table, PERTURBED)
        store.clear()
        info.update(rows=table.height, failed=int((~table["ok"]).sum()), attack_seconds=seconds, resumed_rows=reused,
                    attacked_per_task=subset.group_by("task").len().sort("task").rows())
