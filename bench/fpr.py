"""Measured false-positive rates of every allowed scheme family on unwatermarked text.

Two views per scheme: one key over texts that share no n-grams across texts (real-text windows relabelled per
text; the guarantee the nulls promise) and one key over raw overlapping windows of one corpus (what a single
deployment sees on text that shares n-grams: correlated verdicts). Prints a Markdown table for bench/RESULTS.md.

    python bench/fpr.py --sequences 2000

``--size`` prints instead the size tables of docs/SIZE.md: on null texts, the full-text FPR next to the any-prefix
rate of the paper's E (first crossing) and of the valid size (checkpoint grid, ``mmw.watermark.size``); on synthetic
watermarked text (a model that is uniform over ``support`` random tokens per step: entropy log(support)), the
share detected and median size of each (the power lost to a controlled FPR).

    python bench/fpr.py --size --sequences 2000 --length 200

``--keys K`` prints the one-key FPR spread over K audit keys (``mmw.audit``) on raw real-text windows (texts share
n-grams, as one deployment's texts do) and on independent random texts, for the sum schemes.

    python bench/fpr.py --keys 16 --sequences 2000 --length 200
"""

from __future__ import annotations

import time

import numpy as np
import typer

from mmw.audit import audit_keys, key_spread
from mmw.calibration import (binomial_band, false_positive_rate, generate_synthetic, null_sequences,
                             uniform_subset_model)
from mmw.watermark.detector import Detector
from mmw.watermark.prf import key_from_string, prf_int
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import checkpoint_grid

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
# SynthID-Text's tournament at its deployed setting (m = 30 layers, n-gram 5 = window 4), in both modes.
SCHEMES |= {
    "Tournament m30, window 4, sum": dict(sampler="tournament", layers=30, randomness="window", window=4, score="sum"),
    "Tournament m30 K4, window 4, sum": dict(sampler="tournament", layers=30, leaves=4, randomness="window", window=4,
                                             score="sum"),
    # SynthID's weighted mean score (layer weights 10 -> 1) on the same generations: a detection-only choice.
    "Tournament m30 weighted, window 4, sum": dict(sampler="tournament", layers=30, layer_weights="decreasing",
                                                   randomness="window", window=4, score="sum"),
}


#: Schemes of the size tables: the sum schemes above, align with the default 99 trials (grid thinned to 2
#: checkpoints) and with 249 (the full grid at 200 tokens: alpha / 5 >= 1 / 250).
SIZE_SCHEMES = {name: params for name, params in SCHEMES.items() if params.get("score") == "sum"} | {
    "C1 exponential, fixed 16, align, T=99": dict(sampler="exponential", randomness="fixed", key_length=16,
                                                  score="align", trials=99),
    "C1 exponential, fixed 16, align, T=249": dict(sampler="exponential", randomness="fixed", key_length=16,
                                                   score="align", trials=249),
    "C4 shift, window 1, edit, T=99": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1,
                                           score="edit", psi=0.5, trials=99),
    "C4 shift, window 1, edit, T=249": dict(sampler="distribution_shift", delta=2.0, randomness="window", window=1,
                                            score="edit", psi=0.5, trials=249),
}


def _results(spec: SchemeSpec, key: int, texts: list[np.ndarray], vocab: int):
    """Detect each text; one key per text where randomness is shared across texts (window 0, fixed key), so that
    the verdicts are independent (the guarantee is over keys)."""
    if spec.randomness == "fixed" or spec.window == 0:
        return [Detector(spec, prf_int(key, i), vocab).detect([t])[0] for i, t in enumerate(texts)]
    return Detector(spec, key, vocab).detect(texts)


def _median(sizes: list[int | None]) -> float:
    return float(np.median([np.inf if s is None else s for s in sizes]))


