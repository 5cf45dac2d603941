"""The anytime size (mixture e-process, ``mmw.watermark.size``): validity, power by betting grid, speed. Prints Markdown
tables for bench/RESULTS.md.

``--validity``: any-prefix false-positive rate of the e-process on ``--sequences`` simulated sequences of ``--units``
i.i.d. units drawn from each scheme's exact null (-Exp(1), +Exp(1), -Bernoulli(gamma)); then, through the detector
(deduplicated units of real token sequences), E / checkpoint size / anytime size side by side on ``--texts`` null
texts of ``--length`` tokens per corpus (random ids, real English windows, repetitive motifs).

    python bench/anytime.py --validity --sequences 20000 --units 1024 --texts 3000 --length 200

``--power``: median sizes on synthetic watermarked text (a model uniform over ``support`` random tokens per step:
entropy log(support)) for the chosen grid and alternatives (the trade-off of a betting strategy).

    python bench/anytime.py --power --rows 200 --length 200

``--speed``: seconds per text at ``--length`` tokens of the e-process (CPU numba twin) against today's per-prefix
p-value computation (the sampler's exact null over every prefix), both from the same running sums.

    python bench/anytime.py --speed --length 1024 --rows 256 [--device cuda]
"""

from __future__ import annotations

import time

import numpy as np
import typer

from mmw.calibration import binomial_band, generate_synthetic, null_sequences, uniform_subset_model
from mmw.watermark.detector import Detector
from mmw.watermark.prf import key_from_string
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import ANYTIME_GRID, anytime_bets, anytime_log_evalues, anytime_size, anytime_threshold

from fpr import SCHEMES as FPR_SCHEMES, _median, _results  # noqa: E402  (bench/ is the script's directory)

#: The sum schemes of bench/fpr.py (the others have no e-process).
SCHEMES = {name.removesuffix(", sum"): params for name, params in FPR_SCHEMES.items() if params["score"] == "sum"}
#: Betting strategies compared by --power (grids of signal strengths rho; one point = a single fixed bet).
GRIDS = {"chosen " + str(ANYTIME_GRID): ANYTIME_GRID, "3 points (0.2, 0.5, 0.8)": (0.2, 0.5, 0.8),
         "7 points (0.05 .. 0.9)": (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9), "one bet 0.3": (0.3,),
         "one bet 0.6": (0.6,)}


def _null_units(sampler: str, gamma: float, rng: np.random.Generator, n: int, units: int) -> np.ndarray:
    """Running sums of ``units`` i.i.d. null unit statistics, n sequences -> float64 [n, units]."""
    if sampler == "distribution_shift":
        return -np.cumsum(rng.random((n, units)) < gamma, axis=1).astype(np.float64)
    return np.cumsum(rng.exponential(size=(n, units)), axis=1) * (1.0 if sampler == "binary" else -1.0)


def validity(sequences: int, units: int, texts: int, length: int, vocab: int, alpha: float) -> None:
    from mmw.kernels.cpu import run_anytime

    lo, hi = binomial_band(sequences, alpha)
    print(f"alpha={alpha}. Exact null: {sequences} sequences of {units} i.i.d. units per scheme (99% binomial band "
          f"of alpha [{lo:.4f}, {hi:.4f}]).\n")
    print("| pivot (schemes) | sequences | any-prefix FPR (anytime) | 99% upper bound | seconds |")
    print("|---|---|---|---|---|")
    from scipy import stats

    pivots = {"-Exp(1), large when marked (C1, C2)": "exponential", "+Exp(1), small when marked (C3)": "binary",
              "Bernoulli(0.5) greens (C4, gamma 0.5)": "distribution_shift"}
    for label, sampler in pivots.items():
        t0 = time.perf_counter()
        spec = SchemeSpec.from_params({"sampler": sampler, "randomness": "window", "window": 1, "score": "sum",
                                       "alpha": alpha, **({"delta": 2.0} if sampler == "distribution_shift" else {})})
        bets = anytime_bets(spec)
        rng = np.random.default_rng(len(label))
        crossed = 0
        count = np.tile(np.arange(1, units + 1, dtype=np.int64), 1000)
        offsets = np.arange(0, 1001 * units, units, dtype=np.int64)
        for start in range(0, sequences, 1000):
            batch = min(1000, sequences - start)
            totals = _null_units(sampler, spec.gamma, rng, batch, units)
            _, sizes = run_anytime(np.ascontiguousarray(totals.ravel()), count[: batch * units], offsets[: batch + 1],
                                   bets, anytime_threshold(alpha))
            crossed += int(np.count_nonzero(sizes))
        upper = stats.beta.ppf(0.995, crossed + 1, sequences - crossed)
        print(f"| {label} | {sequences} | {crossed / sequences:.4f} | {upper:.4f} | {time.perf_counter() - t0:.1f} |",
              flush=True)
    key = key_from_string("bench-anytime")
    lo, hi = binomial_band(texts, alpha)
    print(f"\nThrough the detector: {texts} null texts of {length} tokens per row (vocabulary {vocab}; real English "
          f"windows relabelled per text; one key per text for window 0), 99% band [{lo:.4f}, {hi:.4f}].\n")
    print("| scheme | corpus | FPR full text | any prefix: E | any checkpoint: valid size | any prefix: anytime |")
    print("|---|---|---|---|---|---|")
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for corpus in ("random", "text", "repetitive"):
            results = _results(spec, key, null_sequences(corpus, texts, length, vocab, seed=11), vocab)
            cells = [np.mean([r.detected for r in results])] + [
                np.mean([getattr(r, a) is not None for r in results]) for a in ("size", "size_valid", "size_anytime")]
            print(f"| {name} | {corpus} | " + " | ".join(f"{c:.4f}" for c in cells) + " |", flush=True)


