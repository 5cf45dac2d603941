"""Seeds for units of work, derived from the run's seed (``seed:`` in params.yaml)."""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *parts: str) -> int:
    """A 63-bit seed for one unit of work (e.g. ``derive_seed(seed, "attack", prompt_id, attack_name)``).

    Hashing the parts (not Python's salted ``hash()``) makes it stable across processes and machines, and
    independent of the order in which units are processed.
    """
    message = "\x00".join([str(seed), *parts]).encode()
    return int.from_bytes(hashlib.blake2b(message, digest_size=8).digest(), "little") >> 1
