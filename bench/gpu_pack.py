"""What a packed sweep unit saves on a GPU: N configurations of one baseline, run as staged units (every stage a
process of its own, as ``dvc exp run`` runs them; the baseline's stages once, as DVC's run-cache restores them for
the later configurations) against one pack (:class:`mmw.sweep.pack.PackedExecutor`: the baseline's stages once,
then each configuration's stages in this process, the generator, judge and scorer loaded once) — without DVC, for
machines that have none (the lent GPU). DVC's own overhead per experiment (``dvc exp run --temp``: a copy of the
workspace, hashing, the commit) is not in the staged side, so the fixed cost a pack removes is an underestimate.

    PYTHONPATH=/tmp/site python3 bench/gpu_pack.py --random-weights llama3-8b --tokenizer TOK --mode staged --out DIR
    PYTHONPATH=/tmp/site python3 bench/gpu_pack.py --random-weights llama3-8b --tokenizer TOK --mode packed --out DIR

Both modes use the same workdir's models (a random-init folder is built once) and their own judgement cache (no
mode reads the other's judgements). The configurations differ in ``scheme.delta`` and their keys only.
Prints and writes ``gpu_pack_<label>.json``: per configuration its stages' wall times (staged) or its wall time in
the pack (packed), and the totals. ``--decode separate`` makes the pack decode each configuration on its own (the
pack's default is one decode for all, :mod:`mmw.sweep.decode`); the packed side also writes every configuration's
evidence rows (``gpu_pack_rows_<label>.parquet``) so the two decodes' rows can be compared.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import typer
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import gpu_fullscale as full  # noqa: E402 - bench/ is not a package

#: The paper's cheap attacks (no model, no translator): what the earlier full-scale GPU runs used.
CHEAP_ATTACKS = ([{"name": "swap", "p": p} for p in (0.05, 0.1, 0.2)] + [{"name": "synonym", "p": p} for p in
                 (0.25, 0.5, 0.75, 1.0)] + [{"name": "misspelling", "p": 0.25}, {"name": "typo", "p": 0.05},
                 {"name": "typo", "p": 0.1}, {"name": "lowercase"}, {"name": "contraction"}, {"name": "expansion"}])
DELTAS = (5.0, 2.5, 1.0, 4.0, 2.0, 3.0, 1.5, 0.5)


def board_for(params: Path, workdir: Path, random_weights: str, tokenizer: Path, overrides: list[str]) -> dict:
    board = yaml.safe_load(params.read_text())
    board["attacks"]["specs"] = CHEAP_ATTACKS
    if random_weights:
        folder = str(full.random_model(random_weights, tokenizer, workdir / "models" / random_weights))
        board = full.swap_models(board, folder)
        board.setdefault("quality", {})["scorer"] = folder
    for item in overrides:
        full.override(board, item)
    return board


def repo_dir(path: Path, board: dict) -> Path:
    """A directory the stages (and the pack) run in: params.yaml, dvc.yaml and the source data."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
    shutil.copy(ROOT / "dvc.yaml", path / "dvc.yaml")
    for sub in ("data/tasks", "data/attacks"):
        if (ROOT / sub).is_dir():
            shutil.copytree(ROOT / sub, path / sub)
    return path


def staged(board: dict, workdir: Path, keys: list[str], env: dict[str, str], save) -> dict:
    """Configuration 0 runs every stage, each later one only its own stages on a copy of 0's baseline outputs.
    ``save(partial)`` after every stage (a run stopped at its time limit keeps what it measured)."""
    from mmw.sweep.definition import apply_overrides
    from mmw.sweep.pack import _copy, _timed, stage_plan

    plan, _ = stage_plan(ROOT)
    commands = {name: str(stage["cmd"]).split()[1:]  # less the scripts/mmw launcher: run as python -m mmw
                for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()}
    configs = []
    first: Path | None = None
    for index, key in enumerate(keys):
        ws = repo_dir(workdir / f"staged-{index}", apply_overrides(board, {"scheme.delta": DELTAS[index]}))
        if first is not None:
            for stage in (s for s in plan if s.shared):  # as the pack's workspaces get them
                for out in stage.outs:
                    _copy(first / out, ws / out)
        stages = []
        for stage in plan:
            if first is not None and stage.shared:
                continue
            t0 = time.perf_counter()
            log = workdir / f"staged-{index}-{stage.name}.log"
            with log.open("w") as f:
                rc = subprocess.run([sys.executable, "-m", "mmw", *commands[stage.name]], cwd=ws,
                                    env={**env, "MMW_KEY": key}, stdout=f, stderr=subprocess.STDOUT).returncode
            wall = round(time.perf_counter() - t0, 1)
            timer = _timed(ws, stage.name)
            stages.append({"stage": stage.name, "wall_s": wall, "timer_s": timer, "rc": rc})
            print(f"staged config {index} {stage.name:22s} {wall:7.1f} s (timer {timer}) rc={rc}", flush=True)
            if rc != 0:
                print("  " + " | ".join(log.read_text(errors="replace").splitlines()[-4:]), flush=True)
            save({"configs": [*configs, {"index": index, "stages": stages, "partial": True}]})
        configs.append({"index": index, "stages": stages, "wall_s": round(sum(s["wall_s"] for s in stages), 1)})
        first = first or ws
    return {"configs": configs}


