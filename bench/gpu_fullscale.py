"""The whole pipeline at full scale (params-full.yaml: 296 prompts x 1,024 tokens, the attacks, the judge), every
stage of dvc.yaml in order, timed per stage — without DVC, for machines that have none.

On a GPU box with real weights, ``dvc repro`` does the same (each stage writes reports/timings/<stage>.json);
this harness is for a box without DVC or real weights, such as the lent benchmark GPU:

    # real models, the project's params (any machine; no DVC needed)
    PYTHONPATH=. python3 bench/gpu_fullscale.py --params params-full.yaml --workdir /tmp/mmw-full
    # random-weight stand-ins of a real architecture (honest timings, meaningless text): every model in the
    # params (generator, judge, local paraphraser) becomes one random-init Llama-3-8B-shaped folder with the
    # tokenizer found in --tokenizer (an HF tokenizer folder)
    PYTHONPATH=. python3 bench/gpu_fullscale.py --params params-full.yaml --random-weights llama3-8b \\
        --tokenizer .gpu/tokenizer --workdir /tmp/mmw-full --out DIR

``--probe`` runs every stage under ``bench/stage_probe.py`` (cProfile): ``<workdir>-logs/<stage>.profile.txt``
lists where its time went (imports, model load, compilation, the work) and the result's ``probe`` entry gives the
seconds from process start to the command's start and end (the rest of ``wall_s`` is interpreter exit).

The stages run as ``python -m mmw <stage>`` subprocesses in ``--workdir`` (a scratch copy of the inputs, so the
repository's own data/ is untouched). Attacks whose packages are missing on the machine are dropped from the
params and listed in the result; a failing stage is recorded with the end of its log and the run goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import typer
import yaml

ROOT = Path(__file__).resolve().parent.parent
ARCHS = {
    # Meta-Llama-3-8B(-Instruct): the paper's judge and one of its generators. Grouped-query attention (8 KV
    # heads) is what lets all 296 rows x 1,100 positions share one H100 (KV cache ~41 GB in bf16).
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192),
    # For CPU smoke runs of this harness.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=49152, max_position_embeddings=4096),
    # The CPU twin of the stand-ins' host work: tiny layers, Llama-3's 128,256 ids (with the widened tokenizer of
    # bench/gpu_setup_h200.sh), so tokenizing, detection tables and the attacks see the GPU run's texts.
    "tiny-wide": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128256, max_position_embeddings=4096),
}


#: What the stages import, once before timing (bench/warm_imports.py, with the modules a first compilation imports),
#: so the byte-code cache is warm as on any second run.
WARM_IMPORTS = ("torch", "transformers", "polars", "scipy.stats", "numba", "mmw.cli", "mmw.engines.generate",
                "mmw.judge.judge", "transformers.models.llama.modeling_llama", "transformers.generation.utils")


def dirty_mb() -> float | None:
    """The page cache's bytes not yet written back (Dirty + Writeback in /proc/meminfo), in MB; None off Linux."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return round(sum(int(fields[k].split()[0]) for k in ("Dirty", "Writeback")) / 1024, 1)
    except (OSError, KeyError, ValueError):
        return None


def random_model(arch: str, tokenizer: Path, folder: Path, record: dict | None = None) -> Path:
    """A random-init model of ``arch`` saved as an HF folder with ``tokenizer``'s files (bf16 on CUDA).

    A folder it writes is flushed to disk before it returns (16 GB for llama3-8b: 9.5-11.1 GB were still dirty on
    the lent H100s), so the writeback does not run while a timed stage reads its libraries; a machine's real
    weights are on its disk before any run. ``record`` gets the dirty MB before the flush and its seconds."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").is_file():
        return folder
    # Built under another name and renamed when whole: a build killed by a call's time limit must not leave a folder
    # that the next run takes for a model (save_pretrained writes config.json first), and its 16 GB must go.
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    cfg = LlamaConfig(**ARCHS[arch], bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.save_pretrained(partial)
    tok.save_pretrained(partial)
    dirty, t0 = dirty_mb(), time.perf_counter()
    os.sync()
    partial.rename(folder)
    if record is not None:
        record.update(dirty_mb_before_sync=dirty, model_sync_s=round(time.perf_counter() - t0, 1))
    del model
    # The stages run in subprocesses: this process must not keep the weights in its CUDA cache (it did: 31 GB).
    torch.cuda.empty_cache()
    return folder


def swap_models(node, folder: str):
    """Every model named in the board (generator, judge, paraphraser, ...) -> a link to ``folder`` named after the
    model it replaces: two roles that name the same model (the generator and the perplexity scorer) share a path,
    two different models do not, so a process that loads each distinct path once (``--in-process``) loads as many
    models as it would with the real ones."""
    if isinstance(node, dict):
        return {k: swap_models(v, folder) for k, v in node.items()}
    if isinstance(node, list):
        return [swap_models(v, folder) for v in node]
    if isinstance(node, str) and node.startswith("embedded:"):
        link = Path(f"{folder}-{node.removeprefix('embedded:')}")
        if not link.exists():
            link.symlink_to(Path(folder).resolve(), target_is_directory=True)
        return str(link)
    return node


def override(board: dict, item: str) -> None:
    """``section.key=value`` (YAML value) like ``dvc exp run -S``; ``attacks.<name>.<param>=value`` sets a
    parameter of every attack spec of that name."""
    path, _, raw = item.partition("=")
    value = yaml.safe_load(raw)
    parts = path.split(".")
    if parts[0] == "attacks" and len(parts) == 3 and parts[1] != "fraction":
        for spec in board["attacks"]["specs"]:
            if spec.get("name") == parts[1]:
                spec[parts[2]] = value
        return
    node = board
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def site_folder(workdir: Path) -> Path:
    """Where :func:`mmw_site` puts this tree's package copy for a run in ``workdir``."""
    tree = hashlib.sha256(str(ROOT.resolve()).encode()).hexdigest()[:12]
    return workdir.resolve().parent / f"mmw-site-{tree}"


