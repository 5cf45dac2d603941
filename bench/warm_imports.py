"""What a configuration run imports, imported once before the timed process, so that the byte-code cache is warm as
on an installed machine:  python3 bench/warm_imports.py MODULE [MODULE ...]

Imports the modules named, then those a GPU run imports only at its first compilation (:data:`LAZY`, each where it
is installed), and prints one JSON line with the seconds it took. On the lent GPU machine, whose image carries no
byte-code, a process compiles every module it imports from source the first time (bench/gpu_fullscale.py sets
where the byte-code goes); without this the modules in :data:`LAZY` would be compiled inside the first generation
stage of a machine's first configuration.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

#: Modules a GPU run imports only when it first compiles (Dynamo, Inductor's code generation, Triton, sympy).
LAZY = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.triton", "triton", "sympy")


def main(modules: list[str]) -> dict:
    t0 = time.perf_counter()
    for name in modules:
        importlib.import_module(name)
    named_s = time.perf_counter() - t0
    missing = []
    for name in LAZY:
        try:
            importlib.import_module(name)
        except ImportError:  # triton on a CPU: nothing of it runs there
            missing.append(name)
    return {"named_s": round(named_s, 1), "lazy_s": round(time.perf_counter() - t0 - named_s, 1),
            "lazy_missing": missing}


if __name__ == "__main__":
    print(json.dumps({"warm_imports": main(sys.argv[1:])}), flush=True)
