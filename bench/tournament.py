"""The tournament sampler (SynthID-Text): false-positive rates of its three sizes on simulated exact-null sequences
and on null texts through the detector. Prints Markdown tables for bench/results/tournament.md.

``--null``: ``--sequences`` sequences of ``--units`` i.i.d. units drawn from the exact null (each unit minus its
count of ones among m fair g-values, m = ``--layers``); per sequence, the per-prefix p-values of the sum score
(``Tournament.pvalue_sum``: Binomial(N m, 1/2)) give the paper's size E (first crossing), the checkpoint size
(``mmw.size.valid_size``) and the anytime size (the e-process of the CPU kernel twin); the table gives the share of
sequences with a full-length detection and with each size (any prefix), with one-sided 95% Clopper-Pearson upper
bounds. Then the same through the detector on ``--texts`` null token texts of ``--length`` tokens per corpus
(random ids, real English windows relabelled per text, repetitive motifs).

    nice -n 15 python bench/tournament.py --null --sequences 20000 --units 200 --texts 3000 --length 200

Real text the generator did not write and real watermarked text reuse the anytime benches, whose scheme list
(bench/fpr.py) holds the tournament's deployed setting in both modes:

    nice -n 15 python bench/anytime_corpus.py --corpus-from-system --texts 3000 --length 200 --only Tournament
    nice -n 15 python bench/anytime_real.py --per-task 8 --tokens 200 --only Tournament
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import typer
from scipy import stats

from mmw.calibration import null_sequences
from mmw.detector import Detector
from mmw.kernels.cpu import run_anytime
from mmw.prf import key_from_string
from mmw.samplers import build_sampler
from mmw.scheme import SchemeSpec
from mmw.size import anytime_bets, anytime_threshold, first_crossing, valid_size

sys.path.insert(0, str(Path(__file__).parent))
from fpr import SCHEMES as FPR_SCHEMES  # noqa: E402  (bench/ is the script's directory)

SCHEMES = {name.removesuffix(", sum"): params for name, params in FPR_SCHEMES.items()
           if params["sampler"] == "tournament"}
BATCH = 1000


def upper95(k: int, n: int) -> float:
    """One-sided 95% Clopper-Pearson upper bound of a binomial proportion k / n."""
    return 1.0 if k == n else float(stats.beta.ppf(0.95, k + 1, n - k))


def _cell(k: int, n: int) -> str:
    return f"{k / n:.4f} ({upper95(k, n):.4f})"


def null_units(layers: int, sequences: int, units: int, alpha: float) -> None:
    spec = SchemeSpec.from_params({"sampler": "tournament", "layers": layers, "randomness": "window", "window": 4,
                                   "score": "sum", "alpha": alpha})
    sampler = build_sampler(spec, 1, 2)
    bets = anytime_bets(spec)
    rng = np.random.default_rng(20261128)
    counts = np.zeros(4, dtype=np.int64)  # full length, E, valid, anytime
    count = np.arange(1, units + 1, dtype=np.int64)
    t0 = time.perf_counter()
    for start in range(0, sequences, BATCH):
        batch = min(BATCH, sequences - start)
        totals = -np.cumsum(rng.binomial(layers, 0.5, size=(batch, units)), axis=1).astype(np.float64)
        offsets = np.arange(0, (batch + 1) * units, units, dtype=np.int64)
        _, sizes = run_anytime(np.ascontiguousarray(totals.ravel()), np.tile(count, batch), offsets, bets,
                               anytime_threshold(alpha))
        counts[3] += int(np.count_nonzero(sizes))
        for total in totals:
            p = sampler.pvalue_sum(total, count)
            counts[0] += bool(p[-1] <= alpha)
            counts[1] += first_crossing(p, alpha) is not None
            counts[2] += valid_size(p, alpha) is not None
    print(f"| exact null, m = {layers} | {sequences} x {units} units | " + " | ".join(_cell(int(k), sequences)
                                                                                       for k in counts)
          + f" | {time.perf_counter() - t0:.0f} |", flush=True)


def null_texts(texts: int, length: int, vocab: int, alpha: float) -> None:
    key = key_from_string("bench-tournament")
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        detector = Detector(spec, key, vocab)
        for corpus in ("random", "text", "repetitive"):
            t0 = time.perf_counter()
            results = detector.detect(null_sequences(corpus, texts, length, vocab, seed=11))
            ks = [sum(r.detected for r in results)] + [sum(getattr(r, a) is not None for r in results)
                                                       for a in ("size", "size_valid", "size_anytime")]
            print(f"| {name}, {corpus} | {texts} x {length} tokens | " + " | ".join(_cell(k, texts) for k in ks)
                  + f" | {time.perf_counter() - t0:.0f} |", flush=True)


def main(null: bool = typer.Option(False, "--null"), sequences: int = 20000, units: int = 200,
         layers: str = "30,1", texts: int = 3000, length: int = 200, vocab: int = 1000,
         alpha: float = 0.02) -> None:
    if null:
        print(f"alpha={alpha}; cells: share of sequences detected (one-sided 95% upper bound)\n")
        print("| null | scale | full length | any prefix: E | any checkpoint: valid size | any prefix: anytime | "
              "seconds |")
        print("|---|---|---|---|---|---|---|")
        for m in (int(v) for v in layers.split(",")):
            null_units(m, sequences, units, alpha)
        null_texts(texts, length, vocab, alpha)


if __name__ == "__main__":
    typer.run(main)
