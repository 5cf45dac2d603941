"""Calibration and power of the bound behind "not confirmed (undetected)" (mmw.sweep.claims.detection_upper_bound).

A pick is called undetected when the upper bound on its pooled detected share lies below 1/2. Simulated cells as
the confirmation sees them: 48 prompts x K = 5 runs; each prompt has its own detection probability (Beta-spread
around the cell's share: low-entropy prompts are hard for every key), and a prompt's K texts share it. Reported:
the share of cells called undetected at true shares 0.5 (the edge: any call is an error), 0.4, 0.3, 0.2, at the
per-try level 0.025 and the cell level 0.05, with Clopper-Pearson 95 % intervals; beside it, the Clopper-Pearson
bound on the 240 texts as if independent (what treating texts as trials would give).

    .venv/bin/python bench/detection_bound.py [--cells 4000] [--out bench/results/detection_bound.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
from pathlib import Path

import numpy as np
from scipy.stats import beta, binomtest

from mmw.io import write_text
from mmw.sweep.claims import detection_upper_bound

PROMPTS, K = 48, 5


def _cpu() -> str:
    """The CPU's model name (Linux), else the platform's machine."""
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def shares(rng: np.random.Generator, mean: float, cells: int) -> np.ndarray:
    p = rng.beta(2 * mean / (1 - mean), 2.0, (cells, PROMPTS))
    return rng.binomial(K, p) / K


def texts_clopper_pearson(detected: np.ndarray, alpha: float) -> np.ndarray:
    """Upper Clopper-Pearson bound over the K x n texts counted as independent trials."""
    n = PROMPTS * K
    x = np.rint(detected * K).sum(axis=1)
    return np.where(x >= n, 1.0, beta.ppf(1 - alpha, x + 1, n - x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/detection_bound.md"))
    args = parser.parse_args()
    rng = np.random.default_rng(2026)
    lines = [f"# The undetected call: calibration and power ({dt.date.today()}, {_cpu()}"
             f", {args.cells} simulated cells per row, {PROMPTS} prompts x K = {K})", "",
             "| true detected share | level | called undetected (prompt bound) [95 % CI] | "
             "texts as independent trials (Clopper-Pearson) |", "|---|---|---|---|"]
    for mean in (0.5, 0.4, 0.3, 0.2):
        cells = shares(rng, mean, args.cells)
        for alpha in (0.025, 0.05):
            ours = sum(detection_upper_bound(row, alpha) < 0.5 for row in cells)
            naive = int((texts_clopper_pearson(cells, alpha) < 0.5).sum())
            ci = binomtest(ours, args.cells).proportion_ci()
            lines.append(f"| {mean} | {alpha} | {ours / args.cells:.4f} [{ci.low:.4f}, {ci.high:.4f}] | "
                         f"{naive / args.cells:.4f} |")
    lines += ["", "At a true share of 0.5 every call is an error: it must stay at or below the level. The texts of a "
              "prompt share its detection probability, so counting texts as independent trials overstates the "
              "evidence (its error at 0.5 is above the level); the bound over prompts holds for any per-prompt "
              "distribution (Chernoff-Hoeffding, mmw/sweep/claims.py)."]
    write_text("\n".join(lines) + "\n", args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
