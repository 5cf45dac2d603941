"""DVC's YAML parses with ruamel.yaml's C loader (ruamel.yaml.clib) against its pure-Python loader.

DVC reads dvc.yaml, dvc.lock and params.yaml through ``ruamel.yaml`` (``YAML(typ="safe")``), which uses the C loader
only when ``ruamel.yaml.clib`` is installed (optional since ruamel.yaml 0.19). This times one parse of each of this
checkout's files both ways, interleaved rounds in one process, and checks that both give the same data.

    .venv/bin/python bench/dvc_yaml.py [--rounds 5]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import typer
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]


def _parse_ms(text: str, pure: bool, repeats: int = 10) -> tuple[float, object]:
    started = time.perf_counter()
    for _ in range(repeats):
        data = YAML(typ="safe", pure=pure).load(text)
    return (time.perf_counter() - started) / repeats * 1000, data


def main(rounds: int = 5) -> None:
    from ruamel.yaml.main import CParser

    if CParser is None:
        raise typer.BadParameter("ruamel.yaml.clib is not installed: nothing to compare")
    for name in ("dvc.lock", "dvc.yaml", "params.yaml"):
        text = (ROOT / name).read_text()
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for pure in (True, False):
                ms, data = _parse_ms(text, pure)
                times[pure].append(ms)
                if pure:
                    reference = data
                else:
                    assert data == reference, f"{name}: the C loader read other data"
        pure_ms, c_ms = statistics.median(times[True]), statistics.median(times[False])
        print(f"{name:12s} {len(text):6d} bytes  pure {pure_ms:6.1f} ms  C {c_ms:5.1f} ms  x{pure_ms / c_ms:.1f} "
              f"(medians of {rounds} rounds; pure {min(times[True]):.1f}-{max(times[True]):.1f}, "
              f"C {min(times[False]):.1f}-{max(times[False]):.1f})")


if __name__ == "__main__":
    typer.run(main)
