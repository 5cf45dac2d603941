"""The detection stages' host work at the full configuration's size, on any machine (no GPU, no model weights):
params-full.yaml's 296 prompts with 1,024 generated ids each, its nine attacks that need no model, 16 audit keys,
and Llama-3's 128,256-id vocabulary (the embedded tokenizer widened by added tokens, as the GPU runs' stand-in in
bench/gpu_setup_h200.sh). The generations are random ids (what a random-init generator writes), decoded by that
tokenizer, on both sides: the detectors see texts of the GPU runs' length and make, none of them watermarked.

    PYTHONPATH=. .venv/bin/python bench/detect_stages.py --workdir /tmp/mmw-detect --rounds 5 [--site DIR ...]

Builds the workspace once (key, low_entropy_inputs, prompts, the synthetic generations, perturb), then runs
``detect_baseline`` and ``detect_watermarked`` in one process per round (``bench/warm_stages.py``, after a
``prompts`` stage that loads the tokenizer as the pipeline's first stages do), for each ``--site`` in turn: a
package copy of another tree (``git worktree`` + ``bench/gpu_fullscale.py``'s ``mmw_site``), so two trees are timed
round by round, interleaved. Prints one JSON line a run and a summary (median [min, max] a stage and site); the
tables each site wrote in its last round are compared (``equal_tables``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from gpu_fullscale import mmw_site, override, random_model, swap_models  # noqa: E402

ATTACKS = ('attacks.specs=[{name: swap, p: 0.05}, {name: swap, p: 0.1}, {name: swap, p: 0.2}, '
           '{name: misspelling, p: 0.25}, {name: typo, p: 0.05}, {name: typo, p: 0.1}, {name: lowercase}, '
           '{name: contraction}, {name: expansion}]')
WIDTH = 128_256  # Llama-3's vocabulary
NEW_TOKENS = 1_024


def widened_tokenizer(folder: Path) -> Path:
    """The embedded generator's tokenizer with added tokens up to Llama-3's 128,256 ids (the GPU runs' stand-in)."""
    if (folder / "tokenizer.json").is_file():
        return folder
    from transformers import AutoTokenizer

    from mmw.engines.models import DEFAULT_MODEL, load_tokenizer

    base, _ = load_tokenizer(DEFAULT_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(base.name_or_path)
    tokenizer.add_tokens([f"<x{i}>" for i in range(WIDTH - len(tokenizer))])
    tokenizer.save_pretrained(folder)
    return folder


def stages(site: Path, workdir: Path, names: str, env: dict) -> list[dict]:
    """Run ``names`` in one process with the package copy ``site`` -> the stage lines it printed."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "warm_stages.py"), str(ROOT), names], cwd=workdir,
                         env={**env, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=False)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"stage"')]
    if any(line["rc"] for line in lines) or out.returncode:
        raise SystemExit(f"stages {names} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return lines


def synthetic_generations(workdir: Path, tokenizer_folder: Path, seed: int = 0) -> None:
    """``data/generations/{baseline,watermarked}.parquet``: 1,024 random ids a prompt, decoded."""
    import numpy as np
    import polars as pl
    from transformers import AutoTokenizer

    from mmw.io import GENERATIONS, GENERATIONS_SCHEMA

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    prompts = pl.read_parquet(workdir / "data" / "prompts.parquet")
    rng = np.random.default_rng(seed)
    for which, path in GENERATIONS.items():
        ids = rng.integers(0, len(tokenizer), size=(prompts.height, NEW_TOKENS)).tolist()
        table = pl.DataFrame({
            "prompt_id": prompts["prompt_id"], "task": prompts["task"], "prompt": prompts["prompt"],
            "text": tokenizer.batch_decode(ids), "tokens": ids, "n_tokens": [NEW_TOKENS] * prompts.height,
            "mean_entropy": [0.0] * prompts.height, "mean_spike_entropy": [0.0] * prompts.height,
        }, schema=GENERATIONS_SCHEMA)
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        table.write_parquet(workdir / path)
        print(f"{which}: {table.height} rows of {NEW_TOKENS} ids", flush=True)


def main(workdir: Path = Path("/tmp/mmw-detect"), rounds: int = 5,
         site: list[Path] = typer.Option([], help="package copies to time against each other (default: this tree)"),
         params: Path = ROOT / "params-full.yaml") -> None:
    import polars as pl
    import yaml

    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MMW_CACHE_DIR": str(workdir / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    sites = site or [mmw_site(workdir)]
    if not (workdir / "data" / "perturbed.parquet").is_file():
        tokenizer = widened_tokenizer(workdir / "tokenizer")
        folder = str(random_model("tiny-wide", tokenizer, workdir / "models" / "tiny-wide"))
        board = swap_models(yaml.safe_load(params.read_text()), folder)
        for item in (ATTACKS, "model.batch_size=296"):
            override(board, item)
        (workdir / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
        for sub in ("data/tasks", "data/attacks"):
            if not (workdir / sub).exists():
                shutil.copytree(ROOT / sub, workdir / sub)
        stages(sites[0], workdir, "key,low_entropy_inputs,prompts", env)
        synthetic_generations(workdir, tokenizer)
        stages(sites[0], workdir, "perturb", env)
    walls: dict[tuple[str, str], list[float]] = {}
    tables: dict[str, dict[str, pl.DataFrame]] = {}
    for round_ in range(rounds):
        for copy in sites:
            for line in stages(copy, workdir, "prompts,detect_baseline,detect_watermarked", env):
                if line["stage"].startswith("detect"):
                    walls.setdefault((str(copy), line["stage"]), []).append(line["wall_s"])
                    print(json.dumps({"round": round_, "site": str(copy), **line}), flush=True)
            tables[str(copy)] = {w: pl.read_parquet(workdir / "data" / "detections" / f"{w}.parquet")
                                 for w in ("baseline", "watermarked")}
    summary = {f"{copy} {stage}": f"{statistics.median(v):.1f} [{min(v):.1f}, {max(v):.1f}]"
               for (copy, stage), v in walls.items()}
    first = next(iter(tables.values()))
    summary["equal_tables"] = all(t[w].equals(first[w]) for t in tables.values() for w in first)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    typer.run(main)
