"""The tournament sampler (SynthID-Text): false-positive rates of its three sizes on simulated exact-null sequences
and on null texts through the detector. Prints Markdown tables for bench/results/tournament.md.

``--null``: ``--sequences`` sequences of ``--units`` i.i.d. units drawn from the exact null (each unit minus its
count of ones among m fair g-values, m = ``--layers``); per sequence, the per-prefix p-values of the sum score
(``Tournament.pvalue_sum``: Binomial(N m, 1/2)) give the paper's size E (first crossing), the checkpoint size
(``mmw.watermark.size.valid_size``) and the anytime size (the e-process of the CPU kernel twin); the table gives the share of
sequences with a full-length detection and with each size (any prefix), with one-sided 95% Clopper-Pearson upper
bounds. Then the same through the detector on ``--texts`` null token texts of ``--length`` tokens per corpus
(random ids, real English windows relabelled per text, repetitive motifs).

    nice -n 15 python bench/tournament.py --null --sequences 20000 --units 200 --texts 3000 --length 200

``--real``: the deployed setting's real watermarked text, generated once per temperature and detected with both
layer weightings (the mean and SynthID's weighted mean score on the same texts):

    nice -n 10 python bench/tournament.py --real --per-task 4 --tokens 200 --temperatures 0.7,1.0

Real text the generator did not write and real watermarked text reuse the anytime benches, whose scheme list
(bench/fpr.py) holds the tournament's deployed setting in both modes and with the weighted score:

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
from mmw.watermark.detector import Detector
from mmw.kernels.cpu import run_anytime
from mmw.watermark.prf import key_from_string
from mmw.watermark.samplers import build_sampler
from mmw.watermark.scheme import SchemeSpec
from mmw.watermark.size import anytime_bets, anytime_threshold, first_crossing, valid_size

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


def null_units(layers: int, sequences: int, units: int, alpha: float, weights: str = "uniform") -> None:
    spec = SchemeSpec.from_params({"sampler": "tournament", "layers": layers, "randomness": "window", "window": 4,
                                   "score": "sum", "alpha": alpha, "layer_weights": weights})
    sampler = build_sampler(spec, 1, 2)
    w = sampler.weights
    bets = anytime_bets(spec)
    rng = np.random.default_rng(20261128)
    counts = np.zeros(4, dtype=np.int64)  # full length, E, valid, anytime
    count = np.arange(1, units + 1, dtype=np.int64)
    t0 = time.perf_counter()
    for start in range(0, sequences, BATCH):
        batch = min(BATCH, sequences - start)
        if weights == "uniform":  # the count of ones directly (the committed rows' draws)
            ones = rng.binomial(layers, 0.5, size=(batch, units))
        else:  # each unit's m fair bits, weighted
            ones = rng.integers(0, 2, size=(batch, units, layers), dtype=np.int8) @ w
        totals = -np.cumsum(ones, axis=1).astype(np.float64)
        offsets = np.arange(0, (batch + 1) * units, units, dtype=np.int64)
        _, sizes = run_anytime(np.ascontiguousarray(totals.ravel()), np.tile(count, batch), offsets, bets,
                               anytime_threshold(alpha))
        counts[3] += int(np.count_nonzero(sizes))
        for total in totals:
            p = sampler.pvalue_sum(total, count)
            counts[0] += bool(p[-1] <= alpha)
            counts[1] += first_crossing(p, alpha) is not None
            counts[2] += valid_size(p, alpha) is not None
    label = f"m = {layers}" + (f", {weights} weights" if weights != "uniform" else "")
    print(f"| exact null, {label} | {sequences} x {units} units | " + " | ".join(_cell(int(k), sequences)
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


HEADER = ("| layer weights | {text} | texts | mean tokens | detected: E / valid / anytime | median E | median valid | "
          "median anytime | texts where weighted is sooner : later (E / valid / anytime) |\n"
          "|---|---|---|---|---|---|---|---|---|")


def real(per_task: int, tokens: int, temperatures: str, batch_size: int, parts: Path, alpha: float,
         out: Path | None) -> None:
    """The deployed setting's real watermarked text (SmolLM2-135M, embedded, CPU), generated once per temperature
    and detected with each layer weighting: the layer weights change only detection, so the rows compare the mean
    and the weighted mean score on the same texts."""
    import datetime

    from mmw.engines.generate import generate
    from mmw.engines.models import load_model
    from mmw.io import write_json
    from mmw.watermark.processor import WatermarkProcessor
    from mmw.stages.common import generator_vocab_size
    from mmw.tasks import build_prompts, render_chat

    tokenizer, model = load_model("embedded:smollm2-135m", "cpu", "float32")
    vocab = generator_vocab_size(tokenizer, model)
    prompts = build_prompts(["book_report", "story", "fake_news"], per_task=per_task)
    chats = render_chat(tokenizer, prompts["prompt"].to_list())
    ids = prompts["prompt_id"].to_list()
    key = key_from_string("bench-anytime-real")  # bench/anytime_real.py's key and seed: its rows' texts
    record = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "alpha": alpha,
              "tokens": tokens, "prompts": len(ids), "rows": []}
    print(f"alpha={alpha}, {len(ids)} prompts x {tokens} new tokens; medians with their 95% order-statistic "
          "intervals, undetected = inf\n")
    print(HEADER.format(text="T"))
    base = SCHEMES["Tournament m30, window 4"]
    for temperature in (float(t) for t in temperatures.split(",")):
        spec = SchemeSpec.from_params({**base, "alpha": alpha})
        t0 = time.perf_counter()
        table = generate(model, tokenizer, chats, lambda s: WatermarkProcessor(spec, key, vocab, s, temperature),
                         tokens, batch_size, prompt_ids=ids, seed=1, parts_dir=parts / f"Tournament-T{temperature:g}",
                         progress=False)
        generated = time.perf_counter() - t0
        texts = [np.asarray(t, dtype=np.int64) for t in table["tokens"].to_list()]
        for row in compare_weights(texts, base, key, vocab, alpha, f"{temperature:g}"):
            record["rows"].append({**row, "temperature": temperature, "generation_seconds": generated})
        if out is not None:
            write_json(record, out)


def compare_weights(texts: list[np.ndarray], base: dict, key: int, vocab: int, alpha: float, label: str) -> list[dict]:
    """Detect the same texts with the mean and the weighted mean score; print one table row per weighting (the
    weighted row counts the texts where it is sooner, per size) and return the rows."""
    from anytime_real import _median_cell, _sizes  # noqa: PLC0415  (bench/ is the script's directory)

    sizes = {}
    for weights in ("uniform", "decreasing"):
        detector = Detector(SchemeSpec.from_params({**base, "alpha": alpha, "layer_weights": weights}), key, vocab,
                            device="cpu")
        results = detector.detect(texts)
        sizes[weights] = {a: [getattr(r, a) for r in results] for a in ("size", "size_valid", "size_anytime")}
    rows = []
    for weights, found in sizes.items():
        detected = " / ".join(f"{np.mean([s is not None for s in v]):.2f}" for v in found.values())
        cells = [_median_cell(v) for v in found.values()]
        sooner = " / ".join(f"{int(np.sum(_sizes(sizes['decreasing'][a]) < _sizes(sizes['uniform'][a])))}:"
                            f"{int(np.sum(_sizes(sizes['decreasing'][a]) > _sizes(sizes['uniform'][a])))}"
                            for a in found) if weights == "decreasing" else ""
        print(f"| {weights} | {label} | {len(texts)} | {np.mean([len(t) for t in texts]):.0f} | {detected} | "
              + " | ".join(c[0] for c in cells) + f" | {sooner} |", flush=True)
        rows.append({"layer_weights": weights, "texts": len(texts), **found,
                     "medians": {a: c[1] for a, c in zip(found, cells)}})
    return rows


def synthetic(supports: str, rows: int, length: int, vocab: int, alpha: float) -> None:
    """The same comparison on synthetic text of known entropy (mmw.calibration's uniform-subset model: uniform over
    ``support`` random tokens per step), the deployed setting (m = 30, window 4, 2 leaves), temperature 1."""
    from mmw.calibration import generate_synthetic, uniform_subset_model

    key = key_from_string("bench-tournament-synthetic")
    base = SCHEMES["Tournament m30, window 4"]
    spec = SchemeSpec.from_params({**base, "alpha": alpha})
    for support in (int(v) for v in supports.split(",")):
        logits = uniform_subset_model(vocab, support=support, rows=rows, seed=support)
        toks = generate_synthetic(spec, key, logits, rows=rows, length=length, vocab_size=vocab)
        compare_weights(list(toks), base, key, vocab, alpha, f"entropy log {support}")


def main(null: bool = typer.Option(False, "--null"), sequences: int = 20000, units: int = 200,
         layers: str = "30,1", layer_weights: str = "uniform", texts: int = 3000, length: int = 200,
         vocab: int = 1000, alpha: float = 0.02, real_text: bool = typer.Option(False, "--real"), per_task: int = 4,
         tokens: int = 200, temperatures: str = "0.7,1.0", batch_size: int = 12,
         parts: Path = Path("/tmp/mmw-tournament-real"), out: Path | None = None,
         synthetic_supports: str = typer.Option("", "--synthetic"), rows: int = 512) -> None:
    """``--null``: the null tables (``--layer-weights uniform,decreasing`` adds the weighted score's exact-null
    rows); ``--real``: the mean and the weighted mean score on the same real watermarked texts; ``--synthetic
    2,4,16``: the same on ``--rows`` synthetic texts of ``--length`` tokens per entropy log(support)."""
    if null:
        print(f"alpha={alpha}; cells: share of sequences detected (one-sided 95% upper bound)\n")
        print("| null | scale | full length | any prefix: E | any checkpoint: valid size | any prefix: anytime | "
              "seconds |")
        print("|---|---|---|---|---|---|---|")
        for weights in layer_weights.split(","):
            for m in (int(v) for v in layers.split(",")):
                null_units(m, sequences, units, alpha, weights)
        if texts:
            null_texts(texts, length, vocab, alpha)
    if real_text:
        real(per_task, tokens, temperatures, batch_size, parts, alpha, out)
    if synthetic_supports:
        print(f"alpha={alpha}; medians with their 95% order-statistic intervals, undetected = inf\n")
        print(HEADER.format(text="synthetic text"))
        synthetic(synthetic_supports, rows, length, vocab, alpha)


if __name__ == "__main__":
    typer.run(main)
