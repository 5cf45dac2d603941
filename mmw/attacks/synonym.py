"""Synonym attack: replace words by WordNet synonyms of the same part of speech, re-inflected.

Offline pipeline (no NLTK downloads): POS tags from the Brill-style tagger bundled with TextBlob (the
``pattern`` lexicon and rules, Penn Treebank tags); lemmas and inflections from ``lemminflect``; synonyms
from WordNet 3.0 (``mmw.attacks.wordnet``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from mmw.attacks.base import RateAttack
from mmw.attacks.text import match_case
from mmw.attacks.wordnet import load_wordnet

TOKEN_RE = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")
SENTENCE_END = frozenset(".!?")
# Penn tag -> WordNet POS. Proper nouns, comparatives and superlatives are left alone: synonyms of names
# are wrong, and "better" -> "more beneficial" needs more than an inflection table.
WORDNET_POS = {"NN": "n", "NNS": "n", "VB": "v", "VBD": "v", "VBG": "v", "VBN": "v", "VBP": "v", "VBZ": "v",
               "JJ": "a", "RB": "r"}
LEMMINFLECT_POS = {"n": "NOUN", "v": "VERB", "a": "ADJ", "r": "ADV"}
INFLECTED_TAGS = frozenset({"NNS", "VBD", "VBG", "VBN", "VBZ"})
MIN_NOUN_LETTERS = 4
MIN_SYNONYM_LETTERS = 3
# Auxiliaries and function words that taggers label as verbs/adverbs/adjectives; WordNet's "synonyms" for
# them ("very" -> "rattling", "never" -> "ne'er", "be" -> "exist") change the grammar or the meaning.
FUNCTION_WORDS = frozenset("""
    be have do get go let make not no never always ever very too so also just only even still then there here
    now yet again already almost quite rather really more most less least much many such well as how when
    where why once twice soon often however perhaps maybe indeed thus hence therefore instead together else
    other own same few all both each some any up down out off over away back ago enough far further first
    last next""".split())


@dataclass(frozen=True)
class Candidate:
    """A replaceable word ``text[start:end]``: its replacements (inflected and cased like it) and their
    probabilities of being chosen."""

    start: int
    end: int
    tag: str
    replacements: tuple[str, ...]
    probabilities: tuple[float, ...]


class Synonym(RateAttack):
    """Replace each eligible word, with probability p, by a WordNet synonym.

    Eligible: nouns (NN, NNS) of at least 4 letters, non-auxiliary verbs, adjectives (JJ) and adverbs (RB),
    ASCII letters only, not a function word, whose most frequent WordNet sense has a one-word synonym.
    Plural nouns and -s/-ed/-en/-ing verb forms are re-inflected; capitalisation is preserved.
    """

    family = "synonym"

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        candidates = self.candidates(text)
        hit = rng.random(len(candidates)) < self.p
        choice = rng.random(len(candidates))
        pieces, end = [], 0
        for candidate, replace, u in zip(candidates, hit, choice, strict=True):
            if replace:
                k = min(int(np.searchsorted(np.cumsum(candidate.probabilities), u, side="right")),
                        len(candidate.replacements) - 1)  # min: guards against cumsum rounding below 1
                pieces += [text[end:candidate.start], candidate.replacements[k]]
                end = candidate.end
        pieces.append(text[end:])
        return "".join(pieces)

    def candidates(self, text: str) -> tuple[Candidate, ...]:
        """The replaceable words of ``text`` in order, each with its replacements."""
        return lexicon().candidates(text)

    @property
    def _wordnet(self):  # nltk's reader type is only imported lazily
        return lexicon().wordnet


@cache
def lexicon() -> Lexicon:
    """The process's one :class:`Lexicon`, shared by every synonym attack."""
    return Lexicon()


