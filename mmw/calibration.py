"""Calibration: unwatermarked token corpora, false-positive rates, and synthetic models of known entropy.

Used by the statistical tests and by ``bench/fpr.py`` (which reports the measured rates for every scheme).
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import numpy as np
import torch
from scipy import stats

from mmw.watermark.detector import Detector
from mmw.watermark.prf import prf_int
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

CORPORA = ("random", "text", "repetitive")


@lru_cache(maxsize=1)
def english_bytes() -> np.ndarray:
    """Real English prose as byte tokens (vocab 256): the docstrings of Python's standard library.

    Real text has what random tokens lack — repeated words and n-grams — which is exactly what breaks a sum
    score that does not deduplicate its random draws."""
    import argparse, collections, csv, email, json, logging, pathlib, random, statistics, string, textwrap, \
        unittest  # noqa: E401  (a fixed, version-stable set of documented modules)

    docs = []
    for mod in (argparse, collections, csv, email, json, logging, pathlib, random, statistics, string, textwrap,
                unittest):
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                docs.append(doc)
    return np.frombuffer(" ".join(sorted(set(docs))).encode(), dtype=np.uint8).astype(np.int64)


def null_sequences(kind: str, n: int, length: int, vocab_size: int, seed: int,
                   relabel: bool = True, corpus: np.ndarray | None = None) -> list[np.ndarray]:
    """n unwatermarked token sequences of the given length.

    random: iid uniform ids; text: windows of real English bytes (vocab must be >= 256), or of ``corpus`` (byte
    values 0-255) when given;
    repetitive: a random motif of 2-8 tokens repeated (the worst case for repeated randomness).

    Windows of one corpus overlap, so under one key their verdicts are correlated and a binomial band would not
    apply. ``relabel`` maps each text window through its own random injection of the 256 byte values into the
    vocabulary: the repetitions *within* a text (what the null must survive) are kept exactly, while texts stop
    sharing n-grams — the same independence as giving every text its own key, at batch speed."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return list(rng.integers(0, vocab_size, size=(n, length)))
    if kind == "text":
        corpus = english_bytes() if corpus is None else corpus
        starts = rng.integers(0, len(corpus) - length, size=n)
        windows = [corpus[s: s + length].copy() for s in starts]
        if relabel:
            windows = [rng.permutation(vocab_size)[:256][w] for w in windows]
        return windows
    if kind == "repetitive":
        out = []
        for _ in range(n):
            motif = rng.integers(0, vocab_size, size=rng.integers(2, 9))
            out.append(np.resize(motif, length))
        return out
    raise ValueError(f"unknown corpus {kind!r}; allowed: {', '.join(CORPORA)}")


def false_positive_rate(spec: SchemeSpec, key: int, sequences: list[np.ndarray], vocab_size: int,
                        device: str = "auto", key_per_text: bool = False) -> float:
    """Fraction of unwatermarked sequences whose full-text p-value is <= alpha.

    The guarantee P_key(p <= alpha) <= alpha holds over the key for any fixed text. With one key (the default,
    what one deployment sees, and batched), texts that share n-grams share their random draws, so a corpus's rate
    can scatter more widely around alpha than a binomial; ``key_per_text=True`` gives every text its own key
    (slow: one detector per text) and makes the outcomes independent whatever the texts."""
    if key_per_text:
        results = [Detector(spec, prf_int(key, i), vocab_size, device=device).detect([s])[0]
                   for i, s in enumerate(sequences)]
    else:
        results = Detector(spec, key, vocab_size, device=device).detect(sequences)
    return float(np.mean([r.pvalue <= spec.alpha for r in results]))


def binomial_band(n: int, alpha: float, level: float = 0.99) -> tuple[float, float]:
    """The central ``level`` interval of Binomial(n, alpha) / n."""
    lo, hi = stats.binom.interval(level, n, alpha)
    return lo / n, hi / n


def uniform_subset_model(vocab_size: int, support: int, rows: int, seed: int):
    """A synthetic LM of known entropy log(support): at each step, uniform over a random subset of ``support``
    tokens. Returns ``logits(step) -> float32 [rows, V]``."""
    def logits(step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        chosen = torch.rand(rows, vocab_size, generator=g).topk(support, dim=-1).indices
        out = torch.full((rows, vocab_size), -1e4)
        return out.scatter_(1, chosen, 0.0)
    return logits


def generate_synthetic(spec: SchemeSpec | None, key: int, logits_fn, rows: int, length: int, vocab_size: int,
                       temperature: float = 1.0, seed: int = 0, prompt_len: int = 4) -> np.ndarray:
    """Drive a WatermarkProcessor with a synthetic model; returns the generated ids int64 [rows, length]."""
    proc = WatermarkProcessor(spec, key, vocab_size, [seed * 100_003 + r for r in range(rows)], temperature)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (rows, prompt_len), generator=g)
    for step in range(length):
        chosen = proc(ids, logits_fn(step)).argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, chosen], dim=1)
    return ids[:, prompt_len:].numpy()
