"""False-positive rates and power of the shipped plugin adapters (mmw.plugins), on simulated text.

Null: i.i.d. uniform token sequences the key did not write (vocabulary V, N texts of L tokens): per adapter the
full-text FPR, the any-prefix FPR of E (first crossing), the any-checkpoint FPR of size_valid and the any-prefix
FPR of the anytime size, each with its exact (Clopper-Pearson) 95 % interval. Power: texts sampled through mmw's
processor from a synthetic language model (i.i.d. normal logits, sd 3, per step) at T = 0.7 and 1: detection
rate and median E / size_valid / anytime size (undetected = inf).

    nice -n 15 .venv/bin/python bench/plugins.py [N] [L]          # hf_kgw, hf_synthid
    nice -n 15 .venv-vllm/bin/python bench/plugins.py [N] [L]     # + vllm_gumbel
"""

from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np
import torch
from scipy import stats

from mmw.plugin_detection import build_detector
from mmw.plugin_generation import build_processor
from mmw.scheme import SchemeSpec

KEY, ALPHA, V = 0x0DDB_A11_5EED, 0.02, 1000
ADAPTERS = {
    "kgw lefthash (green)": ("hf_kgw", {}),
    "kgw selfhash (green)": ("hf_kgw", {"seeding_scheme": "selfhash", "context_width": 4}),
    "kgw lefthash (zscore)": ("hf_kgw", {"detection": "zscore"}),
    "synthid m=30 n=5": ("hf_synthid", {}),
}
if importlib.util.find_spec("vllm") is not None:
    ADAPTERS |= {"vllm gumbel": ("vllm_gumbel", {}), "vllm dual_key_gumbel": ("vllm_gumbel", {"algorithm": "dual_key_gumbel"})}


def ci(k: int, n: int) -> str:
    lo, hi = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return f"{k / n:.2%} [{lo:.2%}, {hi:.2%}]"


def generate(spec: SchemeSpec | None, rows: int, steps: int, temperature: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    proc = build_processor(spec, KEY, V, [seed * 10_007 + r for r in range(rows)], temperature)
    ids = torch.from_numpy(rng.integers(0, V, (rows, 4)))
    for _ in range(steps):
        scores = torch.from_numpy((rng.normal(size=(rows, V)) * 3).astype(np.float32))
        ids = torch.cat([ids, proc(ids, scores).argmax(-1, keepdim=True)], dim=1)
    return [row[4:].copy() for row in ids.numpy()]


def median(sizes: list[int | None]) -> str:
    m = np.median([np.inf if s is None else s for s in sizes])
    return "inf" if not np.isfinite(m) else f"{m:g}"


def main(n: int, length: int) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(2026)
    nulls = [rng.integers(0, V, length) for _ in range(n)]
    print(f"V = {V}, alpha = {ALPHA}, null: {n} uniform texts x {length} tokens; power: 50 texts x {length} tokens")
    print("| adapter | FPR full text | any prefix (E) | any checkpoint (valid) | any prefix (anytime) | "
          "T | detected | median E / valid / anytime | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (plugin, params) in ADAPTERS.items():
        start = time.time()
        spec = SchemeSpec.from_params({"sampler": "plugin", "plugin": plugin, "plugin_params": params, "alpha": ALPHA})
        detector = build_detector(spec, KEY, V)
        res = detector.detect(nulls)
        anytime = ci(sum(r.size_anytime is not None for r in res), n) if spec.exact_null else "n/a"
        row = (f"| {name} | {ci(sum(r.detected for r in res), n)} | {ci(sum(r.size is not None for r in res), n)} | "
               f"{ci(sum(r.size_valid is not None for r in res), n)} | {anytime} |")
        for temperature in (0.7, 1.0):
            marked = detector.detect(generate(spec, 50, length, temperature, seed=7))
            sizes = " / ".join(median([getattr(r, k) for r in marked]) for k in ("size", "size_valid", "size_anytime"))
            print(f"{row} {temperature:g} | {sum(r.detected for r in marked)}/50 | {sizes} | {time.time() - start:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000, int(sys.argv[2]) if len(sys.argv) > 2 else 200)
