"""Measured false-positive rates of every allowed scheme family on unwatermarked text.

Two views per scheme: one key over texts that share no n-grams across texts (real-text windows relabelled per
text; the guarantee the nulls promise) and one key over raw overlapping windows of one corpus (what a single
deployment sees on text that shares n-grams: correlated verdicts). Prints a Markdown table for bench/RESULTS.md.

    python bench/fpr.py --sequences 2000
"""

from __future__ import annotations

import time

import numpy as np
import typer

from mmw.calibration import binomial_band, false_positive_rate, null_sequences
from mmw.prf import key_from_string
from mmw.scheme import SchemeSpec

SCHEMES = {
    "C4 shift, window 1, sum": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1, score="sum"),
    "C4 shift, minhash 3, sum": dict(sampler="distribution_shift", delta=2.0, randomness="minhash", window=3, score="sum"),
    "C4 shift, window 0, sum": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=0, score="sum"),
    "C1 exponential, window 3, sum": dict(sampler="exponential", randomness="window", window=3, score="sum"),
    "C2 inverse, window 1, sum": dict(sampler="inverse_transform", randomness="window", window=1, score="sum"),
    "C3 binary, window 1, sum": dict(sampler="binary", randomness="window", window=1, score="sum"),
    "C1 exponential, fixed 16, align": dict(sampler="exponential", randomness="fixed", key_length=16, score="align",
                                            trials=99),
    "C4 shift, fixed 4, edit": dict(sampler="distribution_shift", delta=2.0, randomness="fixed", key_length=4,
                                    score="edit", psi=0.5, trials=99),
}


def main(sequences: int = 2000, length: int = 100, vocab: int = 1000, alpha: float = 0.02) -> None:
    key = key_from_string("bench-fpr")
    lo, hi = binomial_band(sequences, alpha)
    print(f"alpha={alpha}, {sequences} sequences of {length} tokens, 99% binomial band [{lo:.4f}, {hi:.4f}]\n")
    print("| scheme | corpus | FPR (independent texts) | FPR (raw shared n-grams) | seconds |")
    print("|---|---|---|---|---|")
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for corpus in ("random", "text", "repetitive"):
            t0 = time.perf_counter()
            over_keys = false_positive_rate(spec, key, null_sequences(corpus, sequences, length, vocab, seed=1), vocab)
            raw = null_sequences(corpus, sequences, length, vocab, seed=1, relabel=False)
            fixed = false_positive_rate(spec, key, raw, vocab) if corpus == "text" else float("nan")
            print(f"| {name} | {corpus} | {over_keys:.4f} | {fixed:.4f} | {time.perf_counter() - t0:.1f} |",
                  flush=True)


if __name__ == "__main__":
    typer.run(main)
