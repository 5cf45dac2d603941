"""The field types that more than one params section uses: devices, dtypes, model names and the enumerations.

They live below ``mmw.params`` and ``mmw.quality.params`` so that both can use them without importing each other.
Light on purpose (pydantic only): every stage imports it before any heavy work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator

DEVICES = "auto, cpu, cuda, cuda:N"
MODEL_SPECS = ("embedded:<name>, a local HF model folder, a local .gguf file, or a Hugging Face hub id "
               "(cached or online)")

# Each enumeration once: the Literal is the type, ``get_args`` its values.
Dtype = Literal["auto", "fast", "float32", "float16", "bfloat16"]
Engine = Literal["transformers", "vllm"]
#: detect.device (mmw.watermark.detector.DEVICES reads it).
DetectDevice = Literal["auto", "cpu", "cuda", "reference"]
RateMode = Literal["auto", "greedy", "expected"]
#: ``prompts.pool``: which prompts the core tasks (book_report, story, fake_news) draw from. ``paper``: the paper's
#: lists only (100 / 96 / 100); ``extended``: those first, then the ones written for mmw (350 / 354 / 350;
#: mmw.tasks). A range inside the paper's pool is the same prompts in both.
PromptPool = Literal["paper", "extended"]
JudgeBackend = Literal["transformers", "vllm", "openai"]
#: engine.decode_attention (mmw.engines.attention): a decoding step's attention on CUDA.
DecodeAttention = Literal["flex", "efficient", "sdpa"]
#: engine.compile_mode: torch.compile's mode for the watermark step (mmw.watermark.processor).
CompileMode = Literal["reduce-overhead", "default", "max-autotune", "max-autotune-no-cudagraphs"]
DTYPES: tuple[str, ...] = get_args(Dtype)
DETECT_DEVICES: tuple[str, ...] = get_args(DetectDevice)
RATE_MODES: tuple[str, ...] = get_args(RateMode)


def choices(kind: Any) -> str:
    """The values of a ``Literal`` as an error's allowed text: "auto, cpu, cuda"."""
    return ", ".join(get_args(kind))


def _device(value: str) -> str:
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise ValueError(f"unknown device {value!r}")


def _model_name(value: str) -> str:
    """Cheap form checks (no import of the loader); ``mmw.board`` and the loader resolve the name."""
    if not value.strip():
        raise ValueError(f"expected a model name, got {value!r}")
    path = Path(value).expanduser()
    looks_like_path = path.is_absolute() or value.startswith((".", "~")) or value.endswith(".gguf") \
        or value.count("/") > 1
    if looks_like_path and not path.exists():
        raise ValueError(f"path {value!r} does not exist")
    return value


Device = Annotated[str, AfterValidator(_device)]
ModelName = Annotated[str, AfterValidator(_model_name)]
