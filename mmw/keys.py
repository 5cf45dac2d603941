"""The watermark key: from params or the environment, hashed once, never logged or written.

The key is the top-level ``key:`` entry of params.yaml; ``$MMW_KEY`` wins so a deployment can keep it out of params
files. What is written anywhere is only ``key_fingerprint`` (``data/key.fingerprint``, whose digest DVC copies into
dvc.lock): a slow, memory-hard scrypt digest, so that holding dvc.lock does not let anyone test guesses of the key at
hash speed, and keys short enough to be guessed are refused up front.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from mmw.errors import SpecError
from mmw.watermark.prf import key_from_string

KEY_ENV = "MMW_KEY"
#: Shortest key accepted (characters). ``openssl rand -hex 16`` gives 32; the public benchmark key has 24.
MIN_KEY_CHARS = 16
# scrypt cost: N = 2^15, r = 8 -> 32 MiB of memory and ~0.1 s per guess on one core (vs ~1 us for a bare hash).
# The salt is fixed (a per-project domain tag, not random) because the fingerprint must be the same on every run:
# DVC compares it to decide what to rerun.
SCRYPT = dict(n=1 << 15, r=8, p=1, maxmem=1 << 26, dklen=16)
FINGERPRINT_SALT = b"mmw key fingerprint v2"


def resolve_key(params_value: str | int | None, environ: Mapping[str, str] | None = None) -> int:
    """The 64-bit PRF key from ``$MMW_KEY`` (if set in ``environ``, default ``os.environ``) or the params'
    top-level ``key``.

    Raises SpecError (one line, naming ``MMW_KEY`` or ``key``) when there is no key, when ``$MMW_KEY`` is set but
    empty (an unset shell variable expanded to "" would otherwise silently fall back to the public params key), or
    when the key is shorter than ``MIN_KEY_CHARS``."""
    env = (os.environ if environ is None else environ).get(KEY_ENV)
    if env is not None:
        if env.strip() == "":
            raise SpecError(KEY_ENV, "is set but empty; unset it to use the params key, or set a secret key",
                            f"a string of >= {MIN_KEY_CHARS} characters, e.g. $(openssl rand -hex 16)")
        raw, name = env, KEY_ENV
    else:
        if params_value is None or str(params_value).strip() == "":
            raise SpecError("key", f"no watermark key: set the top-level `key:` in params.yaml or ${KEY_ENV}",
                            f"a string of >= {MIN_KEY_CHARS} characters")
        raw, name = str(params_value), "key"
    if len(raw) < MIN_KEY_CHARS:
        raise SpecError(name, f"the key has {len(raw)} characters: too short to be secret (anyone holding dvc.lock "
                        "or a watermarked text can test guesses of a short key offline)",
                        f"a string of >= {MIN_KEY_CHARS} characters, e.g. $(openssl rand -hex 16)")
    return key_from_string(raw)


def key_fingerprint(key: int) -> str:
    """A one-way tag of the 64-bit key (32 hex characters) so DVC can notice a key change (e.g. a new $MMW_KEY)
    without storing it. scrypt makes each guess cost ~0.1 s and 32 MiB, so the committed digest of this tag cannot
    be used to search the key space at hash speed."""
    return hashlib.scrypt(key.to_bytes(8, "little"), salt=FINGERPRINT_SALT, **SCRYPT).hex()