class Lexicon:
    """The synonym attack's language resources (tagger, lemmatiser, WordNet) and what it derives from them.

    A text's candidates depend on the text alone, not on ``p`` or the seed, so they are kept per process and
    shared by every :class:`Synonym`: a board with synonym attacks at several ``p`` tags and looks up each text
    once, not once per attack (on full-scale random-weight texts the second to fourth attacks re-did 5 s of
    lookups each). Keeping them changes no output: candidates are a pure function of the text.
    """

    #: Texts whose candidates are kept (the most recent ones); a board's attacks share their inputs.
    TEXTS = 4096

    def __init__(self) -> None:
        self._texts: OrderedDict[str, tuple[Candidate, ...]] = OrderedDict()
        # (lower-case word, tag) -> lower-case replacements and probabilities; words repeat a lot in text.
        self._words: dict[tuple[str, str], tuple[tuple[str, ...], tuple[float, ...]]] = {}

    def candidates(self, text: str) -> tuple[Candidate, ...]:
        """The replaceable words of ``text`` in order, each with its replacements."""
        if text in self._texts:
            self._texts.move_to_end(text)
            return self._texts[text]
        found = []
        for sentence in self._sentences(text):
            for match, tag in zip(sentence, self._tag([m.group() for m in sentence]), strict=True):
                word = match.group()
                if tag in WORDNET_POS and word.isascii() and word.isalpha():
                    replacements, probabilities = self._replacements(word, tag)
                    if replacements:
                        found.append(Candidate(match.start(), match.end(), tag, replacements, probabilities))
        self._texts[text] = kept = tuple(found)
        if len(self._texts) > self.TEXTS:
            self._texts.popitem(last=False)
        return kept

    @staticmethod
    def _sentences(text: str) -> list[list[re.Match[str]]]:
        """Tokens grouped into sentences (ending at . ! ? or a line break), as the tagger's context."""
        sentences: list[list[re.Match[str]]] = [[]]
        previous_end = 0
        for match in TOKEN_RE.finditer(text):
            if "\n" in text[previous_end:match.start()] and sentences[-1]:
                sentences.append([])
            sentences[-1].append(match)
            if match.group() in SENTENCE_END:
                sentences.append([])
            previous_end = match.end()
        return [s for s in sentences if s]

    def _tag(self, tokens: list[str]) -> list[str]:
        """Penn tag of each token. Contractions are split as in the Penn Treebank ("does n't", "it 's"), which
        is what the tagger's rules expect; a contraction token gets the tag of its first part."""
        split, first_part = [], []
        for token in tokens:
            token = token.replace("’", "'")
            cut = len(token) - 3 if token.lower().endswith("n't") else token.rfind("'")
            first_part.append(len(split))
            split += [token[:cut], token[cut:]] if cut > 0 else [token]
        tags = [tag for _, tag in self.tagger.find_tags(split)]
        return [tags[k] for k in first_part]

    def _replacements(self, word: str, tag: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """Replacements of ``word`` (cased like it) and their probabilities; empty if it is not eligible."""
        key = (word.lower(), tag)
        if key not in self._words:
            self._words[key] = self._lowercase_replacements(*key)
        forms, probabilities = self._words[key]
        return tuple(match_case(word, form) for form in forms), probabilities

    def _lowercase_replacements(self, word: str, tag: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
        pos = WORDNET_POS[tag]
        if pos == "n" and len(word) < MIN_NOUN_LETTERS:
            return (), ()
        lemma = self._lemma(word, pos)
        if lemma is None or lemma in FUNCTION_WORDS:
            return (), ()
        weights: dict[str, float] = {}
        for synonym, weight in zip(*self._synonyms(lemma, pos), strict=True):
            form = self._inflect(synonym, tag)
            if form and form != word:
                weights[form] = weights.get(form, 0.0) + weight
        total = sum(weights.values())
        return tuple(weights), tuple(w / total for w in weights.values())

    def _lemma(self, word: str, pos: str) -> str | None:
        """The dictionary form of ``word`` that WordNet knows for ``pos`` (lemminflect first, then morphy)."""
        lemmas = self.lemminflect.getLemma(word, upos=LEMMINFLECT_POS[pos])
        for lemma in (*lemmas, self.wordnet.morphy(word, pos)):
            if lemma and self.wordnet.synsets(lemma, pos):
                return lemma
        return None

    def _synonyms(self, lemma: str, pos: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """One-word synonyms of ``lemma`` in its most frequent sense, with (unnormalised) choice weights.

        Only WordNet's first sense is used: later senses are rarer and mostly wrong in context ("wind" ->
        "malarkey", "goat" -> "butt"). Synonyms are drawn in proportion to their SemCor frequency + 1, so
        "die" becomes "perish" more often than "croak". Capitalised lemmas are proper names ("Bible"),
        multi-word lemmas would change the word count, and one- or two-letter lemmas are mostly abbreviations
        ("yr"), so all three are skipped.
        """
        synsets = self.wordnet.synsets(lemma, pos)
        lemmas = [m for m in synsets[0].lemmas() if m.name() != lemma and len(m.name()) >= MIN_SYNONYM_LETTERS
                  and m.name().isascii() and m.name().isalpha() and m.name().islower()]
        return tuple(m.name() for m in lemmas), tuple(m.count() + 1.0 for m in lemmas)

    def _inflect(self, lemma: str, tag: str) -> str | None:
        if tag not in INFLECTED_TAGS:
            return lemma
        forms = self.lemminflect.getInflection(lemma, tag=tag)
        return forms[0] if forms else None

    @cached_property
    def wordnet(self):  # nltk's reader type is only imported lazily
        return load_wordnet()

    @cached_property
    def tagger(self):
        from textblob.en import parser  # the pattern tagger; its lexicon loads on first use

        return parser

    @cached_property
    def lemminflect(self):
        import lemminflect

        return lemminflect