def size_tables(sequences: int, length: int, vocab: int, alpha: float, rows: int, only: str) -> None:
    """Print the null table (full-text FPR, any-prefix rate of E and of the valid size) and the power table for
    the schemes whose name contains ``only``."""
    key = key_from_string("bench-size")
    schemes = {name: params for name, params in SIZE_SCHEMES.items() if only in name}
    lo, hi = binomial_band(sequences, alpha)
    print(f"alpha={alpha}, {sequences} null sequences of {length} tokens (vocabulary {vocab}), 99% binomial band "
          f"[{lo:.4f}, {hi:.4f}]; checkpoints {checkpoint_grid(length, alpha).tolist()}\n")
    print("| scheme | corpus | FPR full text | FPR any prefix (E) | FPR any checkpoint (valid size) | seconds |")
    print("|---|---|---|---|---|---|")
    for name, params in schemes.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for corpus in ("random", "text"):
            t0 = time.perf_counter()
            results = _results(spec, key, null_sequences(corpus, sequences, length, vocab, seed=2), vocab)
            full = np.mean([r.detected for r in results])
            first = np.mean([r.size is not None for r in results])
            valid = np.mean([r.size_valid is not None for r in results])
            print(f"| {name} | {corpus} | {full:.4f} | {first:.4f} | {valid:.4f} | {time.perf_counter() - t0:.1f} |",
                  flush=True)
    print(f"\nPower: {rows} synthetic watermarked texts of {length} tokens per row (model uniform over `support` "
          "random tokens per step).\n")
    print("| scheme | support | detected: full text | detected: E (any prefix) | detected: valid size | median E "
          "| median valid size | median valid / E |")
    print("|---|---|---|---|---|---|---|---|")
    for name, params in schemes.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for support in (2, 4, 16):
            logits = uniform_subset_model(vocab, support=support, rows=rows, seed=support)
            texts = list(generate_synthetic(spec, key, logits, rows=rows, length=length, vocab_size=vocab))
            results = Detector(spec, key, vocab).detect(texts)
            first = [r.size for r in results]
            valid = [r.size_valid for r in results]
            both = [v / f for f, v in zip(first, valid, strict=True) if f is not None and v is not None]
            print(f"| {name} | {support} | {np.mean([r.detected for r in results]):.3f} | "
                  f"{np.mean([f is not None for f in first]):.3f} | {np.mean([v is not None for v in valid]):.3f} | "
                  f"{_median(first):g} | {_median(valid):g} | {np.median(both) if both else float('nan'):.2f} |",
                  flush=True)


def key_table(sequences: int, length: int, vocab: int, alpha: float, keys: int) -> None:
    """Print the spread of the one-key FPR over ``keys`` audit keys per sum scheme and corpus."""
    print(f"alpha={alpha}, {sequences} texts of {length} tokens, {keys} audit keys\n")
    print("| scheme | corpus | one-key FPR min | median | max | keys above the 95% band (band end) |")
    print("|---|---|---|---|---|---|")
    for name, params in SCHEMES.items():
        if params.get("score") != "sum":
            continue
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for corpus, relabel in (("text", False), ("random", True)):
            texts = null_sequences(corpus, sequences, length, vocab, seed=3, relabel=relabel)
            pvalues = np.array([[r.pvalue for r in Detector(spec, k, vocab).detect(texts)]
                                for k in audit_keys(key_from_string("bench-keys"), keys)]).T
            spread = key_spread(pvalues, alpha)
            label = "text (raw windows)" if corpus == "text" else corpus
            print(f"| {name} | {label} | {spread['fpr_key_min']:.4f} | {spread['fpr_key_median']:.4f} | "
                  f"{spread['fpr_key_max']:.4f} | {spread['fpr_keys_above_band']:.2f} "
                  f"({spread['fpr_key_band_high']:.4f}) |", flush=True)


def main(sequences: int = 2000, length: int = 100, vocab: int = 1000, alpha: float = 0.02, size: bool = False,
         rows: int = 200, only: str = "", keys: int = 0) -> None:
    """``--only``: with ``--size``, only the schemes whose name contains this text (e.g. "sum", "edit").
    ``--keys K``: the FPR spread over K audit keys instead."""
    if size:
        size_tables(sequences, length, vocab, alpha, rows, only)
        return
    if keys:
        key_table(sequences, length, vocab, alpha, keys)
        return
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
