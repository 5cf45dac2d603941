"""Stage ``detect``: run the detector on the baseline (empirical false-positive rate) or on the watermarked and
attacked texts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl

from mmw.detector import DetectionResult, Detector
from mmw.io import DETECTIONS, GENERATIONS, PERTURBED, read_table, write_table
from mmw.keys import resolve_key
from mmw.params import load_params
from mmw.stages.common import load_generator_vocabulary, timed

DETECTION_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "attack": pl.String,
                    "n_tokens": pl.Int64, "pvalue": pl.Float64, "detected": pl.Boolean, "size": pl.Int64}


def detection_rows(texts: pl.DataFrame, source: str, results: list[DetectionResult]) -> pl.DataFrame:
    """``texts`` (prompt_id, task[, attack]) and their detector verdicts -> rows of the detections table."""
    attack = texts["attack"] if "attack" in texts.columns else [""] * texts.height
    return pl.DataFrame({
        "prompt_id": texts["prompt_id"], "task": texts["task"], "source": [source] * texts.height,
        "attack": attack, "n_tokens": [r.n_tokens for r in results], "pvalue": [r.pvalue for r in results],
        "detected": [r.detected for r in results], "size": [r.size for r in results],
    }, schema=DETECTION_SCHEMA)


def run(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """Write ``data/detections/<which>.parquet``.

    Generated texts are scored on the tokens the generator produced (the watermark lives there); attacked
    texts only exist as strings and are re-tokenized with the generator's tokenizer, as a verifier would.
    Texts whose attack failed (``ok`` false) are not detected.
    """
    with timed(f"detect_{which}") as info:
        params = load_params(params_path)
        key = resolve_key(params.scheme_raw.get("key"))
        generations = read_table(GENERATIONS[which])
        tokenizer, vocab_size = load_generator_vocabulary(params.model)
        detector = Detector(params.scheme, key, vocab_size, device=params.detect.device)
        stored = [np.asarray(tokens, dtype=np.int64) for tokens in generations["tokens"].to_list()]
        frames = [detection_rows(generations, which, detector.detect(stored))]
        if which == "watermarked":
            attacked = read_table(PERTURBED).filter(pl.col("ok"))
            verdicts = detector.detect_text(tokenizer, attacked["text"].to_list())
            frames.append(detection_rows(attacked, "attack", verdicts))
        table = pl.concat(frames)
        write_table(table, DETECTIONS[which])
        info.update(rows=table.height, detected=int(table["detected"].sum()), device=params.detect.device)
