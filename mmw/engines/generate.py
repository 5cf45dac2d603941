"""The transformers engine: batched generation with left padding, a token-choosing logits processor, resumable.

The processor (``mmw.watermark.processor.WatermarkProcessor``, or any object with the same three methods) chooses every
token itself and returns -inf elsewhere; decoding is greedy so ``generate`` takes exactly its choice. The model's
own generation_config is neutralised for the call, so no repetition penalty, suppressed tokens, temperature etc.
reach the logits before the processor sees them.

Resumability: batches are planned over every prompt (longest first) and each finished batch is one part of a
``mmw.io.PartsStore`` under ``<parts_dir>``, identified by its rows' keys (hash of the run fingerprint, prompt_id
and chat): a resumed run generates only the batches without a part, with the same members as an uninterrupted
run (left padding makes a row's numbers depend on its batch), so its table is byte-identical; parts left by a run
with other settings are never mixed in.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from mmw.engines.attention import grouped_query_sdpa
from mmw.engines.fused_layers import fuse_default, fused_layers
from mmw.engines.graph_decode import graph_default, static_decode
from mmw.io import PartsStore, plan_units, row_key, write_table
from mmw.params import EngineParams

GENERATION_SCHEMA = {
    "prompt_id": pl.String,
    "text": pl.String,
    "tokens": pl.List(pl.Int64),
    "n_tokens": pl.Int64,
    "mean_entropy": pl.Float64,
    "mean_spike_entropy": pl.Float64,
}

#: KV cache of batched generation on CUDA. "static" pre-allocates prompt + ``max_new_tokens`` positions, so every
#: decoding step has the same shapes: torch's cuDNN attention (which SDPA picks for grouped heads under a padding
#: mask) then builds its execution plan once instead of at every step, and no step copies the whole cache to grow
#: it. Measured on one H100 (bench/gpu_gap.py, random-init Llama-3-8B shape, 296 rows x 1,024 new tokens, one run
#: each in one process): 99.6 s -> 35.5 s (bench/RESULTS.md, "GPU generation: the per-step cuDNN plan"). Uncompiled (``disable_compile``): transformers would
#: otherwise compile the decoding step, which was slower there. None = transformers' growing ``DynamicCache``.
CACHE_IMPLEMENTATION: str | None = "static"
#: Devices that get ``CACHE_IMPLEMENTATION`` (on a CPU the growing cache is cheap and attention reads only what
#: exists; a pre-allocated one would make every step attend over the full length).
CACHE_DEVICES: tuple[str, ...] = ("cuda",)
#: Let transformers compile the decoding step over the static cache (its default ``CompileConfig``: Inductor with
#: CUDA graphs). Off (``disable_compile``): the uncompiled step is host-bound (39 ms of wall against 19 ms of GPU
#: time at 512 tokens of context), but the compile is paid again in every stage process: on one H200, 296 rows x
#: 1,024 tokens took 58.9 s compiled (compile included) against 47.7-60.3 s uncompiled (bench/results/gpu.md).
COMPILE_DECODING = False


def use_static_decode(model: PreTrainedModel, processor: object, prompt_len: int,
                      settings: EngineParams | None = None) -> bool:
    """Decode through ``mmw.engines.graph_decode`` (our own loop over the static cache, the whole step one CUDA graph)
    instead of transformers' ``generate``: where ``settings.static_decode`` (params ``engine``; default on), on a
    device that gets the static cache, uncompiled decoding, a processor with the static interface
    (``begin_static``/``static_step``), and prompts at least as long as the processor's window."""
    settings = settings or EngineParams()
    if not (settings.static_decode and model.device.type in CACHE_DEVICES and CACHE_IMPLEMENTATION == "static"
            and not COMPILE_DECODING and hasattr(processor, "static_step")):
        return False
    # The processor's randomness context (0 when unwatermarked): read from it, so this module imports no scheme code.
    return prompt_len >= getattr(processor, "window_context", 0)


