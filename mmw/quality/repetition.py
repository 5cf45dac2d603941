"""Repetition (quality measure ``repetition``): the share of repeated n-grams in a text (n = 1..4), to make watermark-induced loops visible.

For one text and one n: ``1 - distinct n-grams / n-grams``, i.e. the share of the text's n-gram occurrences that
repeat an n-gram seen earlier in the same text. 0 = no n-gram occurs twice; a text stuck in a loop tends to 1.
Words are lower-cased runs of letters/digits, and each punctuation mark is a word of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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
    """``{n: repeated share}`` of one text for each n in ``orders``."""
    tokens = words(text)
    return {n: repeated_share(tokens, n) for n in orders}


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
