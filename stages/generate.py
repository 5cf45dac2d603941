"""Stage ``generate``: the unwatermarked baseline or the watermarked generations of every prompt."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from mmw.engines.generate import generate_table
from mmw.engines.models import load_model
from mmw.io import GENERATIONS, PROMPTS, read_table
from mmw.keys import resolve_key
from mmw.params import load_params
from mmw.processor import WatermarkProcessor
from mmw.stages.common import generator_vocab_size, timed


def run(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """Write ``data/generations/<which>.parquet``.

    The baseline goes through the same processor with no scheme (plain sampling from the same per-prompt
    seeds), so baseline and watermarked texts differ only by the watermark. Only the watermarked run reads the
    ``scheme:`` section and the key.
    """
    with timed(f"generate_{which}") as info:
        params = load_params(params_path)
        spec = params.scheme if which == "watermarked" else None
        key = resolve_key(params.scheme_raw.get("key")) if spec is not None else None
        prompts = read_table(PROMPTS)
        tokenizer, model = load_model(params.model.name, params.model.device, params.model.dtype)
        vocab_size = generator_vocab_size(tokenizer, model)
        temperature = params.model.temperature

        def processor_factory(row_seeds: list[int]) -> WatermarkProcessor:
            return WatermarkProcessor(spec, key, vocab_size, row_seeds, temperature)

        # Resumed rows must come from the same scheme and key; the key enters only as a digest.
        fingerprint_parts = [f"T={temperature!r}"]
        if spec is not None:
            fingerprint_parts += [repr(sorted(spec.to_dict().items())), hashlib.sha256(str(key).encode()).hexdigest()]
        fingerprint = "\x00".join(fingerprint_parts)
        table = generate_table(model, tokenizer, prompts, GENERATIONS[which], processor_factory,
                               params.model.max_new_tokens, params.model.batch_size, seed=params.seed,
                               fingerprint=fingerprint, progress=True)
        info.update(rows=table.height, tokens=int(table["n_tokens"].sum()), device=str(model.device))