class RecordingProcessor(Protocol):
    """What the engine needs from a processor: the HF call, and per-row means of what it recorded per step."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor: ...

    def mean_entropy(self, lengths: Sequence[int]) -> np.ndarray: ...

    def mean_spike_entropy(self, lengths: Sequence[int]) -> np.ndarray: ...


#: Builds the processor for one batch from its rows' seeds (one seed per row, in batch order).
ProcessorFactory = Callable[[list[int]], RecordingProcessor]


def row_seed(seed: int, prompt_id: str) -> int:
    """Per-row seed from the run seed and the prompt id: independent of batching, order and resumption."""
    digest = hashlib.blake2b(f"{seed}\x00{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: fits int64 everywhere


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """All ids that end a generation: the model's generation_config EOS (may be a list) and the tokenizer's."""
    ids: set[int] = set()
    configured = model.generation_config.eos_token_id
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("model.name: the model defines no EOS token, so generations could not stop")
    return sorted(ids)


def neutral_generation_config(
    tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, max_new_tokens: int
) -> GenerationConfig:
    """Greedy decoding of exactly what the logits processors leave, up to ``max_new_tokens``."""
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos_token_ids(tokenizer, model),
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )


@contextmanager
def neutral_model_defaults(model: PreTrainedModel) -> Iterator[None]:
    """Hide the model's generation_config during ``generate``.

    transformers fills every unset field of the config passed to ``generate`` from ``model.generation_config``
    (repetition_penalty, suppress_tokens, bad_words_ids, min_new_tokens, ...), and "unset" cannot be expressed
    for fields whose neutral value is None. Swapping in a fresh GenerationConfig leaves only neutral defaults.
    """
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def strip_after_eos(generated: torch.Tensor, eos_ids: Sequence[int]) -> list[list[int]]:
    """``generated``: (batch, steps) ids after the prompt. Each row up to its first EOS, EOS excluded."""
    is_eos = torch.isin(generated, torch.tensor(list(eos_ids), device=generated.device))
    rows: list[list[int]] = []
    for row, row_eos in zip(generated.tolist(), is_eos.tolist(), strict=True):
        end = row_eos.index(True) if True in row_eos else len(row)
        rows.append(row[:end])
    return rows


def generate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    input_ids: Sequence[Sequence[int]],
    processor: RecordingProcessor,
    max_new_tokens: int,
    settings: EngineParams | None = None,
) -> dict[str, list]:
    """Generate for one batch of already tokenized prompts (left padded here), on the paths params ``engine``
    (``settings``; None: its defaults) chooses.

    Returns columns text, tokens, n_tokens, mean_entropy, mean_spike_entropy (one entry per row; entropies are
    None for rows that produced no token).
    """
    settings = settings or EngineParams()
    batch = tokenizer.pad(
        {"input_ids": [list(ids) for ids in input_ids]}, padding=True, padding_side="left", return_tensors="pt"
    )
    batch = {name: tensor.to(model.device) for name, tensor in batch.items()}
    config = neutral_generation_config(tokenizer, model, max_new_tokens)
    if model.device.type in CACHE_DEVICES and CACHE_IMPLEMENTATION is not None:
        config.cache_implementation = CACHE_IMPLEMENTATION
        config.disable_compile = not COMPILE_DECODING
    decode = settings.decode_attention
    if use_static_decode(model, processor, batch["input_ids"].shape[1], settings):
        fuse = fuse_default(model.device, settings.fuse_layers)

        def decode_batch(fused: bool) -> torch.Tensor:
            with torch.inference_mode(), grouped_query_sdpa(model, decode), fused_layers(model, fused):
                return static_decode(model, batch["input_ids"], batch["attention_mask"], processor, max_new_tokens,
                                     config.eos_token_id, config.pad_token_id,
                                     graph=graph_default(model.device, settings.graph_decode), decode=decode)

        try:
            generated = decode_batch(fuse)
        except torch._dynamo.exc.TorchDynamoException as err:
            if not fuse:
                raise
            # a compiler bug must not cost a run: unfused is the same computation (the batch starts over)
            warnings.warn(f"compiling the layers' elementwise code failed ({type(err).__name__}: {str(err)[:500]}); "
                          "decoding with transformers' own code", stacklevel=2)
            generated = decode_batch(False)
    else:
        with torch.inference_mode(), neutral_model_defaults(model), grouped_query_sdpa(model, decode):
            output = model.generate(**batch, generation_config=config,
                                    logits_processor=LogitsProcessorList([processor]))
        generated = output[:, batch["input_ids"].shape[1]:]
    tokens = strip_after_eos(generated, config.eos_token_id)
    lengths = [len(row) for row in tokens]

    def per_row(values: np.ndarray) -> list[float | None]:
        return [float(v) if n > 0 and math.isfinite(v) else None for v, n in zip(values, lengths, strict=True)]

    return {
        "text": tokenizer.batch_decode(tokens, skip_special_tokens=True),
        "tokens": tokens,
        "n_tokens": lengths,
        "mean_entropy": per_row(processor.mean_entropy(lengths)),
        "mean_spike_entropy": per_row(processor.mean_spike_entropy(lengths)),
    }


def run_fingerprint(model: PreTrainedModel, max_new_tokens: int, seed: int, extra: str) -> str:
    """What makes a finished row reusable: model, dtype, device type, length cap, seed and the caller's extra
    (e.g. the scheme's parameters)."""
    return "\x00".join(
        [str(model.name_or_path), str(model.dtype), model.device.type, str(max_new_tokens), str(seed), extra]
    )


def parts_dir_of(out_path: Path) -> Path:
    """Where the finished batches of an unfinished ``out_path`` live: ``<out_path>.parts/``."""
    return out_path.with_name(out_path.name + ".parts")


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    chats: Sequence[str],
    processor_factory: ProcessorFactory,
    max_new_tokens: int,
    batch_size: int,
    *,
    prompt_ids: Sequence[str] | None = None,
    seed: int = 0,
    parts_dir: Path | None = None,
    fingerprint: str = "",
    progress: bool = True,
    on_batch_done: Callable[[int], None] | None = None,
    settings: EngineParams | None = None,
) -> pl.DataFrame:
    """Generate a continuation for every chat (rendered chat strings, see ``mmw.tasks.render_chat``).

    Rows are batched by length (longest first, so an out-of-memory shows at once) but returned in input order:
    columns prompt_id, text, tokens (generated ids up to EOS, EOS excluded), n_tokens, mean_entropy,
    mean_spike_entropy. ``prompt_ids`` default to ``"row-NNNNN"``; each row's processor seed is
    ``row_seed(seed, prompt_id)``. With ``parts_dir``, finished batches are stored there (``mmw.io.PartsStore``)
    and batches already stored by a run with the same ``fingerprint`` are not generated again; batches are planned
    over every row, so which rows share a batch does not depend on where a resumed run starts.
    ``on_batch_done(rows generated so far)`` runs after each stored batch. ``settings``: params ``engine`` (None:
    its defaults).
    """
    if batch_size < 1:
        raise ValueError(f"model.batch_size: expected an integer >= 1, got {batch_size!r}")
    if max_new_tokens < 1:
        raise ValueError(f"model.max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
    ids = list(prompt_ids) if prompt_ids is not None else [f"row-{i:05d}" for i in range(len(chats))]
    if len(ids) != len(chats) or len(set(ids)) != len(ids):
        raise ValueError("prompt_ids: expected one distinct id per chat")
    settings = settings or EngineParams()
    if model.device.type == "cuda":  # the engine's switches act on CUDA only: parts of other settings are not reused
        fingerprint += "\x00engine=" + settings.model_dump_json()
    full_fingerprint = run_fingerprint(model, max_new_tokens, seed, fingerprint)
    keys = [row_key(full_fingerprint, pid, chat) for pid, chat in zip(ids, chats, strict=True)]
    # Chat templates carry their own special tokens (BOS included where the model wants one).
    encoded = tokenizer(list(chats), add_special_tokens=False, return_attention_mask=False)["input_ids"] \
        if chats else []
    batches = plan_units(sorted(range(len(chats)), key=lambda i: (-len(encoded[i]), i)), batch_size)

    def run_batch(rows: list[int]) -> pl.DataFrame:
        processor = processor_factory([row_seed(seed, ids[i]) for i in rows])
        columns = generate_batch(model, tokenizer, [encoded[i] for i in rows], processor, max_new_tokens,
                                 settings)
        bar.update(len(rows))
        return pl.DataFrame({"prompt_id": [ids[i] for i in rows], **columns}, schema=GENERATION_SCHEMA)

    with tqdm(total=len(chats), unit="row", desc="generate", disable=not progress) as bar:
        table = PartsStore(parts_dir, GENERATION_SCHEMA, "batches").run(keys, batches, run_batch, on_batch_done)
    return table.select(list(GENERATION_SCHEMA))


def generate_table(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: pl.DataFrame,
    out_path: Path,
    processor_factory: ProcessorFactory,
    max_new_tokens: int,
    batch_size: int,
    *,
    seed: int = 0,
    fingerprint: str = "",
    progress: bool = True,
    on_batch_done: Callable[[int], None] | None = None,
    settings: EngineParams | None = None,
) -> pl.DataFrame:
    """Generate for a prompts table (prompt_id, task, prompt, chat) and write the generations table atomically.

    Finished batches live in ``<out_path>.parts/`` until the table is written, so an interrupted run resumes
    where it stopped. Returns (and writes) prompt_id, task, prompt, text, tokens, n_tokens, mean_entropy,
    mean_spike_entropy in the prompts' order.
    """
    out_path = Path(out_path)
    parts_dir = parts_dir_of(out_path)
    generations = generate(
        model,
        tokenizer,
        prompts["chat"].to_list(),
        processor_factory,
        max_new_tokens,
        batch_size,
        prompt_ids=prompts["prompt_id"].to_list(),
        seed=seed,
        parts_dir=parts_dir,
        fingerprint=fingerprint,
        progress=progress,
        on_batch_done=on_batch_done,
        settings=settings,
    )
    table = prompts.select("prompt_id", "task", "prompt").join(
        generations, on="prompt_id", how="left", maintain_order="left"
    )
    write_table(table, out_path)
    PartsStore(parts_dir, GENERATION_SCHEMA).clear()  # the table now holds every row
    return table
