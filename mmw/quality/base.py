"""The contract of a secondary quality measure (stage ``quality``): what it adds to each text's row of
data/quality/scores.parquet, what it pools over all texts, how a group of rows sums it up in reports/quality.json
and how summary.md shows it.

The stage computes the scoring model's forward pass once when any chosen measure needs it
(:attr:`QualityMetric.needs_scorer`) and hands it to every measure in :class:`Texts`. Classes are light to
import (the aggregate stage reads their summary columns): heavy libraries load inside the methods that need them.
"""

from __future__ import annotations

import math
from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl

if TYPE_CHECKING:
    from mmw.quality.params import QualityParams
    from mmw.quality.scoring import Scores


@dataclass(frozen=True)
class Texts:
    """What the measures see. ``table``: one row per text and source (prompt_id, task, prompt, text, source);
    ``scores``: the scorer's perplexities and features, row-aligned with ``table`` (None when no chosen measure
    needs the scorer); ``seed``: the run's seed."""

    table: pl.DataFrame
    settings: QualityParams
    seed: int
    scores: Scores | None = None


@dataclass(frozen=True)
class SummaryColumn:
    """A column of summary.md's secondary-quality table: a group's ``<key>_baseline → <key>_watermarked``, as
    percentages or plain numbers; ``whole_or_none``: one "–" for the cell when the baseline number is missing."""

    header: str
    key: str
    percent: bool = False
    whole_or_none: bool = False


def number(value: Any) -> float | None:
    """A finite float, or None (what quality.json holds: numbers or null)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class QualityMetric(ABC):
    """One measure, named in ``quality.metrics``. Built once per run from the ``quality:`` settings, before any
    text is read: a measure that cannot run here (no sandbox) refuses in its constructor."""

    #: Its name in ``quality.metrics``.
    name: ClassVar[str]
    #: Whether it reads the scoring model's forward pass (:attr:`Texts.scores`).
    needs_scorer: ClassVar[bool] = False
    #: Its per-text columns of data/quality/scores.parquet (null where it was not chosen).
    columns: ClassVar[dict[str, type[pl.DataType] | pl.DataType]] = {}
    #: Whether it has a number pooled over every text, reported at quality.json's top level under its name (null
    #: where it was not chosen).
    pooled: ClassVar[bool] = False
    #: quality.json header entries it describes (:meth:`header`), with their values when it was not chosen.
    header_defaults: ClassVar[dict[str, Any]] = {}
    #: Its summary.md columns and its sentence under that table.
    summary_columns: ClassVar[tuple[SummaryColumn, ...]] = ()
    summary_note: ClassVar[str] = ""
    #: Its line above that table, a format string over its pooled entry (floats as the report prints numbers).
    summary_pooled: ClassVar[str] = ""

    def __init__(self, settings: QualityParams) -> None:
        self.settings = settings

    def per_text(self, texts: Texts) -> dict[str, list[Any]]:
        """Its :attr:`columns`' values, one per row of ``texts.table``."""
        return {}

    def pool(self, texts: Texts) -> dict[str, Any] | None:
        """Its pooled entry of quality.json (numbers or null; only where :attr:`pooled`)."""
        return None

    def header(self) -> dict[str, Any]:
        """Its quality.json header entries for this run (the keys of :attr:`header_defaults`)."""
        return dict(self.header_defaults)

    @classmethod
    def group(cls, rows: pl.DataFrame, measure: str | None, source: str) -> dict[str, float | None]:
        """Its numbers for one group's rows of one source (keys end in ``_<source>``)."""
        return {}

    @classmethod
    def group_change(cls, numbers: dict[str, Any]) -> dict[str, float | None]:
        """Its watermarked-vs-baseline numbers of one group, from that group's numbers of both sources."""
        return {}
