"""How the reports print numbers: one set of formats for the HTML page, summary.md and the sweep tables.

``–`` is a missing value (null or NaN), ``∞`` an undetected size.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """A float, or None for null/NaN (infinity is kept: it means "not detected")."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def fmt_tokens(value: float | None) -> str:
    """A token count as the paper prints it: ``53``, ``114.5``, ``∞``; ``–`` when missing."""
    value = finite(value)
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞"
    return f"{value:.1f}".removesuffix(".0") if value < 1000 else f"{value:.0f}"


def fmt_number(value: Any, digits: int = 3) -> str:
    value = finite(value)
    if value is None:
        return "–"
    if math.isinf(value):
        return "∞"
    return f"{value:.{digits}g}"


def fmt_percent(value: Any, digits: int = 1) -> str:
    value = finite(value)
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def fmt_fixed(value: Any, digits: int = 3, percent: bool = False) -> str:
    """A summary.md cell: fixed decimals (or a percentage with one), booleans as yes/no, other values as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if percent:
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_count(value: float | None) -> str:
    """A token count: integral medians without decimals, half-integral ones (even counts) with one."""
    return fmt_fixed(value) if value is None or math.isinf(value) else f"{value:g}"


def fmt_size(size: float | None, undetected: float | None) -> str:
    """A median size (null = undetected at the median) with the share of undetected generations."""
    return f"{fmt_count(size)} ({fmt_fixed(undetected, percent=True)})"
