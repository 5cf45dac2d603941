"""Model-free perturbations of the paper's Table "Perturbations": swap, lowercase, contraction, expansion,
misspelling and typo (the last four follow HELM's perturbations; see each class).

Words are maximal runs of word characters, with internal apostrophes kept (``don't`` is one word); everything
between two words (spaces, punctuation, newlines) is a *gap* and is kept as it is unless a word is removed.
"""

from __future__ import annotations

import json
import re
from functools import cache, cached_property
from pathlib import Path

import numpy as np

from mmw.attacks.base import Attack, RateAttack

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "attacks"
WORD_RE = re.compile(r"\w+(?:['’]\w+)*")
SENTENCE_BREAK_RE = re.compile(r"[.!?\n]")
# "'s" / "'d" followed by "been" can only be "has" / "had" ("she's been", "I'd been").
PERFECT_BEFORE_BEEN = {"is": "has", "would": "had"}


def split_words(text: str) -> tuple[list[str], list[str]]:
    """Split ``text`` into words and gaps: ``text == gaps[0] + words[0] + gaps[1] + ... + words[-1] + gaps[-1]``.

    Returns (words, gaps) with ``len(gaps) == len(words) + 1``.
    """
    words, gaps, end = [], [], 0
    for match in WORD_RE.finditer(text):
        gaps.append(text[end:match.start()])
        words.append(match.group())
        end = match.end()
    gaps.append(text[end:])
    return words, gaps


def match_case(source: str, target: str) -> str:
    """``target`` with the capitalisation pattern of ``source``: lower, UPPER or Capitalised."""
    if source.islower():
        return target.lower()
    if source.isupper() and len(source) > 1:
        return target.upper()
    if source[:1].isupper():
        return target[:1].upper() + target[1:]
    return target


def _join_gaps(left: str, right: str, at_start: bool) -> str:
    """The gap that replaces ``left + <removed word> + right``: one separator, punctuation and newlines kept."""
    if at_start:
        return left + right.lstrip()
    if right[:1] in (" ", "\t"):
        return left + right.lstrip(" \t")
    return left.rstrip(" \t") + right  # "The cat, sat" minus "cat" -> "The, sat"


class Swap(RateAttack):
    """Scan the text word by word; with probability p remove the word, duplicate it, or swap it with another
    randomly chosen word of its sentence (the three equally likely), as in the paper.

    Operations act on word identities: a removed or duplicated word is removed/duplicated wherever earlier
    swaps moved it, so exactly the chosen words disappear or appear twice. A one-word sentence has no swap
    partner; its swap is a no-op. Sentences end at ``.``, ``!``, ``?`` or a newline.
    """

    family = "swap"
    REMOVE, DUPLICATE, SWAP = 0, 1, 2

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        words, gaps = split_words(text)
        n = len(words)
        selected = rng.random(n) < self.p
        operation = rng.integers(0, 3, n)
        partner_draw = rng.random(n)
        # arrangement[k] = index of the word now at position k
        arrangement = list(range(n))
        where_is = list(range(n))
        for start, stop in self._sentences(gaps):
            size = stop - start
            for i in range(start, stop):
                if not (selected[i] and operation[i] == self.SWAP and size > 1):
                    continue
                own = where_is[i]
                other = start + int(partner_draw[i] * (size - 1))  # uniform over the other positions
                other += other >= own
                j = arrangement[other]
                arrangement[own], arrangement[other] = j, i
                where_is[i], where_is[j] = other, own
        pieces, gap = [], gaps[0]
        for k in range(n):
            i = arrangement[k]
            if selected[i] and operation[i] == self.REMOVE:
                gap = _join_gaps(gap, gaps[k + 1], at_start=not pieces)
                continue
            word = f"{words[i]} {words[i]}" if selected[i] and operation[i] == self.DUPLICATE else words[i]
            pieces += [gap, word]
            gap = gaps[k + 1]
        pieces.append(gap)
        return "".join(pieces)

    @staticmethod
    def _sentences(gaps: list[str]) -> list[tuple[int, int]]:
        """Word index ranges [start, stop) of the sentences, given the gaps between words."""
        bounds, start = [], 0
        for k in range(1, len(gaps) - 1):  # gaps[k] separates word k-1 from word k
            if SENTENCE_BREAK_RE.search(gaps[k]):
                bounds.append((start, k))
                start = k
        if len(gaps) > 1:
            bounds.append((start, len(gaps) - 1))
        return bounds


class Lowercase(Attack):
    """Convert the whole text to lower case (HELM's LowerCasePerturbation)."""

    family = "lowercase"

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        return text.lower()


@cache
def _contraction_map() -> tuple[dict[str, str], frozenset[str]]:
    """(lower-cased contraction -> expansion, contractions the contraction attack must not produce)."""
    data = json.loads((DATA_DIR / "contractions.json").read_text(encoding="utf-8"))
    return ({k.lower(): v.lower() for k, v in data["contractions"].items()},
            frozenset(k.lower() for k in data["expand_only"]))


def _phrase_regex(phrase: str) -> str:
    """Regex for a phrase: any run of spaces/tabs between words, either apostrophe."""
    return re.escape(phrase).replace(r"\ ", r"[ \t]+").replace("'", "['’]")


