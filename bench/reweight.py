"""SelfHash and DiPmark reweighting, measured: false-positive rates of the three sizes on exact-null and real
null text, and power on real watermarked text from the embedded generator. Prints Markdown tables for
bench/results/reweight.md; ``--out`` keeps a JSON record (rewritten after each row).

``null``: per scheme, ``--sequences`` i.i.d. uniform token sequences (every deduplicated unit's statistic then
follows the exact null) and ``--texts`` repetitive-motif sequences (``mmw.calibration.null_sequences``), one key;
then ``--texts`` windows of real text the generator did not write (bench/anytime_corpus.py's corpus of this
machine's man pages and licences, or with ``--kinds tasks`` the repository's task data, SmolLM2's tokenizer), one
key per window (``--keys-per-window`` K: K fresh keys each; ``--sequences 0`` skips the simulated rows). Cells:
the share of texts detected on the full text, at any prefix by E (first crossing), at any checkpoint
(``size_valid``) and at any prefix by the anytime size, with one-sided 95% Clopper-Pearson upper bounds.

    nice -n 15 python bench/reweight.py null --sequences 20000 --texts 3000 --length 200 --out bench/results/reweight_null.json

``prompts`` tokenizes bench/anytime_real.py's prompts (``--per-task`` x 3 tasks) for bench/reweight_generate.py,
which has SmolLM2-135M (the embedded GGUF) write ``--tokens`` tokens per prompt, scheme and temperature; ``power``
then gives the medians of E, checkpoint and anytime sizes on the same texts, with distribution-free 95% intervals
(undetected = inf).

    python bench/reweight.py prompts /tmp/prompts.json --per-task 8
    python bench/reweight_generate.py --prompts /tmp/prompts.json --gguf .../SmolLM2-135M-Instruct.Q4_1.gguf \
        --device cuda --out /tmp/generations.json
    python bench/reweight.py power /tmp/generations.json --out bench/results/reweight_power.json
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import typer

from mmw.calibration import null_sequences
from mmw.watermark.detector import Detector
from mmw.io import write_json
from mmw.watermark.prf import key_from_string
from mmw.watermark.scheme import SchemeSpec

from anytime_corpus import MODEL, build_kind, fail, null_row, upper95  # noqa: E402  (bench/ is the script's directory)
from reweight_generate import KEY as POWER_KEY, SCHEMES  # noqa: E402
SIZES = (("full text", lambda r: r.detected), ("any prefix: E", lambda r: r.size is not None),
         ("any checkpoint: valid", lambda r: r.size_valid is not None),
         ("any prefix: anytime", lambda r: r.size_anytime is not None))
app = typer.Typer(add_completion=False)


def _record(out: Path | None, record: dict) -> None:
    if out is not None:
        write_json(record, out)


def _cells(results) -> list[dict]:
    n = len(results)
    return [{"size": name, "count": (k := int(sum(bool(hit(r)) for r in results))), "rate": k / n,
             "upper95": upper95(k, n)} for name, hit in SIZES]


@app.command()
def null(sequences: int = 20000, texts: int = 3000, length: int = 200, vocab: int = 1000, alpha: float = 0.02,
         kinds: str = "man,licences", seed: int = 20261127, keys_per_window: int = 1,
         out: Path | None = None) -> None:
    from mmw.engines.models import load_tokenizer
    from mmw.stages.common import generator_vocab_size

    if keys_per_window < 1:
        fail(f"--keys-per-window: {keys_per_window} keys cannot detect a window; allowed: an integer >= 1")
    record = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "alpha": alpha,
              "length": length, "rows": []}
    key = key_from_string("bench-reweight-null")
    print(f"alpha={alpha}; {length}-token sequences; cells: rate (one-sided 95% upper bound)\n")
    print("| scheme | null text | texts | " + " | ".join(name for name, _ in SIZES) + " | seconds |")
    print("|---|---|---|" + "---|" * len(SIZES) + "---|")

    def row(name: str, corpus: str, results: list, seconds: float) -> None:
        cells = _cells(results)
        record["rows"].append({"scheme": name, "corpus": corpus, "n": len(results), "cells": cells,
                               "seconds": seconds})
        print(f"| {name} | {corpus} | {len(results)} | " + " | ".join(
            f"{c['rate']:.4f} ({c['upper95']:.4f})" for c in cells) + f" | {seconds:.0f} |", flush=True)
        _record(out, record)

    # --sequences 0: the real-text rows alone (the simulated ones are recorded already).
    simulated = {} if sequences == 0 else {
        "i.i.d. uniform ids (exact null)": null_sequences("random", sequences, length, vocab, seed=21),
        "repetitive motifs": null_sequences("repetitive", texts, length, vocab, seed=22)}
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        detector = Detector(spec, key, vocab, device="cpu")
        for corpus, seqs in simulated.items():
            t0 = time.perf_counter()
            results = [r for start in range(0, len(seqs), 2000) for r in detector.detect(seqs[start:start + 2000])]
            row(name, corpus, results, time.perf_counter() - t0)
    tokenizer, config = load_tokenizer(MODEL)
    tokenizer.model_max_length = sys.maxsize
    real_vocab = generator_vocab_size(tokenizer, config)
    corpora = {kind: [np.asarray(w) for w in build_kind(kind, tokenizer, texts, length, 8, seed)[0]]
               for kind in kinds.split(",")}
    for name, params in SCHEMES.items():
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for kind, windows in corpora.items():
            t0 = time.perf_counter()
            counts = null_row(spec, key, windows, real_vocab, keys_per_window)
            results_cells = [{"size": s, **counts[k]} for (s, _), k in zip(SIZES, ("full_text", "E", "valid",
                                                                                  "anytime"))]
            record["rows"].append({"scheme": name, "corpus": f"real: {kind}", "n": counts["n"],
                                   "cells": results_cells, "seconds": time.perf_counter() - t0})
            print(f"| {name} | real: {kind} ({keys_per_window} key(s) per window) | {counts['n']} | " + " | ".join(
                f"{c['rate']:.4f} ({c['upper95']:.4f})" for c in results_cells)
                + f" | {time.perf_counter() - t0:.0f} |", flush=True)
            _record(out, record)


@app.command()
def prompts(out: Path, per_task: int = 8) -> None:
    """The power table's prompts (bench/anytime_real.py's tasks), rendered with the chat template and tokenized as
    ``mmw.engines.generate`` tokenizes them, with the row seeds of seed 1: the input of bench/reweight_generate.py."""
    from mmw.engines.generate import eos_token_ids, row_seed
    from mmw.engines.models import load_model
    from mmw.stages.common import generator_vocab_size
    from mmw.tasks import build_prompts, render_chat

    tokenizer, model = load_model(MODEL, "cpu", "float32")
    table = build_prompts(["book_report", "story", "fake_news"], per_task=per_task)
    chats = render_chat(tokenizer, table["prompt"].to_list())
    ids = [tokenizer(chat, add_special_tokens=False)["input_ids"] for chat in chats]
    write_json({"input_ids": ids, "row_seeds": [row_seed(1, p) for p in table["prompt_id"].to_list()],
                "vocab": generator_vocab_size(tokenizer, model), "pad_token_id": tokenizer.pad_token_id,
                "eos_token_ids": eos_token_ids(tokenizer, model)}, out)


@app.command()
def power(generations: Path, vocab: int = 49152, alpha: float = 0.02, out: Path | None = None) -> None:
    """Median E, checkpoint and anytime sizes of bench/reweight_generate.py's generations (same texts per size)."""
    from anytime_real import _median_cell  # noqa: E402

    record = json.loads(generations.read_text())
    summary = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "alpha": alpha,
               "generated_on": record["device"], "tokens": record["tokens"], "rows": []}
    print(f"alpha={alpha}; SmolLM2-135M-Instruct (embedded GGUF) generations of up to {record['tokens']} tokens "
          f"({record['device']}); medians with their 95% order-statistic intervals, undetected = inf\n")
    print("| scheme | T | texts | mean tokens | detected: E / valid / anytime | median E | median valid | "
          "median anytime |")
    print("|---|---|---|---|---|---|---|---|")
    for row in record["rows"]:
        spec = SchemeSpec.from_params({**SCHEMES[row["scheme"]], "alpha": alpha})
        texts = [np.asarray(t, dtype=np.int64) for t in row["tokens"]]
        marked = Detector(spec, POWER_KEY, vocab, device="cpu").detect(texts)
        sizes = {a: [getattr(r, a) for r in marked] for a in ("size", "size_valid", "size_anytime")}
        detected = " / ".join(f"{np.mean([s is not None for s in v]):.2f}" for v in sizes.values())
        cells = [_median_cell(v) for v in sizes.values()]
        mean_tokens = float(np.mean([len(t) for t in texts]))
        print(f"| {row['scheme']} | {row['temperature']:g} | {len(texts)} | {mean_tokens:.0f} | {detected} | "
              + " | ".join(c[0] for c in cells) + " |", flush=True)
        summary["rows"].append({"scheme": row["scheme"], "temperature": row["temperature"], "texts": len(texts),
                                "mean_tokens": mean_tokens, **sizes, "median_E": cells[0][1],
                                "median_valid": cells[1][1], "median_anytime": cells[2][1]})
        _record(out, summary)


if __name__ == "__main__":
    app()
