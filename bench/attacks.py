"""Cost and strength of the model-free attacks on the sample text; prints a Markdown table.

    python bench/attacks.py [--seeds 5] [--text tests/data/sample_en.txt]

Columns: ``load s`` = first call on a short text in this process (loads data: WordNet, tagger, lexicons);
``s / 1k words`` = median over seeds of a call on the sample with a fresh instance (so per-word caches are
cold; process-wide data already loaded); ``word change`` = mean fraction of the input's words that are not
matched in the output by a word-level diff (difflib); ``letter change`` = mean fraction of ASCII letters
changed where the output keeps the input's length (typo, lowercase), else "-".
"""

from __future__ import annotations

import argparse
import difflib
import re
import statistics
import time
from pathlib import Path

from mmw.attacks import build_attack

WORD = re.compile(r"\w+(?:['’]\w+)*")
SPECS = [
    {"name": "swap", "p": 0.05}, {"name": "swap", "p": 0.1}, {"name": "swap", "p": 0.5},
    {"name": "lowercase"}, {"name": "contraction"}, {"name": "expansion"},
    {"name": "misspelling", "p": 0.25}, {"name": "misspelling", "p": 0.5},
    {"name": "typo", "p": 0.05}, {"name": "typo", "p": 0.1},
    {"name": "synonym", "p": 0.25}, {"name": "synonym", "p": 0.5}, {"name": "synonym", "p": 1.0},
]


def word_change(before: str, after: str) -> float:
    """Fraction of ``before``'s words not matched in ``after`` (longest matching blocks, word level)."""
    a, b = WORD.findall(before), WORD.findall(after)
    matched = sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    return 1 - matched / len(a)


def letter_change(before: str, after: str) -> float | None:
    if len(before) != len(after):
        return None
    letters = [(x, y) for x, y in zip(before, after, strict=True) if x.isascii() and x.isalpha()]
    return sum(x != y for x, y in letters) / len(letters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--text", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/sample_en.txt")
    args = parser.parse_args()
    text = args.text.read_text(encoding="utf-8")
    n_words = len(WORD.findall(text))
    print(f"text: {args.text.name}, {n_words} words; {args.seeds} seeds\n")
    print("| attack | in R | load s | s / 1k words | word change | letter change |")
    print("|---|---|---|---|---|---|")
    for spec in SPECS:
        start = time.perf_counter()
        build_attack(spec)("A short warm-up sentence, it isn't long.", 0)
        load = time.perf_counter() - start
        seconds, words_changed, letters_changed = [], [], []
        for seed in range(args.seeds):
            attack = build_attack(spec)
            start = time.perf_counter()
            out = attack(text, seed)
            seconds.append(time.perf_counter() - start)
            words_changed.append(word_change(text, out))
            letters_changed.append(letter_change(text, out))
        letters = "-" if None in letters_changed else f"{statistics.mean(letters_changed):.3f}"
        print(f"| {attack.name} | {attack.in_R} | {load:.2f} | {1000 * statistics.median(seconds) / n_words:.4f} "
              f"| {statistics.mean(words_changed):.3f} | {letters} |")


if __name__ == "__main__":
    main()
