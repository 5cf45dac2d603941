"""Stage ``generate``: the unwatermarked baseline or the watermarked generations of every prompt."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Literal

from mmw.engines import ahead
from mmw.engines.generate import generate_table
from mmw.engines.models import compile_workers_up, load_model
from mmw.io import GENERATIONS, PROMPTS, read_table
from mmw.keys import key_fingerprint, resolve_key
from mmw.params import EngineParams, Params, load_params
from mmw.watermark.build import build_processor
from mmw.watermark.plugin_generation import preflight
from mmw.provenance import note_engine
from mmw.watermark.scheme import SchemeSpec
from mmw.stages.common import generator_vocab_size
from mmw.stages.timing import timed


def resume_fingerprint(temperature: float, spec: SchemeSpec | None, key: int | None) -> str:
    """What resumed rows must share with this run: temperature, scheme and key. The key enters only through
    ``key_fingerprint`` (scrypt), never as a fast hash that would let parts on disk be used to test key guesses."""
    parts = [f"T={temperature!r}"]
    if spec is not None:
        parts += [repr(sorted(spec.to_dict().items())), key_fingerprint(key)]
    return "\x00".join(parts)


#: This stage's decodes host later stages' set-up (``mmw.sweep.pipeline.schedule_ahead``, ``mmw.engines.ahead``).
DECODES = True


def batch_processor(spec: SchemeSpec | None, key: int | None, vocab_size: int, temperature: float,
                    settings: EngineParams, row_seeds: list[int]):
    """The processor of one batch of rows (``row_seeds``), as params ``engine`` (``settings``) asks."""
    return build_processor(spec, key, vocab_size, row_seeds, temperature,
                           compiled=None if settings.compile_step else False, compile_mode=settings.compile_mode)


def schedule_ahead(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """In a process that runs several stages (``mmw.sweep.pipeline.schedule_ahead``): have the watermarked stage's
    compiled watermark step built while the baseline decodes (``mmw.engines.ahead``), by :func:`compile_step`."""
    if which != "watermarked":
        return
    params = load_params(params_path, ("seed", "model", "scheme", "key", "engine"), models={"scheme": SchemeSpec})
    if params.model.engine == "transformers" and not params.scheme.is_plugin and params.engine.compile_step:
        ahead.schedule(("watermark step", params.scheme.model_dump_json(), params.model.name),
                       lambda: compile_step(params), 0)


def compile_step(params: Params) -> bool:
    """Compile the watermark step of ``params``' watermarked generation for its first batch, as the stage's decode
    loop will call it (``mmw.engines.graph_decode``): the same cached step (``mmw.watermark.processor.
    watermark_step``: one per scheme, key, vocabulary, temperature and compile setting), inputs of the shapes and
    types the loop gives it, under inference mode; the stage's first call then finds the compiled code (Dynamo's
    cache, keyed by the step's code and guarded by these shapes). The inputs' values are zeros: compiling reads
    only shapes, and the step's own buffers are those of a processor the stage never sees. Returns whether it
    compiled (False where the stage would not decode through that loop: no CUDA, another engine's switches)."""
    import torch

    from mmw.engines.generate import use_static_decode
    from mmw.engines.graph_decode import graph_default

    tokenizer, model = load_model(params.model.name, params.model.device, params.model.dtype)  # the loaded one
    rows = min(params.model.batch_size, read_table(PROMPTS, columns=("prompt_id",)).height)
    settings = params.engine
    processor = batch_processor(params.scheme, resolve_key(params.key), generator_vocab_size(tokenizer, model),
                                params.model.temperature, settings, [0] * rows)
    device = model.device
    if not (rows and use_static_decode(model, processor, processor.window_context, settings)
            and graph_default(device, settings.graph_decode)):
        return False
    with torch.inference_mode():
        processor.begin_static(rows, params.model.max_new_tokens, device, graph=True)
        scores = torch.zeros(rows, model.get_output_embeddings().out_features, dtype=torch.float32, device=device)
        context = torch.zeros(rows, processor.window_context, dtype=torch.int64, device=device)
        processor.static_step(context, scores, torch.zeros(1, dtype=torch.int64, device=device))
    return True


def run(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """Write ``data/generations/<which>.parquet``.

    The baseline goes through the same processor with no scheme (plain sampling from the same per-prompt
    seeds), so baseline and watermarked texts differ only by the watermark. Only the watermarked run reads the
    ``scheme:`` section and the key.
    """
    with timed(f"generate_{which}") as info:
        ahead.stage_decodes(ahead.host("generate", which))  # later stages' set-up waiting for this decode may start
        params = load_params(params_path, ("seed", "model", "scheme", "key", "engine") if which == "watermarked"
                             else ("seed", "model", "engine"), models={"scheme": SchemeSpec})
        spec = params.scheme if which == "watermarked" else None
        key = resolve_key(params.key) if spec is not None else None
        note_engine(params.engine)
        if params.model.engine == "vllm":
            from mmw.engines.vllm_engine import VllmGenerator, require_vllm

            require_vllm()  # before any table or model is read
            prompts = read_table(PROMPTS)
            engine = VllmGenerator(params.model.name, params.model.device, params.model.dtype,
                                   max_num_seqs=params.model.batch_size, key=key)
            table = engine.generate_table(prompts, GENERATIONS[which], spec, params.model.temperature,
                                          params.model.max_new_tokens, params.seed,
                                          resume_fingerprint(params.model.temperature, spec, key))
            info.update(rows=table.height, tokens=int(table["n_tokens"].sum()), device="vllm")
            return
        prompts = read_table(PROMPTS)
        loading = time.perf_counter()
        with compile_workers_up(params.model.device, enabled=params.engine.compiles_generation):
            tokenizer, model = load_model(params.model.name, params.model.device, params.model.dtype)
        info["load_s"] = round(time.perf_counter() - loading, 3)  # ~0 where a warm process shares its load
        vocab_size = generator_vocab_size(tokenizer, model)
        temperature = params.model.temperature

        if spec is not None and spec.is_plugin:
            preflight(spec, key, vocab_size, temperature)  # a misbehaving plugin fails here, before any batch

        settings = params.engine
        processor_factory = partial(batch_processor, spec, key, vocab_size, temperature, settings)
        fingerprint = resume_fingerprint(temperature, spec, key)
        table = generate_table(model, tokenizer, prompts, GENERATIONS[which], processor_factory,
                               params.model.max_new_tokens, params.model.batch_size, seed=params.seed,
                               fingerprint=fingerprint, progress=True, settings=settings)
        info.update(rows=table.height, tokens=int(table["n_tokens"].sum()), device=str(model.device))