def mmw_site(workdir: Path) -> Path:
    """A copy of the package with ``kernels/`` and ``stages/`` as ``mmw.kernels`` and ``mmw.stages`` (what pip's
    package-dir mapping does), for a checkout that is not pip-installed.

    One folder a source tree, beside ``workdir`` and shared by every run of that tree (the files copied with their
    modification times): numba keys its on-disk kernels by the source file's path and time, so a copy under each
    run's own folder made every run compile the detector's kernels again (1.5-2.9 s a configuration on an H100),
    which an installed package's later processes never do."""
    site = site_folder(workdir)
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(ROOT / "mmw", site / "mmw", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "data").symlink_to(ROOT / "data")  # package data (task CSVs, attack lexicons) is read next to mmw/
    for folder, package in (("kernels", "kernels"), ("stages", "stages")):  # pyproject's package-dir mapping
        if (ROOT / folder).is_dir() and not (site / "mmw" / package).exists():
            shutil.copytree(ROOT / folder, site / "mmw" / package, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def usable_attacks(specs: list[dict]) -> tuple[list[dict], list[str]]:
    """The attack specs whose attack builds here (packages present), and why the others do not."""
    from mmw.attacks import build_attack

    kept, dropped = [], []
    for index, spec in enumerate(specs):
        try:
            build_attack(spec, f"attacks.specs[{index}]")  # imports the attack's packages, loads no model
            kept.append(spec)
        except Exception as err:  # noqa: BLE001 - an attack that cannot start here is reported, not fatal
            dropped.append(f"{spec}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return kept, dropped


def main(params: Path = Path("params-full.yaml"), workdir: Path = Path("/tmp/mmw-full"), random_weights: str = "",
         tokenizer: Path = Path(".gpu/tokenizer"), out: str = "", stages: str = "", timeout_s: int = 3600,
         overrides: list[str] = typer.Option([], "--set", help="section.key=value, as dvc exp run -S"),
         probe: bool = typer.Option(False, help="run each stage under bench/stage_probe.py (cProfile; where a "
                                                "stage's process time goes), profiles beside the logs"),
         in_process: bool = typer.Option(False, help="run the stages one after another in one process that loads "
                                                     "each model once (what a packed sweep unit does: "
                                                     "bench/warm_stages.py), instead of a process per stage")) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    board = yaml.safe_load(params.read_text())
    result: dict = {"params": str(params), "random_weights": random_weights or None, "overrides": overrides,
                    "stages": []}
    started = time.perf_counter()
    if random_weights:
        t0 = time.perf_counter()
        folder = str(random_model(random_weights, tokenizer, workdir / "models" / random_weights, record=result))
        result["model_build_s"] = round(time.perf_counter() - t0, 1)  # with the flush
        board.setdefault("quality", {}).setdefault("scorer", "embedded:smollm2-135m")  # its default
        board = swap_models(board, folder)
    for item in overrides:
        override(board, item)
    site = mmw_site(workdir)
    sys.path.insert(0, str(site))
    board["attacks"]["specs"], result["attacks_dropped"] = usable_attacks(board["attacks"]["specs"] or [])
    (workdir / "params.yaml").write_text(yaml.safe_dump(board, sort_keys=False))
    for sub in ("data/tasks", "data/attacks"):
        if (ROOT / sub).is_dir() and not (workdir / sub).exists():
            shutil.copytree(ROOT / sub, workdir / sub)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "MMW_CACHE_DIR": os.environ.get("MMW_CACHE_DIR", str(workdir / "cache")), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1",
           # numba's kernels cached beside the work folders unless the caller names a folder (the A/B script names
           # one per cache state): in the package copy's own __pycache__ each run's fresh copy would drop them.
           "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", str(workdir.resolve().parent / "mmw-numba")),
           # HF's DynamicCache grows by concatenation every step: without expandable segments a 296-row batch
           # fragments the allocator into an out-of-memory long before the cache fills the card.
           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")}
    if not os.access(sysconfig.get_paths()["purelib"], os.W_OK) and "PYTHONPYCACHEPREFIX" not in os.environ:
        # Read-only site-packages (as on the lent GPU machine): without a writable byte-code cache every stage
        # process compiles ~4,600 modules from source (~8-11 s a stage), which no normal installation pays.
        # One byte-code cache beside the work folders, shared by the runs (an installation compiles once).
        env["PYTHONPYCACHEPREFIX"] = str(workdir.resolve().parent / "mmw-pycache")
    # The lent machine's image also sets PYTHONDONTWRITEBYTECODE=1: then no byte-code is ever written, the cache
    # above stays empty, and every stage process compiled 3,300-6,500 modules again (15-17 s for a stage that
    # imports torch and transformers, under cProfile). A normal installation keeps its byte-code.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    warm = subprocess.run([sys.executable, str(ROOT / "bench" / "warm_imports.py"), *WARM_IMPORTS], cwd=workdir,
                          env=env, check=False, stdout=subprocess.PIPE, text=True)
    result["warm_imports_s"] = round(time.perf_counter() - t0, 1)  # fills the byte-code cache; not a stage's time
    for line in warm.stdout.splitlines():
        if line.startswith('{"warm_imports"'):
            result["warm_imports"] = json.loads(line)["warm_imports"]
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    wanted = stages.split(",") if stages else list(dvc)
    logs = workdir.with_name(workdir.name + "-logs")
    logs.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["total_s"] = round(time.perf_counter() - started, 1)
        if out:
            Path(out, "gpu_fullscale.json").write_text(json.dumps(result, indent=1))

    if in_process:
        result["in_process"] = True
        log = logs / "in-process.log"
        t0 = time.perf_counter()
        with log.open("w") as f:
            try:
                rc = subprocess.run([sys.executable, str(ROOT / "bench" / "warm_stages.py"), str(ROOT),
                                     ",".join(wanted)], cwd=workdir, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        result["process_wall_s"] = round(time.perf_counter() - t0, 1)  # imports, loads, stages, exit
        result["process_rc"] = rc
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith('{"split"'):  # bench/warm_stages.py under MMW_BENCH_SPLIT=1
                result.setdefault("splits", []).append(json.loads(line))
                print("  split " + line, flush=True)
            if line.startswith('{"stage"'):
                entry = json.loads(line)
                timing = workdir / "reports" / "timings" / f"{entry['stage']}.json"
                if timing.is_file():
                    entry["timing"] = json.loads(timing.read_text())
                result["stages"].append(entry)
                print(f"{entry['stage']:24s} {entry['wall_s']:8.1f} s  rc={entry['rc']}", flush=True)
        if rc != 0:
            result["log_tail"] = log.read_text(errors="replace").splitlines()[-12:]
            print(" | ".join(result["log_tail"][-4:]), flush=True)
        save()
        wanted = []
    for name in wanted:
        cmd = dvc[name]["cmd"].split()
        log = logs / f"{name}.log"  # outside the run directory, which stages may clean
        argv = [sys.executable, "-m", "mmw", *cmd[1:]] if cmd[0].endswith("mmw") else cmd
        if probe and cmd[0].endswith("mmw"):
            argv = [sys.executable, str(ROOT / "bench" / "stage_probe.py"), str(logs / f"{name}.profile"), *cmd[1:]]
        t0 = time.perf_counter()
        with log.open("w") as f:
            try:
                rc = subprocess.run(argv, cwd=workdir, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        wall = time.perf_counter() - t0
        tail = log.read_text(errors="replace").splitlines()[-6:]
        entry = {"stage": name, "wall_s": round(wall, 1), "rc": rc}
        timing = workdir / "reports" / "timings" / f"{name}.json"
        if timing.is_file():
            entry["timing"] = json.loads(timing.read_text())
        probed = [line for line in log.read_text(errors="replace").splitlines() if line.startswith('{"probe"')]
        if probed:
            entry["probe"] = json.loads(probed[-1])["probe"]  # exit/teardown = wall_s - end_s
        if rc != 0:
            entry["log_tail"] = tail
        result["stages"].append(entry)
        print(f"{name:24s} {wall:8.1f} s  rc={rc}" + ("" if rc == 0 else "  | " + " | ".join(tail[-3:])),
              flush=True)
        save()
    if out:
        for name in ("summary.md", "metrics.json"):
            if (workdir / "reports" / name).is_file():
                shutil.copy(workdir / "reports" / name, Path(out) / name)
    print(f"total {result['total_s']:.1f} s (model build {result.get('model_build_s', 0)} s); attacks dropped: "
          f"{len(result['attacks_dropped'])}")
    for line in result["attacks_dropped"]:
        print("  dropped:", line)


if __name__ == "__main__":
    typer.run(main)
