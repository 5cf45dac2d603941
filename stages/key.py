"""Stage ``key``: a one-way fingerprint of the watermark key, so DVC reruns what depends on the key when it
changes, including through ``$MMW_KEY``, which DVC cannot see (the stage is ``always_changed``).

The key itself is never listed as a DVC param (it would be copied into dvc.lock, which is committed).
"""

from __future__ import annotations

from pathlib import Path

from mmw.board import load_board
from mmw.io import KEY_FINGERPRINT, write_text
from mmw.keys import key_fingerprint, resolve_key


def run(params_path: Path) -> None:
    """Validate the board (the cheapest place to fail fast) and write ``data/key.fingerprint``."""
    params = load_board(params_path)
    write_text(key_fingerprint(resolve_key(params.key)) + "\n", KEY_FINGERPRINT)
