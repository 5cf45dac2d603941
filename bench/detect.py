"""Detection benchmark: the detections of one full MarkMyWords configuration on the CPU and on a CUDA GPU.

Work unit (synthetic tokens, vocabulary 49,152): 296 generations of 256..1,024 tokens (uniform) plus 14 attacks of
the first third of them (99 texts each; 10 % of tokens replaced, length changed by up to +-10 %, capped at 1,024):
1,682 texts, per-prefix p-values for every text. Schemes: sum score with R1 window H=1 and C4 / C1; align score
(C1, R3 L=1,024, T=100); edit score (C1, R3 L=256, T=100, psi=0.5).

    python bench/detect.py cpu --out cpu.json           # this machine: numba twin vs numpy reference
    python bench/detect.py gpu --out gpu.json           # GPU: twin equality at real sizes, timings, ceilings
    python bench/detect.py edit-variant --band 8 ...    # GPU: one edit-kernel tuning variant (fresh process)
    python bench/detect.py profile --score edit         # a small launch for Nsight Compute

Slow paths (the numpy reference everywhere, the CPU twin for align/edit) run on a subset of the work unit and are
extrapolated by the work they do (tokens for sum, cost evaluations for align, DP cells for edit); the JSON says
which numbers are measured and which extrapolated.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import typer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _kernels_importable() -> None:
    """``mmw.kernels`` lives in ./kernels (an editable install maps it); without the install, map it here."""
    if importlib.util.find_spec("mmw") is not None:
        try:
            importlib.import_module("mmw.kernels")
            return
        except ModuleNotFoundError:
            pass
    spec = importlib.util.spec_from_file_location("mmw.kernels", ROOT / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "kernels")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["mmw.kernels"] = module
    spec.loader.exec_module(module)
    import mmw

    mmw.kernels = module


_kernels_importable()

from mmw.kernels import cuda as cuda_twin  # noqa: E402  (first: it shims numpy 2.5 for numba-cuda)
from numba import cuda, float64, uint64  # noqa: E402

from mmw.watermark.detector import Detector  # noqa: E402
from mmw.kernels.prf import prf  # noqa: E402
from mmw.kernels.stats import EXPONENTIAL, token_statistic  # noqa: E402
from mmw.kernels.backend import NumbaBackend  # noqa: E402
from mmw.watermark.prf import key_from_string  # noqa: E402
from mmw.watermark.randomness import RandomnessSource  # noqa: E402
from mmw.watermark.samplers import build_sampler  # noqa: E402
from mmw.watermark.scheme import SchemeSpec  # noqa: E402

app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])

VOCAB = 49152
GENERATIONS = 296
ATTACKS = 14
ATTACKED = 99  # a third of the generations
MAX_TOKENS = 1024
KEY = key_from_string("bench-detect")
SCHEMES: dict[str, dict[str, Any]] = {
    "sum_c4": {"sampler": "distribution_shift", "delta": 2.0, "gamma": 0.5, "randomness": "window", "window": 1,
               "score": "sum"},
    "sum_c1": {"sampler": "exponential", "randomness": "window", "window": 1, "score": "sum"},
    "align_c1": {"sampler": "exponential", "randomness": "fixed", "key_length": 1024, "score": "align",
                 "trials": 100},
    "edit_c1": {"sampler": "exponential", "randomness": "fixed", "key_length": 256, "score": "edit", "psi": 0.5,
                "trials": 100},
}


def work_unit(seed: int = 0, lengths: str = "uniform") -> list[np.ndarray]:
    """The 1,682 token arrays of one benchmark configuration ('uniform' 256..1024 tokens, or 'max': all 1024)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(256, MAX_TOKENS + 1, GENERATIONS) if lengths == "uniform" else np.full(GENERATIONS, 1024)
    generations = [rng.integers(0, VOCAB, n) for n in sizes]
    texts = list(generations)
    for _ in range(ATTACKS):
        for g in generations[:ATTACKED]:
            t = g.copy()
            hit = rng.random(len(t)) < 0.1
            t[hit] = rng.integers(0, VOCAB, int(hit.sum()))
            n = int(np.clip(len(t) + rng.integers(-(len(t) // 10), len(t) // 10 + 1), 1, MAX_TOKENS))
            texts.append(t[:n] if n <= len(t) else np.concatenate([t, rng.integers(0, VOCAB, n - len(t))]))
    return [t.astype(np.int64) for t in texts]


def work(name: str, texts: list[np.ndarray]) -> dict[str, float]:
    """What the scheme must compute on ``texts``: tokens, cost evaluations (one PRF + one log each), DP cells."""
    spec = SCHEMES[name]
    n = np.array([len(t) for t in texts], dtype=np.float64)
    keys = spec.get("trials", 0) + 1
    out = {"texts": float(len(texts)), "tokens": float(n.sum())}
    if spec["score"] == "sum":
        out["cost_evaluations"] = float(n.sum())
    else:
        out["cost_evaluations"] = float(n.sum() * spec["key_length"] * keys)
    if spec["score"] == "edit":
        out["dp_cells"] = float((n * n).sum() * spec["key_length"] * keys)
    return out


def scheme(name: str, **override: Any) -> SchemeSpec:
    return SchemeSpec.from_params({**SCHEMES[name], **override})


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median wall seconds of ``repeat`` calls (after the caller's warm-up) and the last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), result


def _detect_and_backend(det: Detector, texts: list[np.ndarray]) -> tuple[float, float]:
    """Wall seconds of the whole detection (scores + p-values) and of the backend's scores alone (timed apart
    for sum scores only: the empirical p-value (1 + n_le) / (T + 1) costs nothing next to align/edit)."""
    seconds, _ = timed(lambda: det.detect(texts), 1)
    if not det.spec.exact_null:
        return seconds, seconds
    backend_s, _ = timed(lambda: det.backend.sum_prefix_batch(texts), 1)
    return seconds, backend_s


def subset_for(name: str, texts: list[np.ndarray], budget: float) -> list[np.ndarray]:
    """A spread of texts (every k-th) whose work is about ``budget`` cost evaluations or DP cells."""
    total = work(name, texts)
    unit = "dp_cells" if "dp_cells" in total else "cost_evaluations"
    k = max(1, int(np.ceil(total[unit] / budget)))
    return texts[::k] or texts[:1]


def extrapolate(name: str, seconds: float, measured: list[np.ndarray], full: list[np.ndarray],
                measured_keys: int | None = None) -> float:
    """Scale a subset's time to the full work unit by the work that dominates (tokens, evaluations, cells)."""
    a, b = work(name, measured), work(name, full)
    unit = "dp_cells" if "dp_cells" in b else ("tokens" if SCHEMES[name]["score"] == "sum" else "cost_evaluations")
    scale = b[unit] / a[unit]
    if measured_keys is not None:  # the reference ran with fewer trial keys than the scheme
        scale *= (SCHEMES[name].get("trials", 0) + 1) / measured_keys
    return seconds * scale


def detector(name: str, device: str, **override: Any) -> Detector:
    return Detector(scheme(name, **override), KEY, VOCAB, device=device)


def machine() -> dict[str, Any]:
    import numba

    return {"date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "cpu": platform.processor() or
            platform.machine(), "cores": os.cpu_count(), "numba_threads": numba.get_num_threads(),
            "python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
            "load_average_1min": os.getloadavg()[0]}  # other jobs on the machine slow the CPU numbers


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1)
    print(text)
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------- CPU
@app.command()
def cpu(out: Path = typer.Option(None, help="JSON file for the results"),
        lengths: str = typer.Option("uniform", help="uniform (256..1024) | max (all 1024)"),
        reference: bool = typer.Option(True, help="also time the numpy reference")) -> None:
    """This machine: numba CPU twin vs the numpy reference (tokens/s for the whole work unit)."""
    texts = work_unit(lengths=lengths)
    results: dict[str, Any] = {"machine": machine(), "lengths": lengths, "schemes": {}}
    # Budgets (cost evaluations / DP cells) keep each measurement to ~10-60 s on 2 cores.
    budgets = {"sum_c4": (np.inf, 2e5), "sum_c1": (np.inf, 2e5), "align_c1": (5e8, 3e8), "edit_c1": (5e9, 2e9)}
    for name in SCHEMES:
        numba_budget, reference_budget = budgets[name]
        row: dict[str, Any] = {"work": work(name, texts)}
        sub = texts if np.isinf(numba_budget) else subset_for(name, texts, numba_budget)
        detector(name, "cpu").detect(sub[:2])  # compile outside the timing
        seconds, backend_s = _detect_and_backend(detector(name, "cpu"), sub)
        full = seconds if sub is texts else extrapolate(name, seconds, sub, texts)
        row["numba"] = {"measured_texts": len(sub), "measured_s": seconds, "measured_backend_s": backend_s,
                        "full_s": full, "extrapolated": sub is not texts,
                        "tokens_per_s": work(name, texts)["tokens"] / full}
        results["schemes"][name] = row
        if not reference:
            print(f"{name}: numba {row['numba']['full_s']:.1f} s", flush=True)
            continue
        # The reference: a subset; for edit one typical text with 2 keys instead of 101 (one DP per key and shift).
        keys: int | None = None
        override: dict[str, Any] = {}
        if name == "edit_c1":
            override, keys = {"trials": 1, "alpha": 0.5}, 2
            rsub = [t for t in texts if 600 <= len(t) <= 700][:1]
        elif SCHEMES[name]["score"] == "sum":
            rsub = texts[::8]
        else:
            rsub = subset_for(name, texts, reference_budget)
        seconds, backend_s = _detect_and_backend(detector(name, "reference", **override), rsub)
        full = extrapolate(name, seconds, rsub, texts, keys)
        row["reference"] = {"measured_texts": len(rsub), "measured_keys": keys or SCHEMES[name].get("trials", 0) + 1,
                            "measured_s": seconds, "measured_backend_s": backend_s, "full_s": full,
                            "extrapolated": True, "tokens_per_s": work(name, texts)["tokens"] / full}
        row["speedup_numba_vs_numpy"] = row["reference"]["full_s"] / row["numba"]["full_s"]
        print(f"{name}: numba {row['numba']['full_s']:.1f} s, numpy {row['reference']['full_s']:.1f} s", flush=True)
    write_json(out, results)


# ---------------------------------------------------------------------------------------------------- GPU
def _gpu_info() -> dict[str, Any]:
    dev = cuda.get_current_device()
    info = {"name": dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
            "compute_capability": list(dev.compute_capability), "sms": int(dev.MULTIPROCESSOR_COUNT),
            "max_clock_mhz": int(dev.CLOCK_RATE) // 1000, "memory_clock_mhz": int(dev.MEMORY_CLOCK_RATE) // 1000}
    try:
        import numba_cuda

        info["numba_cuda"] = numba_cuda.__version__
    except ImportError:
        pass
    return info


@cuda.jit
def _fp64_add_min(out, iterations, step, cap):
    q = cuda.grid(1)
    a0 = float64(q)
    a1, a2, a3, a4, a5, a6, a7 = a0 + 1, a0 + 2, a0 + 3, a0 + 4, a0 + 5, a0 + 6, a0 + 7
    for _ in range(iterations):  # 8 independent chains of (add, min): the DP cell's instruction types
        a0 = min(a0 + step, cap)
        a1 = min(a1 + step, cap)
        a2 = min(a2 + step, cap)
        a3 = min(a3 + step, cap)
        a4 = min(a4 + step, cap)
        a5 = min(a5 + step, cap)
        a6 = min(a6 + step, cap)
        a7 = min(a7 + step, cap)
    out[q] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7


@cuda.jit
def _cost_evaluations(out, iterations, key, rank, nodes, bits):
    q = cuda.grid(1)
    seed = prf(key, q)
    total = 0.0
    for i in range(iterations):  # the align cell's work without its memory traffic
        total += token_statistic(EXPONENTIAL, i, seed, 0.0, rank, 1.0, nodes, bits)
    out[q] = total


def _dp_cells_kernel(band: int):
    """The edit kernel's band rows (``band`` columns) with costs in registers: its instruction mix without memory
    traffic."""

    @cuda.jit
    def dp_cells(out, rows, psi, rank, nodes, bits):
        up = cuda.local.array(band, float64)
        stp = cuda.local.array(band, float64)
        costs = cuda.local.array(band, float64)
        seeds = cuda.local.array(band, uint64)
        q = cuda.grid(1)
        for k in range(band):
            stp[k] = psi * (k + 1)
            up[k] = stp[k]
            costs[k] = -0.01 * (q % 7 + k)
        m = 0.0
        left = 0.0
        for _ in range(rows):
            m, _value = cuda_twin._band_row(m, left, up, stp, costs, True, 0, seeds, psi, -1, EXPONENTIAL, 0.0, rank,
                                            1.0, nodes, bits)
            left = m - 0.001
        out[q] = m + up[0]

    return dp_cells


@cuda.jit
def _copy(src, dst):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.shape[0], stride):
        dst[i] = src[i]


def _ceilings(blocks_per_sm: int = 16, fp64_iterations: int = 20000, cost_iterations: int = 2000,
              copy_elements: int = 1 << 28) -> dict[str, float]:
    """Measured device ceilings: FP64 add+min rate, cost-evaluation rate (the align cell's PRF + log in
    registers), and device-memory bandwidth (a copy of ``copy_elements`` float64, bytes read + written)."""

    def event_seconds(launch: Callable[[], None], repeat: int = 5) -> float:
        launch()
        cuda.synchronize()
        times = []
        for _ in range(repeat):
            start, stop = cuda.event(), cuda.event()
            start.record()
            launch()
            stop.record()
            stop.synchronize()
            times.append(max(start.elapsed_time(stop), 1e-6) / 1e3)  # ms; the simulator reports 0
        return float(np.median(times))

    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    threads, blocks = 256, sms * blocks_per_sm
    out = cuda.device_array(threads * blocks)
    t = event_seconds(lambda: _fp64_add_min[blocks, threads](out, fp64_iterations, 1e-300, 1e300))
    fp64 = threads * blocks * fp64_iterations * 16 / t
    rank = cuda.to_device(np.zeros(1, dtype=np.int64))
    nodes = cuda.to_device(np.full((1, 1), -1, dtype=np.int64))
    bits = cuda.to_device(np.full((1, 1), -1, dtype=np.int8))
    t = event_seconds(lambda: _cost_evaluations[blocks, threads](out, cost_iterations, np.uint64(KEY), rank, nodes,
                                                                  bits))
    costs = threads * blocks * cost_iterations / t
    rows = cost_iterations
    dp_cells = _dp_cells_kernel(cuda_twin.BAND)
    t = event_seconds(lambda: dp_cells[blocks, 64](out, rows, 0.5, rank, nodes, bits))
    cells = 64 * blocks * rows * cuda_twin.BAND / t
    src = cuda.to_device(np.random.default_rng(0).random(copy_elements))  # never time on zeros
    dst = cuda.device_array(copy_elements)
    t = event_seconds(lambda: _copy[sms * 32, 256](src, dst))
    return {"fp64_add_min_ops_per_s": fp64, "cost_evaluations_per_s": costs, "dp_cells_per_s": cells,
            "copy_bytes_per_s": 2 * 8 * copy_elements / t}


def _compare(name: str, texts: list[np.ndarray]) -> dict[str, Any]:
    """GPU vs CPU twin on real-size texts: max relative score difference and count mismatches."""
    spec = scheme(name)
    sampler = build_sampler(spec, KEY, VOCAB)
    source = RandomnessSource.from_spec(spec)
    gpu = NumbaBackend(spec, sampler, source, KEY, device="cuda")
    cpu_twin = NumbaBackend(spec, sampler, source, KEY, device="cpu")
    method = "sum_prefix_batch" if spec.score == "sum" else "empirical_prefix_batch"
    got, want = getattr(gpu, method)(texts), getattr(cpu_twin, method)(texts)
    rel, mismatches, positions = 0.0, 0, 0
    for (value, integer), (want_value, want_integer) in zip(got, want):
        scale = np.maximum(np.abs(want_value), 1e-300)
        rel = max(rel, float(np.max(np.abs(value - want_value) / scale, initial=0.0)))
        mismatches += int(np.sum(integer != want_integer))
        positions += len(integer)
    return {"texts": len(texts), "positions": positions, "max_relative_score_difference": rel,
            "integer_mismatches": mismatches}


def _registers() -> dict[str, Any]:
    out = {}
    for name in ("_sum_kernel", "_align_kernel", "_edit_fixed_kernel", "_edit_window_kernel"):
        kernel = getattr(cuda_twin, name)
        try:
            out[name] = {"registers": list(kernel.get_regs_per_thread().values()),
                         "local_bytes": list(kernel.get_local_mem_per_thread().values())}
        except (AttributeError, TypeError):
            out[name] = "n/a"
    return out


@app.command()
def gpu(out: Path = typer.Option(None, help="JSON file for the results"),
        lengths: str = typer.Option("uniform", help="uniform (256..1024) | max (all 1024)"),
        repeat: int = typer.Option(3, help="timed repetitions (median) of the sum and align backends")) -> None:
    """GPU: equality with the CPU twin on real sizes, wall times and rates for the work unit, ceilings."""
    texts = work_unit(lengths=lengths)
    results: dict[str, Any] = {"machine": machine(), "gpu": _gpu_info(), "lengths": lengths, "band": cuda_twin.BAND,
                               "edit_threads": cuda_twin.EDIT_THREADS, "schemes": {}}
    for name in SCHEMES:  # compile every kernel outside the timings
        detector(name, "cuda").detect(texts[:3])
    results["registers"] = _registers()
    print("compiled", flush=True)
    checks = {"sum_c4": texts, "sum_c1": texts, "align_c1": texts[::40], "edit_c1": texts[::300]}
    results["equality_vs_cpu_twin"] = {name: _compare(name, subset) for name, subset in checks.items()}
    print(json.dumps(results["equality_vs_cpu_twin"]), flush=True)
    ceilings = _ceilings()
    results["ceilings"] = ceilings
    for name in SCHEMES:
        spec = scheme(name)
        sampler = build_sampler(spec, KEY, VOCAB)
        backend = NumbaBackend(spec, sampler, RandomnessSource.from_spec(spec), KEY, device="cuda")
        method = getattr(backend, "sum_prefix_batch" if spec.score == "sum" else "empirical_prefix_batch")
        backend_s, _ = timed(lambda: method(texts), 1 if spec.score == "edit" else repeat)
        detect_s, _ = timed(lambda: detector(name, "cuda").detect(texts), 1)
        w = work(name, texts)
        row: dict[str, Any] = {"work": w, "backend_s": backend_s, "detect_s": detect_s,
                               "tokens_per_s": w["tokens"] / detect_s}
        if spec.score == "align":
            row["cost_evaluations_per_s"] = w["cost_evaluations"] / backend_s
            row["fraction_of_cost_ceiling"] = row["cost_evaluations_per_s"] / ceilings["cost_evaluations_per_s"]
        if spec.score == "edit":
            row["dp_cells_per_s"] = w["dp_cells"] / backend_s
            row["fraction_of_dp_cell_ceiling"] = row["dp_cells_per_s"] / ceilings["dp_cells_per_s"]
            row["fraction_of_fp64_add_min"] = 6 * row["dp_cells_per_s"] / ceilings["fp64_add_min_ops_per_s"]
            bytes_moved = w["dp_cells"] * 16 / cuda_twin.BAND + 8 * w["cost_evaluations"]  # boundary column + table
            row["bytes_moved"] = bytes_moved
            row["fraction_of_copy_bandwidth"] = bytes_moved / backend_s / ceilings["copy_bytes_per_s"]
        results["schemes"][name] = row
        print(name, json.dumps(row), flush=True)
    write_json(out, results)


@app.command("edit-variant")
def edit_variant(band: int = typer.Option(..., help="DP columns per register band"),
                 threads: int = typer.Option(..., help="shifts per block"),
                 out: Path = typer.Option(None, help="JSON file for the results"),
                 lengths: str = typer.Option("uniform", help="uniform | max")) -> None:
    """GPU: the edit score with another band width / block size (module constants set before compiling)."""
    cuda_twin.BAND, cuda_twin.COLUMN_PAD, cuda_twin.EDIT_THREADS = band, band, threads
    texts = work_unit(lengths=lengths)
    det = detector("edit_c1", "cuda")
    det.detect(texts[:3])
    check = _compare("edit_c1", texts[::300])
    seconds, _ = timed(lambda: det.backend.empirical_prefix_batch(texts), 1)
    w = work("edit_c1", texts)
    write_json(out, {"band": band, "threads": threads, "lengths": lengths, "backend_s": seconds,
                     "dp_cells_per_s": w["dp_cells"] / seconds, "registers": _registers()["_edit_fixed_kernel"],
                     "equality_vs_cpu_twin": check})


@app.command()
def profile(score: str = typer.Option("edit", help="edit | align"),
            texts_count: int = typer.Option(48, help="texts in the profiled launch")) -> None:
    """One small launch of the align or edit kernel (for ``ncu --launch-count 1``): no warm-up call."""
    name = f"{score}_c1"
    texts = work_unit()[:texts_count]
    t0 = time.perf_counter()
    detector(name, "cuda", trials=9, alpha=0.1).backend.empirical_prefix_batch(texts)
    print(f"{name} profile run: {len(texts)} texts, {time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    app()