def packed(board: dict, workdir: Path, keys: list[str], save, together: bool, rows_out: Path | None) -> dict:
    """One pack of the configurations; ``together``: their watermarked generations in one decode (the pack's
    default), else one decode each. ``rows_out``: every configuration's evidence rows, to compare the two."""
    import polars as pl

    from mmw.sweep.pack import PackedExecutor
    from mmw.sweep.runner import Job

    repo = repo_dir(workdir / "packed", board)
    jobs = [Job(f"c{i}", f"c{i}", {"scheme.delta": DELTAS[i]}, env={"MMW_KEY": key}) for i, key in enumerate(keys)]
    outcomes, rows = [], []

    def record(outcome) -> None:
        if outcome.evidence is not None and rows_out is not None:
            rows.append(outcome.evidence.rows.with_columns(pl.lit(len(outcomes)).alias("config")))
            pl.concat(rows, how="diagonal_relaxed").write_parquet(rows_out)
        print(f"packed config {len(outcomes)} {outcome.status} {outcome.wall_s:7.1f} s "
              f"(shared {outcome.packed['shared_s']} s) {outcome.error or ''}", flush=True)
        outcomes.append({"index": len(outcomes), "status": outcome.status, "error": outcome.error,
                         "wall_s": outcome.wall_s, "packed": outcome.packed,
                         "timings": outcome.evidence.timings if outcome.evidence is not None else None})
        save({"configs": outcomes})

    t0 = time.perf_counter()
    PackedExecutor(repo, pack=0, echo=print, board=board, decode_together=together).run(jobs, record)
    return {"configs": outcomes, "pack_wall_s": round(time.perf_counter() - t0, 1), "decode_together": together}


def main(mode: str = typer.Option(..., help="staged | packed"), configs: int = 3,
         params: Path = Path("params-full.yaml"), workdir: Path = Path("/tmp/mmw-pack"), random_weights: str = "",
         tokenizer: Path = Path(".gpu/tokenizer"), out: str = "",
         overrides: list[str] = typer.Option([], "--set", help="section.key=value, as dvc exp run -S"),
         decode: str = typer.Option("together", help="packed: together (one decode for the pack) | separate")) -> None:
    if mode not in ("staged", "packed"):
        raise typer.BadParameter(f"{mode!r}; allowed: staged, packed", param_hint="--mode")
    if decode not in ("together", "separate"):
        raise typer.BadParameter(f"{decode!r}; allowed: together, separate", param_hint="--decode")
    label = mode if mode == "staged" else f"packed-{decode}-{configs}"
    workdir.mkdir(parents=True, exist_ok=True)
    site = full.mmw_site(workdir)
    sys.path.insert(0, str(site))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "MMW_CACHE_DIR": str(workdir / "cache"), "MMW_JUDGE_CACHE": str(workdir / f"judgements-{mode}"),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
           "PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX", str(workdir / "pycache"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # see gpu_fullscale: the lent image would recompile every import
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})  # the packed side runs here
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix, sys.dont_write_bytecode = env["PYTHONPYCACHEPREFIX"], False  # this process too
    shutil.rmtree(workdir / f"judgements-{mode}", ignore_errors=True)
    keys = [f"gpu-pack-bench-key-{i}-0123456789abcdef" for i in range(configs)]
    started = time.perf_counter()
    board = board_for(params, workdir, random_weights, tokenizer, overrides)
    build_s = round(time.perf_counter() - started, 1)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(Path(full.__file__).with_name("warm_imports.py")), *full.WARM_IMPORTS],
                   cwd=workdir, env=env, check=False)
    warm_s = round(time.perf_counter() - t0, 1)
    result = {"mode": mode, "configs": configs, "random_weights": random_weights or None, "overrides": overrides,
              "model_build_s": build_s, "warm_imports_s": warm_s}
    t0 = time.perf_counter()

    def save(part: dict) -> None:
        result.update(part, total_s=round(time.perf_counter() - t0, 1))
        if out:
            Path(out, f"gpu_pack_{label}.json").write_text(json.dumps(result, indent=1))

    rows_out = Path(out, f"gpu_pack_rows_{label}.parquet") if out else None
    save(staged(board, workdir, keys, env, save) if mode == "staged"
         else packed(board, workdir, keys, save, decode == "together", rows_out))
    print(f"{mode}: {configs} configurations in {result['total_s']:.1f} s (model build {build_s} s, warm imports "
          f"{warm_s} s)", flush=True)


if __name__ == "__main__":
    typer.run(main)
