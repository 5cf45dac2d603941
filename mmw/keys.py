"""The watermark key: from params or the environment, hashed once, never logged or written."""

from __future__ import annotations

import os

from mmw.errors import SpecError
from mmw.prf import key_from_string

KEY_ENV = "MMW_KEY"


def resolve_key(params_value: str | int | None) -> int:
    """64-bit key. ``$MMW_KEY`` wins over ``scheme.key`` so a deployment can keep it out of params files."""
    raw = os.environ.get(KEY_ENV) or params_value
    if raw is None or str(raw) == "":
        raise SpecError("scheme.key", f"no watermark key: set scheme.key in params or the {KEY_ENV} environment variable")
    return key_from_string(str(raw))


def key_fingerprint(key: int) -> str:
    """A short, one-way tag of the key so DVC can notice a key change (e.g. a new $MMW_KEY) without storing it.

    It is a keyed-hash digest, not the key: it cannot be turned back into the key, only compared."""
    import hashlib

    return hashlib.blake2b(key.to_bytes(8, "little"), digest_size=8, person=b"mmw-keyfp").hexdigest()
