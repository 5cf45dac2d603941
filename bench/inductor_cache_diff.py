"""What two Inductor caches hold differently: the kernels and graph code each compiled, and the launch settings
Inductor picked by timing (``.best_config``), to find which compiled piece makes two fresh caches generate other
texts (bench/results/gpu.md, "The texts follow the compiler cache").

    python bench/inductor_cache_diff.py manifest CACHE_DIR LABEL FILE.json   # add CACHE_DIR's manifest as LABEL
    python bench/inductor_cache_diff.py diff FILE.json LABEL_A LABEL_B       # what differs between two

A file of Inductor's cache is named by a hash of its source, so the same kernel source has the same name in every
cache; a name in one cache only is code the other did not generate. Nothing here reads the kernels' binaries.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: Keys of a ``.best_config`` that differ between caches without a different choice.
VARYING = frozenset({"found_by_coordesc", "time_taken_ms", "triton_cache_hash"})
#: Inductor's names for reduction kernels (looped and persistent).
REDUCTION = re.compile(r"triton_(red|per)_")


def manifest(cache: Path) -> dict[str, dict[str, object]]:
    """``{name: {"kind", "best_config"}}`` for the generated Python files (Triton kernels, a graph's wrapper code)
    under ``cache`` (Inductor's cache folder), with the settings timed for a kernel where Inductor kept them."""
    entries: dict[str, dict[str, object]] = {}
    for path in sorted(cache.rglob("*.py")):
        text = path.read_text(errors="replace")
        kind = "triton" if "@triton.jit" in text else "graph" if "def call(" in text else "other"
        # Inductor keeps a kernel's timed settings beside it, named by a hash of the kernel's file name and torch's
        # own sources: paired here where the folder holds this one kernel (as every folder of the probed caches did).
        timed = sorted(path.parent.glob("*.best_config"))
        kernels = [p for p in path.parent.glob("*.py") if "@triton.jit" in p.read_text(errors="replace")]
        config = json.loads(timed[0].read_text()) if kind == "triton" and len(timed) == 1 and kernels == [path] \
            else None
        if isinstance(config, dict):  # the timing itself and the file's own hashes differ run to run
            config = {k: v for k, v in config.items() if k not in VARYING}
        kernel = re.search(r"def (triton_\w+)\(", text) if kind == "triton" else None
        entries[path.name] = {"kind": kind, "best_config": config, "kernel": kernel.group(1) if kernel else None}
    return entries


def diff(a: dict[str, dict[str, object]], b: dict[str, dict[str, object]]) -> list[str]:
    """Lines naming the files in one manifest only (by kind) and the kernels whose timed settings differ."""
    lines = []
    for label, left, right in (("only in A", a, b), ("only in B", b, a)):
        names = sorted(set(left) - set(right))
        kinds = {kind: sum(left[n]["kind"] == kind for n in names) for kind in ("triton", "graph", "other")}
        lines.append(f"{label}: {len(names)} files {kinds}")
        lines += [f"  {n} ({left[n]['kind']})" for n in names]
    settled = [n for n in sorted(set(a) & set(b)) if a[n]["best_config"] != b[n]["best_config"]]
    lines.append(f"in both, timed settings differ: {len(settled)} of {len(set(a) & set(b))}")
    # A reduction's settings (triton_red_*, triton_per_*) set the order its sums run in; a pointwise kernel's do not.
    lines += [f"  {n} {a[n].get('kernel') or ''}{' (a reduction)' if REDUCTION.match(a[n].get('kernel') or '') else ''}"
              f": {a[n]['best_config']} | {b[n]['best_config']}" for n in settled]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "manifest":
        out = Path(argv[3])
        book = json.loads(out.read_text()) if out.is_file() else {}
        book[argv[2]] = manifest(Path(argv[1]))
        out.write_text(json.dumps(book, sort_keys=True))
        print(f"{argv[2]}: {len(book[argv[2]])} files")
        return 0
    if len(argv) == 4 and argv[0] == "diff":
        book = json.loads(Path(argv[1]).read_text())
        print("\n".join(diff(book[argv[2]], book[argv[3]])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
