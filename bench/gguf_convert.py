"""The one-time conversion of an embedded GGUF model into the HF-format cache folder: seconds and peak memory.

Converts into a fresh temporary cache directory (nothing reused), prints one JSON line: seconds, the process's
peak resident memory (GiB), the folder's size on disk. Whole-process timing from outside (start-up included) is
what the RESULTS table quotes; the JSON's seconds cover the conversion alone.

    python bench/gguf_convert.py --model smollm2-135m
"""

from __future__ import annotations

import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import typer

from mmw.engines.models import EMBEDDED_PREFIX, resolve_source


def main(model: str = "smollm2-135m", keep: bool = False) -> None:
    cache = Path(tempfile.mkdtemp(prefix="mmw-gguf-"))
    try:
        # a multi-part model is first assembled into the temporary cache too (a copy and a sha256: seconds)
        t0 = time.perf_counter()
        folder = Path(resolve_source(EMBEDDED_PREFIX + model, cache))
        seconds = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(json.dumps({"model": model, "convert_s": round(seconds, 2),
                          "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                          "folder_bytes": size}), flush=True)
    finally:
        if not keep:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    typer.run(main)
