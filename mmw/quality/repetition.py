"""Repetition (quality measure ``repetition``): the share of repeated n-grams in a text (n = 1..4), to make watermark-induced loops visible.

For one text and one n: ``1 - distinct n-grams / n-grams``, i.e. the share of the text's n-gram occurrences that
repeat an n-gram seen earlier in the same text. 0 = no n-gram occurs twice; a text stuck in a loop tends to 1.
Words are lower-cased runs of letters/digits, and each punctuation mark is a word of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import polars as pl

from mmw.quality.base import QualityMetric, SummaryColumn, Texts, number

ORDERS = (1, 2, 3, 4)
_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def repeated_share(tokens: Sequence[str], n: int) -> float | None:
    """Share of repeated ``n``-grams among the ``len(tokens) - n + 1`` n-grams; None when there are none."""
    total = len(tokens) - n + 1
    if total <= 0:
        return None
    distinct = len({tuple(tokens[i:i + n]) for i in range(total)})
    return 1.0 - distinct / total


def repetition(text: str, orders: Sequence[int] = ORDERS) -> dict[int, float | None]:
    """``{n: repeated share}`` of one text for each n in ``orders``: :func:`repeated_share`'s numbers, counted on
    integer codes (each n-gram numbered from its (n-1)-gram's number and its last word) instead of tuples of
    strings, ~5x faster on texts of thousands of words."""
    tokens = words(text)
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(token, len(index)) for token in tokens), dtype=np.int64,
                        count=len(tokens))
    shares: dict[int, float | None] = {}
    grams, n_grams = codes, 1  # grams[i]: the number of the n_grams-gram starting at word i
    for n in sorted(set(orders)):
        total = len(tokens) - n + 1
        if total <= 0 or n < 1:
            shares[n] = repeated_share(tokens, n) if n < 1 else None
            continue
        while n_grams < n:  # numbers below len(tokens): the key stays below len(tokens) ** 2
            grams = np.unique(grams[:-1] * len(tokens) + codes[n_grams:], return_inverse=True)[1]
            n_grams += 1
        distinct = len(index) if n == 1 else int(grams.max()) + 1
        shares[n] = 1.0 - distinct / total
    return {n: shares[n] for n in orders}


class Repetition(QualityMetric):
    """Per text, the repeated share of its n-grams for n = 1..4; per group, the mean."""

    name = "repetition"
    columns = {f"repetition_{n}": pl.Float64 for n in ORDERS}
    summary_columns = (SummaryColumn("repeated 1-grams base → wm", "repetition_1", percent=True),
                       SummaryColumn("repeated 4-grams base → wm", "repetition_4", percent=True))
    summary_note = "Repeated n-grams: mean share of a text's n-grams that occur earlier in it."

    def per_text(self, texts: Texts) -> dict[str, list]:
        shares = [repetition(text) for text in texts.table["text"].to_list()]
        return {f"repetition_{n}": [share[n] for share in shares] for n in ORDERS}

    @classmethod
    def group(cls, rows: pl.DataFrame, measure: str | None, source: str) -> dict[str, float | None]:
        return {f"repetition_{n}_{source}": number(rows[f"repetition_{n}"].drop_nans().mean()) for n in ORDERS}
