"""Measured and dropped: a model folder's safetensors weights read straight into device memory (bench/gpu_load.py
compares it with transformers' own loader; bench/results/gpu.md has the numbers: 3.5-3.8 s against 2.7 s for a
16 GB Llama-3-8B from the page cache on an H200 host, so the library keeps transformers' loader).

Each file is read with plain ``readinto`` calls into two page-locked host buffers whose copies to the device overlap
the next read; the file lands in one device buffer and each tensor is copied out into its own allocation. The model
is built on the device with transformers' ``no_init_weights`` and given the tensors with
``load_state_dict(assign=True)``, each cast to its parameter's dtype, tied weights tied.
"""

from __future__ import annotations

import json
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

CHUNK_BYTES = 128 << 20
READERS = 4
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def read_header(path: Path) -> tuple[int, dict[str, dict]]:
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


def _read_exactly(fh, target: torch.Tensor, path: Path) -> None:
    view = memoryview(target.numpy()).cast("B")
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:
            raise ValueError(f"{path.name} ends before its header's last tensor")
        done += got


def _read_file(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    start, header = read_header(path)
    size = max((entry["data_offsets"][1] for entry in header.values()), default=0)
    whole = torch.empty(size, dtype=torch.uint8, device=device)
    with path.open("rb", buffering=0) as fh:
        fh.seek(start)
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            buffers = [torch.empty(min(CHUNK_BYTES, max(size, 1)), dtype=torch.uint8, pin_memory=True)
                       for _ in range(2)]
            copied: list = [None, None]
            for number, offset in enumerate(range(0, size, CHUNK_BYTES)):
                slot = number % 2
                if copied[slot] is not None:
                    copied[slot].synchronize()
                count = min(CHUNK_BYTES, size - offset)
                _read_exactly(fh, buffers[slot][:count], path)
                with torch.cuda.stream(stream):
                    whole[offset:offset + count].copy_(buffers[slot][:count], non_blocking=True)
                    copied[slot] = torch.cuda.Event()
                    copied[slot].record(stream)
            stream.synchronize()
        else:
            _read_exactly(fh, whole, path)
    return {name: whole[entry["data_offsets"][0]:entry["data_offsets"][1]].view(DTYPES[entry["dtype"]])
            .view(entry["shape"]).clone() for name, entry in header.items()}


def read_weights(folder: Path, device: torch.device) -> dict[str, torch.Tensor]:
    files = safetensors_files(folder)
    tensors: dict[str, torch.Tensor] = {}
    with ThreadPoolExecutor(max_workers=min(READERS, len(files))) as pool:
        for part in pool.map(lambda path: _read_file(path, device), files):
            tensors.update(part)
    return tensors


def from_device_weights(folder: Path, device: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights

    state = read_weights(folder, device)
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    own = model.state_dict()
    loaded = model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False, assign=True)
    model.tie_weights()
    filled = {t.data_ptr() for k, t in model.state_dict().items() if k not in loaded.missing_keys}
    unset = [k for k in loaded.missing_keys if model.state_dict()[k].data_ptr() not in filled]
    if unset or set(state) - set(own):
        raise ValueError(f"tensors missing or unknown: {unset[:3]}")
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(folder)
    return model.eval()
