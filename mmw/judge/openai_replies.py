"""Well-formedness of replies from an OpenAI-compatible server (the judge's and the paraphrase attack's).

A server may answer with anything: bytes that are not JSON, a truncated body, an HTML error page, JSON of another
schema, an empty message. The ``openai`` client surfaces these as decoding errors, as plain strings, or as
half-built objects; these helpers turn each into :class:`Malformed` (or a decoding error in ``DECODE_ERRORS``),
so a caller can retry a bounded number of times and then record a failure instead of crashing or caching it.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: What the client raises for a body that is not JSON (or not text) under a JSON content type.
DECODE_ERRORS: tuple[type[Exception], ...] = (json.JSONDecodeError, UnicodeDecodeError)


class Malformed(Exception):
    """A server reply that is not a well-formed chat completion (never cached; retried, then a Failure)."""


def reply_text(response: Any) -> str:
    """The assistant's text in a chat-completion reply; :class:`Malformed` when the reply is not a chat
    completion (a text body, another schema) or its content is missing or empty."""
    from openai.types.chat import ChatCompletion

    choices = getattr(response, "choices", None) if isinstance(response, ChatCompletion) else None
    if not isinstance(choices, list) or not choices:
        raise Malformed(f"not a chat completion ({_preview(response)})")
    content = getattr(getattr(choices[0], "message", None), "content", None)
    if not isinstance(content, str) or not content.strip():
        raise Malformed(f"empty or non-text content ({_preview(content)})")
    return content


def reply_top(response: Any) -> list[tuple[str, float]] | None:
    """(token, logprob) pairs of the first generated token's top log-probabilities; None when the reply is well
    formed but carries none; :class:`Malformed` for anything else."""
    from openai.types.chat import ChatCompletion

    choices = getattr(response, "choices", None) if isinstance(response, ChatCompletion) else None
    if not isinstance(choices, list) or not choices:
        raise Malformed(f"not a chat completion ({_preview(response)})")
    logprobs = getattr(choices[0], "logprobs", None)
    content = getattr(logprobs, "content", None) if logprobs is not None else None
    if not content:
        return None
    top = getattr(content[0], "top_logprobs", None) if isinstance(content, list) else None
    if not top:
        return None
    pairs = [(getattr(t, "token", None), getattr(t, "logprob", None)) for t in top]
    if not all(isinstance(token, str) and isinstance(lp, (int, float)) and not isinstance(lp, bool)
               and not math.isnan(lp) and lp != math.inf for token, lp in pairs):
        raise Malformed(f"top_logprobs are not (token, log-probability) pairs ({_preview(top)})")
    return pairs  # type: ignore[return-value]  (checked above)


def model_ids(client: Any) -> list[str]:
    """The model ids ``client`` (an ``openai.OpenAI``) gets from ``/models``; :class:`Malformed` when the reply is
    not a model list."""
    try:
        listing = client.models.list()
    except (AttributeError, TypeError) as error:  # the client cannot page through a body that is no list
        raise Malformed(f"not a model list ({error})") from None
    data = getattr(listing, "data", None)
    ids = [getattr(m, "id", None) for m in data] if isinstance(data, list) else None
    if ids is None or not all(isinstance(i, str) for i in ids):
        raise Malformed(f"not a model list ({_preview(listing)})")
    return ids


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
