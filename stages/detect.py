"""Stage ``detect``: run the detector on the baseline (empirical false-positive rate) or on the watermarked and
attacked texts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
from mmw.stages.common import generator_model, load_generator_vocabulary
from mmw.stages.timing import timed

from mmw import provenance
from mmw.audit import audit_keys
from mmw.io import (
    DETECTION_SCHEMA,
    DETECTIONS,
    GENERATIONS,
    PERTURBED,
    read_table,
    write_table,
)
from mmw.keys import resolve_key
from mmw.params import Params, load_params
from mmw.watermark.build import build_detector
from mmw.watermark.detector import DetectionResult
from mmw.watermark.plugin_detection import needs_model, preflight_detector
from mmw.watermark.scheme import SchemeSpec


def detection_rows(texts: pl.DataFrame, source: str, results: list[DetectionResult],
                   audit: list[list[float]] | None = None) -> pl.DataFrame:
    """``texts`` (prompt_id, task[, attack]) and their detector verdicts -> rows of the detections table.

    ``audit``: per text, its full-text p-values under the audit keys (baseline only; null elsewhere)."""
    attack = texts["attack"] if "attack" in texts.columns else [""] * texts.height
    return pl.DataFrame({
        "prompt_id": texts["prompt_id"], "task": texts["task"], "source": [source] * texts.height,
        "attack": attack, "n_tokens": [r.n_tokens for r in results], "pvalue": [r.pvalue for r in results],
        "detected": [r.detected for r in results], "size": [r.size for r in results],
        "size_valid": [r.size_valid for r in results], "size_anytime": [r.size_anytime for r in results],
        "audit_pvalues": audit if audit is not None else [None] * texts.height,
    }, schema=DETECTION_SCHEMA)


def audit_pvalues(params: Params, vocab_size: int, key: int, tokens: list[np.ndarray]) -> list[list[float]]:
    """Full-text p-values of each text under ``detect.audit_keys`` keys derived one-way from ``key``
    -> [texts][K] (the FPR spread over keys, ``mmw.audit``)."""
    model = detection_model(params)
    per_key = [build_detector(params.scheme, audit_key, vocab_size, params.detect.device, model)
               .full_text_pvalues(tokens).tolist()
               for audit_key in audit_keys(key, params.detect.audit_keys)]
    return [list(row) for row in zip(*per_key, strict=True)] if per_key else [[] for _ in tokens]


def detection_model(params: Params):
    """The generator, for a plugin detector that ``needs_model`` (loaded once a process); else None."""
    if not needs_model(params.scheme):
        return None
    return generator_model(params.model.name, params.model.device, params.model.dtype)


#: The kernels' compile (3.1-3.6 s with fresh caches) runs beside the process's first decode, not the last one before
#: this stage (``mmw.sweep.pipeline.schedule_ahead``): in a full configuration that one also hosts the judge's
#: build (14-17 s beside a ~20-22 s decode), and with fresh caches its loop waited 0.4-2.5 s for the two, while the
#: baseline's ~30-35 s decode hosted only the watermark step (3-4 s) (one H200 and H100s, bench/results/gpu.md).
AHEAD_BESIDE_FIRST = True


def schedule_ahead(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """In a process that runs several stages (``mmw.sweep.pipeline.schedule_ahead``): have the detector's numba
    CUDA kernels compiled (or read from numba's disk cache) while a generation stage decodes (``mmw.engines.ahead``),
    where the detector is mmw's own and runs on CUDA. A kernel compiled for a signature is the same whoever compiles
    it; the stage then finds it in numba's dispatchers (on one H100 detect_baseline's first kernel calls took 2.3 s
    with fresh caches, 0.6 s with numba's disk cache filled; bench/results/gpu.md). One job serves both detect
    stages."""
    if which != "baseline":
        return
    from mmw.engines import ahead

    params = load_params(params_path, ("model", "scheme", "detect"), models={"scheme": SchemeSpec})
    # a plugin scores by its own code; the CPU twin's parallel kernels stay on the stage's thread (they set the
    # process's OpenMP thread count, mmw.provenance.settle_threads)
    if not params.scheme.is_plugin and params.detect.device in ("auto", "cuda"):
        ahead.schedule(("detect kernels", params.scheme.model_dump_json(), params.model.name),
                       lambda: compile_kernels(params), 0)


def compile_kernels(params: Params, texts: int = 3, tokens: int = 48) -> bool:
    """Run the CUDA detector of ``params`` on ``texts`` random texts of up to ``tokens`` token ids (under key 0: a
    kernel's signature holds the key's type, not its value), so numba compiles every kernel its stages call.
    Returns whether it ran (False where ``detect.device`` resolves to the CPU)."""
    from mmw.kernels.backend import resolve_device

    if resolve_device(params.detect.device) != "cuda":
        return False
    _, vocab_size = load_generator_vocabulary(params.model)
    detector = build_detector(params.scheme, 0, vocab_size, params.detect.device)
    generator = np.random.default_rng(0)
    detector.score([generator.integers(0, vocab_size, size=tokens - i, dtype=np.int64) for i in range(texts)])
    return True


def run(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """Write ``data/detections/<which>.parquet``.

    Generated texts are scored on the tokens the generator produced (the watermark lives there); attacked
    texts only exist as strings and are re-tokenized with the generator's tokenizer, as a verifier would.
    Texts whose attack failed (``ok`` false) are not detected. The baseline is also detected under the audit keys
    (``audit_pvalues``); the watermarked texts of the attacked prompts are also detected from their text
    (``source == "retokenized"``), the no-attack point of tamper resistance.
    """
    with timed(f"detect_{which}") as info:
        params = load_params(params_path, ("model", "scheme", "detect", "key"), models={"scheme": SchemeSpec})
        key = resolve_key(params.key)
        generations = read_table(GENERATIONS[which], columns=("prompt_id", "task", "text", "tokens"))
        perturbed = read_table(PERTURBED) if which == "watermarked" else None  # every input checked before the model
        tokenizer, vocab_size = load_generator_vocabulary(params.model)
        if params.scheme.is_plugin:
            preflight_detector(params.scheme, key, vocab_size)  # a misbehaving detector fails before any text
        detector = build_detector(params.scheme, key, vocab_size, params.detect.device, detection_model(params))
        provenance.settle_threads()  # before the first kernel: the same thread counts in a process or a warm copy
        stored = [np.asarray(tokens, dtype=np.int64) for tokens in generations["tokens"].to_list()]
        audit = audit_pvalues(params, vocab_size, key, stored) if which == "baseline" else None
        frames = [detection_rows(generations, which, detector.detect(stored), audit)]
        if perturbed is not None:
            attacked = perturbed.filter(pl.col("ok"))
            verdicts = detector.detect_text(tokenizer, attacked["text"].to_list())
            frames.append(detection_rows(attacked, "attack", verdicts))
            # The no-attack point of R: the watermarked texts of exactly the attacked prompts, through the same
            # text -> tokens path as the attacked ones (a no-op attack must not look like an effective one).
            subset = generations.filter(pl.col("prompt_id").is_in(perturbed["prompt_id"].unique().to_list()))
            frames.append(detection_rows(subset, "retokenized",
                                         detector.detect_text(tokenizer, subset["text"].to_list())))
        table = pl.concat(frames)
        write_table(table, DETECTIONS[which])
        info.update(rows=table.height, detected=int(table["detected"].sum()), device=params.detect.device)
