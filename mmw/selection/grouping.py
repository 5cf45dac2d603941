"""Which experiments may compete in one selection pool.

Two settings are comparable only when they were measured the same way: same generator and token budget, same
prompts and seed, same attacks, same detection threshold (alpha) and detector, same judge. Temperature is a
cell of the paper's table, not a pool: settings are picked per temperature x scheme family. Everything else in
``COMPARABLE`` must match; :func:`comparable_groups` splits a table into groups that agree on all of it, and
:func:`single_group` refuses a mixed table with a message that names the params that differ.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import polars as pl

from mmw.errors import SpecError
from mmw.params import PromptParams
from mmw.watermark.scheme import SchemeSpec

#: Param prefixes that must be equal inside a pool (a column matches when it equals one or starts with it + ".").
COMPARABLE = ("seed", "model.name", "model.max_new_tokens", "model.dtype", "prompts", "attacks", "scheme.alpha",
              "rate.judge", "rate.mode", "rate.dtype", "rate.max_new_tokens", "detect")
#: The cell columns of the paper's table: picks are made per temperature x scheme family (the sampler).
CELL = ("model.temperature", "family")
#: A null means the param's default: ``scheme.alpha`` left unset, or ``prompts.pool`` in a run made before the param
#: existed (its runs drew from the paper's prompts, the default), so they pool with runs that name the default.
DEFAULTS = {"scheme.alpha": SchemeSpec.model_fields["alpha"].default,
            "prompts.pool": PromptParams.model_fields["pool"].default}


def comparable_columns(table: pl.DataFrame) -> list[str]:
    """The columns of ``table`` that :data:`COMPARABLE` names, in table order."""
    return [c for c in table.columns if any(c == p or c.startswith(f"{p}.") for p in COMPARABLE)]


def with_group(table: pl.DataFrame) -> pl.DataFrame:
    """``table`` plus ``family`` (= ``scheme.sampler``) and ``group`` (8 hex digits of a hash of the
    comparable params; equal exactly when all of them are equal)."""
    columns = comparable_columns(table)
    filled = table.with_columns([pl.col(c).fill_null(v) for c, v in DEFAULTS.items() if c in table.columns])

    def key(row: dict[str, object]) -> str:
        text = json.dumps([row[c] for c in columns], sort_keys=True, default=str)
        return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()

    groups = [key(row) for row in filled.select(columns).iter_rows(named=True)] if columns else ["-"] * table.height
    family = pl.col("scheme.sampler") if "scheme.sampler" in table.columns else pl.lit(None, dtype=pl.String)
    return table.with_columns(family.alias("family"), pl.Series("group", groups, dtype=pl.String))


@dataclass(frozen=True)
class Group:
    """One comparable group: its id, row count and the values of the params that differ between groups."""

    group: str
    rows: int
    differing: dict[str, object]


def comparable_groups(table: pl.DataFrame) -> list[Group]:
    """The groups of a :func:`with_group` table, largest first, each with the params that tell it apart."""
    columns = comparable_columns(table)
    per_group = table.group_by("group", maintain_order=True).agg(pl.len().alias("rows"),
                                                                  *[pl.col(c).first() for c in columns])
    differing = [c for c in columns if per_group[c].cast(pl.String).n_unique() > 1]
    return [Group(group=row["group"], rows=row["rows"], differing={c: row[c] for c in differing})
            for row in per_group.sort("rows", descending=True).iter_rows(named=True)]


def _short(value: object, width: int = 40) -> str:
    text = str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def single_group(table: pl.DataFrame, chosen: str | None = None) -> pl.DataFrame:
    """The rows of one comparable group: ``chosen`` (a group id), or the only one.

    A table with several groups and no choice raises SpecError listing each group, its size and the params
    that differ, so the user picks one (``mmw select --group ID``) instead of ranking incomparable runs.
    """
    groups = comparable_groups(table)
    ids = [g.group for g in groups]
    if chosen is not None:
        if chosen not in ids:
            raise SpecError("--group", f"unknown group {chosen!r}", ids)
        return table.filter(pl.col("group") == chosen)
    if len(groups) > 1:
        described = "; ".join(f"{g.group} ({g.rows} runs: " + ", ".join(f"{k}={_short(v)}" for k, v in
                                                                       g.differing.items()) + ")" for g in groups)
        raise SpecError("experiments", f"{len(groups)} groups of experiments that cannot be compared (they differ "
                        f"in {', '.join(groups[0].differing)}): {described}", "--group " + " | --group ".join(ids))
    return table
