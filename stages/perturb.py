"""Stage ``perturb``: every attack of params ``attacks.specs`` on the first ``attacks.fraction`` of each task."""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl

from mmw.attacks import Attack, build_attacks
from mmw.io import GENERATIONS, PERTURBED, read_table, write_table
from mmw.params import derive_seed, load_params
from mmw.stages.timing import timed

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
    return hashlib.sha256("\x00".join([fingerprint, prompt_id, text]).encode()).hexdigest()


def _stored(parts: Path) -> pl.DataFrame:
    """Rows of every finished chunk (empty when there are none)."""
    files = sorted(parts.glob("*.parquet")) if parts.exists() else []
    return pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame(
        schema={**PERTURBED_SCHEMA, "row_key": pl.String})


def run(params_path: Path, on_chunk_done: Callable[[int], None] | None = None) -> None:
    """Write ``data/perturbed.parquet``: one row per (attacked prompt, attack); ``text`` null when ``ok`` is false.

    Each text's attack seed hashes (seed, prompt_id, attack name), so results do not depend on batching, on
    which other attacks run, or on the process. Resumable like generation: every finished chunk of ``CHUNK`` texts
    is stored (atomically) under ``parts_dir()`` keyed by ``row_key``; a rerun reuses exactly the rows whose attack,
    parameters, seed, prompt and input text match, and attacks only the rest. ``on_chunk_done(rows_stored)`` runs
    after each stored chunk (tests use it to interrupt a run).
    """
    with timed("perturb") as info:
        params = load_params(params_path, ("seed", "attacks"))
        attacks = build_attacks(params.attacks.specs)
        subset = attacked_subset(read_table(GENERATIONS["watermarked"]), params.attacks.fraction)
        texts, prompt_ids = subset["text"].to_list(), subset["prompt_id"].to_list()
        parts = parts_dir()
        stored = _stored(parts)
        stored_keys = set(stored["row_key"].to_list())
        frames, seconds, reused, stored_rows = [], {}, 0, 0
        for attack in attacks:
            started = time.perf_counter()
            fingerprint = attack_fingerprint(attack, params.seed)
            keys = [row_key(fingerprint, pid, text) for pid, text in zip(prompt_ids, texts)]
            todo = [i for i, k in enumerate(keys) if k not in stored_keys]
            reused += len(keys) - len(todo)
            for c in range(0, len(todo), CHUNK):
                rows = todo[c: c + CHUNK]
                seeds = [derive_seed(params.seed, "attack", prompt_ids[i], attack.name) for i in rows]
                outcomes = attack.apply_batch([texts[i] for i in rows], seeds)
                chunk = pl.DataFrame({
                    "prompt_id": [prompt_ids[i] for i in rows],
                    "task": [subset["task"][i] for i in rows],
                    "attack": [attack.name] * len(rows),
                    "family": [attack.family] * len(rows),
                    "in_R": [attack.in_R] * len(rows),
                    "text": [o.text if o.ok else None for o in outcomes],
                    "ok": [o.ok for o in outcomes],
                    "error": [o.error for o in outcomes],
                    "row_key": [keys[i] for i in rows],
                }, schema={**PERTURBED_SCHEMA, "row_key": pl.String})
                write_table(chunk, parts / f"{keys[rows[0]]}.parquet")
                stored = pl.concat([stored, chunk])
                stored_keys.update(chunk["row_key"].to_list())
                stored_rows += chunk.height
                if on_chunk_done is not None:
                    on_chunk_done(stored_rows)
            seconds[attack.name] = round(time.perf_counter() - started, 3)
            order = pl.DataFrame({"row_key": keys, "_order": range(len(keys))}, schema={"row_key": pl.String,
                                                                                       "_order": pl.Int64})
            frames.append(order.join(stored.unique("row_key", keep="first"), on="row_key", how="left")
                          .sort("_order").select(list(PERTURBED_SCHEMA)))
        table = pl.concat(frames) if frames else pl.DataFrame(schema=PERTURBED_SCHEMA)
        write_table(table, PERTURBED)
        shutil.rmtree(parts, ignore_errors=True)
        info.update(rows=table.height, failed=int((~table["ok"]).sum()), attack_seconds=seconds, resumed_rows=reused,
                    attacked_per_task=subset.group_by("task").len().sort("task").rows())
