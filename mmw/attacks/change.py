"""How much an attack changed a text, at the word level."""

from __future__ import annotations

import re
from difflib import SequenceMatcher

WORD = re.compile(r"\w+(?:['’]\w+)*")


def word_change_rate(original: str, perturbed: str) -> float:
    """Fraction of ``original``'s words that a word-level diff (difflib) does not match in ``perturbed``.

    Words are runs of word characters with inner apostrophes ("don't"), compared case-sensitively; punctuation is
    ignored. 0 = every word kept in order, 1 = none kept. An original without words gives 0 if the perturbed text
    has none either, else 1.
    """
    a, b = WORD.findall(original), WORD.findall(perturbed)
    if not a:
        return float(bool(b))
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    return 1.0 - sum(block.size for block in matcher.get_matching_blocks()) / len(a)
