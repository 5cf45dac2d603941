"""Summarize ``mutmut results --all true`` output: the score per module and overall, and every mutant not killed.

Usage: python bench/mutation_summary.py RESULTS_TXT [LABEL] [SECONDS]  (bench/mutation.sh calls it).
A mutant counts as killed when a test failed on it (mutmut "killed"); "timeout" (an infinite loop the tests ran
into) is counted as killed too but listed, since the mutant did change observable behaviour.
"""

from __future__ import annotations

import collections
import sys


def module_of(mutant: str) -> str:
    """``mmw.watermark.samplers.binary.xǁBinaryǁunits__mutmut_3`` -> ``mmw.watermark.samplers.binary``."""
    head = mutant.split("__mutmut_")[0]
    parts = head.split(".")
    return ".".join(p for p in parts if not p.startswith("x_") and not p.startswith("xǁ"))


def main(path: str, label: str = "", seconds: str = "") -> None:
    by_module: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    listed = []
    for line in open(path, encoding="utf-8"):
        name, _, state = line.strip().rpartition(": ")
        if not name.startswith("mmw."):
            continue
        by_module[module_of(name)][state] += 1
        if state not in ("killed", "not checked"):
            listed.append(f"{name}: {state}")
    total = collections.Counter()
    for counts in by_module.values():
        total.update(counts)

    def score(c: collections.Counter) -> str:
        """Killed among the mutants checked (an interrupted run leaves some "not checked": not in the ratio)."""
        n = sum(c.values()) - c["not checked"]
        k = c["killed"] + c["timeout"] + c["caught by type check"]
        rest = f", {c['not checked']} not checked" if c["not checked"] else ""
        return (f"{k}/{n} killed ({k / n:.1%}){rest}" if n else f"none checked{rest}")

    print(f"{label}: {score(total)}; {dict(total)}" + (f"; {seconds} s" if seconds else ""))
    for module in sorted(by_module):
        print(f"  {module}: {score(by_module[module])}")
    print("\n".join(listed))


if __name__ == "__main__":
    main(*sys.argv[1:])
