"""Are two full-scale runs' outputs the same? Compares every table under ``<workdir>/data`` (parquet: equal frames,
nulls and float bits included) and every JSON report under ``<workdir>/reports`` (timings and provenance left out:
they hold seconds, dates and paths) of two ``bench/gpu_fullscale.py`` work folders; prints one line per file that
differs and a summary line.

    python3 bench/gpu_compare_runs.py /tmp/mmw-full-before_warm /tmp/mmw-full-after_warm [--out FILE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

SKIPPED = ("timings", "provenance")


def outputs(root: Path) -> dict[str, Path]:
    found = {}
    for sub, pattern in (("data", "*.parquet"), ("reports", "*.json")):
        for path in sorted((root / sub).rglob(pattern)):
            relative = path.relative_to(root)
            if not any(part in SKIPPED for part in relative.parts):
                found[str(relative)] = path
    return found


def same(a: Path, b: Path) -> bool:
    if a.suffix == ".parquet":
        return pl.read_parquet(a).equals(pl.read_parquet(b), null_equal=True)
    return json.loads(a.read_text()) == json.loads(b.read_text())


def main(first: str, second: str, out: str = "") -> None:
    a, b = outputs(Path(first)), outputs(Path(second))
    differing = [name for name in sorted(set(a) & set(b)) if not same(a[name], b[name])]
    result = {"compared": len(set(a) & set(b)), "only_first": sorted(set(a) - set(b)),
              "only_second": sorted(set(b) - set(a)), "differing": differing}
    for name in differing:
        print("differs:", name)
    print(json.dumps({k: v if not isinstance(v, list) else len(v) for k, v in result.items()}))
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    args = sys.argv[1:]
    target = args[args.index("--out") + 1] if "--out" in args else ""
    main(args[0], args[1], target)
