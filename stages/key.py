"""Stage ``key``: a one-way fingerprint of the watermark key, so DVC reruns what depends on the key when it
changes, including through ``$MMW_KEY``, which DVC cannot see (the stage is ``always_changed``).

The key itself is never listed as a DVC param (it would be copied into dvc.lock, which is committed).

It is the first stage DVC runs, so it is where bad input must stop a run: the whole board is validated and a
plugin's contract is checked on a tiny synthetic batch before any stage loads a model. Its output is ``persist``
in dvc.yaml: DVC does not delete the fingerprint before running it, so a refused run leaves data/ as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

from mmw.board import load_board
from mmw.errors import SpecError
from mmw.io import KEY_FINGERPRINT, write_text
from mmw.keys import key_fingerprint, resolve_key

#: Appended to the error under ``dvc exp run`` (DVC sets DVC_EXP_NAME for its stages), which writes its -S
#: overrides into params.yaml before the first stage runs and leaves them there when a stage fails.
EXP_RUN_RESTORE = ("; nothing ran and data/, dvc.lock and the DVC cache are unchanged, but dvc exp run left its -S "
                   "overrides in params.yaml: `git diff params.yaml` shows them, `git checkout -- params.yaml` "
                   "restores the committed file")


def run(params_path: Path) -> None:
    """Validate the board (the cheapest place to fail fast), run a plugin's contract check on a tiny synthetic
    batch (before any stage generates), and write ``data/key.fingerprint``."""
    try:
        params = load_board(params_path)
        key = resolve_key(params.key)
        if params.scheme.is_plugin:
            from mmw.stages.common import load_generator_vocabulary

            from mmw.watermark.plugin_contract import check_contract

            _, vocab_size = load_generator_vocabulary(params.model)
            check_contract(params.scheme, key, vocab_size, params.model.temperature)
    except SpecError as err:
        if os.environ.get("DVC_EXP_NAME"):
            err.args = (f"{err}{EXP_RUN_RESTORE}",)
        raise
    write_text(key_fingerprint(key) + "\n", KEY_FINGERPRINT)
