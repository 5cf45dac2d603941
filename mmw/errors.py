"""Errors that name the offending parameter, so bad input fails fast with a readable one-line message."""

from __future__ import annotations

from collections.abc import Iterable


class SpecError(ValueError):
    """An invalid parameter: the message reads ``<key>: <problem>; allowed: <values>``."""

    def __init__(self, key: str, problem: str, allowed: str | Iterable[object] | None = None):
        self.key = key
        self.problem = problem
        if allowed is not None and not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.allowed = allowed
        message = f"{key}: {problem}"
        if allowed:
            message += f"; allowed: {allowed}"
        super().__init__(message)