class Contraction(Attack):
    """Contract verbs: "do not" -> "don't", "I am" -> "I'm" (HELM's ContractionPerturbation).

    Like HELM, an expansion is contracted only when a space follows it, so clause-final phrases ("I know
    who you are.", "that is,") stay expanded. Before "not", the negation is contracted rather than the
    pronoun ("we will not" -> "we won't", not "we'll not"; but "I am not" -> "I'm not"). Case is preserved
    ("Do not" -> "Don't"); the apostrophe is ASCII.
    """

    family = "contraction"

    @cached_property
    def _to_contracted(self) -> dict[str, str]:
        expansions, expand_only = _contraction_map()
        return {v: k for k, v in expansions.items() if k not in expand_only}

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        alternatives = []
        for phrase in sorted(self._to_contracted, key=len, reverse=True):
            verb = phrase.rpartition(" ")[2]
            not_before_not = r"(?![ \t]+not\b)" if f"{verb} not" in self._to_contracted else ""
            alternatives.append(_phrase_regex(phrase) + not_before_not)
        return re.compile(rf"\b(?:{'|'.join(alternatives)})\b(?=[ \t])", re.IGNORECASE)

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        def contract(match: re.Match[str]) -> str:
            phrase = match.group()
            contracted = self._to_contracted[" ".join(phrase.split()).lower()]
            return match_case(phrase, contracted)

        return self._pattern.sub(contract, text)


class Expansion(Attack):
    """Expand contractions: "don't" -> "do not" (HELM's ExpansionPerturbation), case preserved.

    "'s" and "'d" are ambiguous; like HELM they expand to "is"/"would", except before "been", where they can
    only mean "has"/"had" ("she's been" -> "she has been"). Both ' and ’ apostrophes are recognised.
    """

    family = "expansion"

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        alternatives = "|".join(_phrase_regex(c) for c in sorted(_contraction_map()[0], key=len, reverse=True))
        return re.compile(rf"\b(?:{alternatives})\b(?=([ \t]+been\b)?)", re.IGNORECASE)

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        expansions = _contraction_map()[0]

        def expand(match: re.Match[str]) -> str:
            contraction = match.group()
            expansion = expansions[contraction.lower().replace("’", "'")]
            subject, _, verb = expansion.rpartition(" ")
            if match.group(1) and verb in PERFECT_BEFORE_BEEN:
                expansion = f"{subject} {PERFECT_BEFORE_BEEN[verb]}"
            if expansion.startswith("i "):  # the pronoun I is always capitalised
                expansion = "I" + expansion[1:]
            return match_case(contraction, expansion)

        return self._pattern.sub(expand, text)


@cache
def _misspellings() -> dict[str, list[str]]:
    """Correct word -> its common misspellings (data/attacks/misspellings.json, from Wikipedia's list)."""
    path = DATA_DIR / "misspellings.json"
    return json.loads(path.read_text(encoding="utf-8"))["misspellings"]


class Misspelling(RateAttack):
    """Replace each word that has a known common misspelling, with probability p, by one of its misspellings
    (chosen uniformly), preserving case (HELM's MisspellingPerturbation, same Wikipedia list).

    Unlike HELM, a capitalised or upper-case word also matches its lower-case entry ("Because" -> "Becuase").
    """

    family = "misspelling"

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        table = _misspellings()
        words, gaps = split_words(text)
        eligible = [(k, table.get(w) or table.get(w.lower())) for k, w in enumerate(words)]
        eligible = [(k, options) for k, options in eligible if options]
        hit = rng.random(len(eligible)) < self.p
        choice = rng.random(len(eligible))
        for (k, options), replace, u in zip(eligible, hit, choice, strict=True):
            if replace:
                words[k] = match_case(words[k], options[int(u * len(options))])
        return "".join(g + w for g, w in zip(gaps, words, strict=False)) + gaps[-1]  # gaps has one more


def qwerty_neighbours() -> dict[str, str]:
    """Letter -> the letters on keys touching it on a QWERTY keyboard (same row +-1, and the overlapping keys
    of the rows above and below, with the usual stagger of 1/4 and 3/4 key width)."""
    rows = [("qwertyuiop", 0.0), ("asdfghjkl", 0.25), ("zxcvbnm", 0.75)]
    position = {c: (r, k + offset) for r, (keys, offset) in enumerate(rows) for k, c in enumerate(keys)}
    return {c: "".join(d for d, (rd, xd) in position.items()
                       if d != c and ((rd == r and abs(xd - x) == 1) or (abs(rd - r) == 1 and abs(xd - x) < 1)))
            for c, (r, x) in position.items()}


class Typo(RateAttack):
    """Keyboard typos (HELM's TyposPerturbation, from NL-Augmenter's butter-fingers): each ASCII letter is,
    with probability p, replaced by a letter on a touching QWERTY key (uniformly), keeping its case.

    p is per letter, as in HELM, so a word of n letters is changed with probability 1 - (1 - p)^n.
    """

    family = "typo"

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        neighbours = _NEIGHBOURS
        chars = list(text)
        letters = [k for k, c in enumerate(chars) if c.lower() in neighbours and c.isascii()]
        hit = rng.random(len(letters)) < self.p
        choice = rng.random(len(letters))
        for k, replace, u in zip(letters, hit, choice, strict=True):
            if replace:
                options = neighbours[chars[k].lower()]
                new = options[int(u * len(options))]
                chars[k] = new.upper() if chars[k].isupper() else new
        return "".join(chars)


_NEIGHBOURS = qwerty_neighbours()