def power(rows: int, length: int, vocab: int, alpha: float) -> None:
    key = key_from_string("bench-anytime-power")
    print(f"alpha={alpha}; {rows} synthetic watermarked texts of {length} tokens per row (model uniform over "
          "`support` random tokens per step). Cells: median size (share undetected).\n")
    print("| scheme | support | E | valid size | " + " | ".join(f"anytime, {g}" for g in GRIDS) + " |")
    print("|---|---|---|---|" + "---|" * len(GRIDS))
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        detector = Detector(spec, key, vocab)
        for support in (2, 4, 16):
            tokens = list(generate_synthetic(spec, key, uniform_subset_model(vocab, support, rows, support), rows,
                                             length, vocab))
            results = detector.detect(tokens)
            sums = detector.backend.sum_prefix_batch(tokens)
            cells = [f"{_median([r.size for r in results]):g}", f"{_median([r.size_valid for r in results]):g} "
                     f"({np.mean([r.size_valid is None for r in results]):.2f})"]
            for grid in GRIDS.values():
                bets = anytime_bets(spec, grid)
                sizes = [anytime_size(anytime_log_evalues(t, c, bets), alpha) for t, c in sums]
                cells.append(f"{_median(sizes):g} ({np.mean([s is None for s in sizes]):.2f})")
            print(f"| {name} | {support} | " + " | ".join(cells) + " |", flush=True)


def speed(rows: int, length: int, vocab: int, alpha: float, repeats: int, device: str) -> None:
    """Both computations start from the same running sums (the sum kernel's output, shared by both). On
    ``--device cuda`` the GPU twin's e-values are also compared with the CPU twin's on the same sums."""
    key = key_from_string("bench-anytime-speed")
    print(f"{rows} texts of {length} tokens, numba {device} twin (after one warm-up call); best of {repeats}.\n")
    print("| scheme | per-prefix p-values (ms / text) | e-process + anytime size (ms / text) | ratio | "
          "GPU vs CPU twin: max relative difference of log e-values, sizes equal |")
    print("|---|---|---|---|---|")
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        detector = Detector(spec, key, vocab, device=device)
        marked = list(generate_synthetic(spec, key, uniform_subset_model(vocab, 4, 32, 4), 32, length, vocab))
        texts = null_sequences("random", rows // 2, length, vocab, seed=5) + [
            marked[i % len(marked)] for i in range(rows - rows // 2)]  # half null, half watermarked (they cross)
        sums = detector.backend.sum_prefix_batch(texts)
        threshold = anytime_threshold(alpha)
        detector.backend.anytime_batch(sums[:2], detector.bets, threshold)
        best_p = best_e = np.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            for total, count in sums:
                detector.sampler.pvalue_sum(total, count)
            best_p = min(best_p, time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = detector.backend.anytime_batch(sums, detector.bets, threshold)
            best_e = min(best_e, time.perf_counter() - t0)
        check = ""
        if device == "cuda":
            cpu = Detector(spec, key, vocab, device="cpu").backend.anytime_batch(sums, detector.bets, threshold)
            diff = max(float(np.max(np.abs(g[0] - c[0]) / np.maximum(np.abs(c[0]), 1e-300), initial=0.0))
                       for g, c in zip(out, cpu, strict=True))
            check = f"{diff:.1e}, {all(g[1] == c[1] for g, c in zip(out, cpu, strict=True))}"
        print(f"| {name} | {1e3 * best_p / rows:.3f} | {1e3 * best_e / rows:.3f} | {best_e / best_p:.2f} | {check} |",
              flush=True)


def main(validity_: bool = typer.Option(False, "--validity"), power_: bool = typer.Option(False, "--power"),
         speed_: bool = typer.Option(False, "--speed"), sequences: int = 20000, units: int = 1024,
         texts: int = 3000, length: int = 200, rows: int = 200, vocab: int = 1000, alpha: float = 0.02,
         repeats: int = 5, device: str = "cpu") -> None:
    if validity_:
        validity(sequences, units, texts, length, vocab, alpha)
    if power_:
        power(rows, length, vocab, alpha)
    if speed_:
        speed(rows, length, vocab, alpha, repeats, device)


if __name__ == "__main__":
    typer.run(main)
