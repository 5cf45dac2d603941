"""Byte-code for everything a configuration run imports, as an installation has it, before a timed run:
    python3 bench/bytecode.py MODULE [MODULE ...]

Imports the modules named, then (only where ``sys.pycache_prefix`` is set: the lent GPU machine's read-only
site-packages, bench/gpu_fullscale.py) byte-compiles every package they brought in, whole, and the standard library,
into that prefix, with a worker a core. Prints one JSON line: the seconds of each part and the files compiled.

Why whole packages: pip compiles every module of a package when it installs it, so a process on a normal
installation never compiles source. Under a prefix, Python reads byte-code only from the prefix (the image's own
``__pycache__`` folders, if any, are ignored), so a process compiles every module the warm-up did not import. With
the warm-up importing only the stages' top-level modules, a machine's first configuration compiled Dynamo's,
Inductor's and Triton's modules, imported lazily at the first compilation, inside its first generation stage (and
each compile worker did the same), a cost no installed machine pays and no later process repeated.
"""

from __future__ import annotations

import compileall
import importlib
import json
import os
import re
import sys
import sysconfig
import time
from pathlib import Path

#: Modules a GPU run imports only when it first compiles; imported here so their packages are compiled too.
LAZY = ("torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codegen.triton", "triton", "sympy")
#: Folders no run imports (the standard library's own tests and demos): skipped to save the machine's time.
SKIP = re.compile(r"[/\\](test|tests|idlelib|tkinter|turtledemo|lib2to3|ensurepip)[/\\]")


def package_roots() -> list[Path]:
    """The top-level package folders (or single-file modules) of every module loaded, outside the standard
    library, each once."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    roots: set[Path] = set()
    for name, module in list(sys.modules.items()):
        top = sys.modules.get(name.partition(".")[0])
        path = getattr(top, "__path__", None)
        if path:
            roots.update(Path(p).resolve() for p in list(path))
        elif getattr(top, "__file__", None) and str(top.__file__).endswith(".py"):
            roots.add(Path(top.__file__).resolve())
    return sorted(r for r in roots if r.exists() and stdlib not in r.parents and r != stdlib)


def main(modules: list[str]) -> dict:
    t0 = time.perf_counter()
    for name in [*modules, *LAZY]:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a module missing here (triton on a CPU) is not this run's concern
            if name in modules:
                raise
            print(f"bytecode: {name} not imported ({type(err).__name__})", file=sys.stderr)
    result = {"imports_s": round(time.perf_counter() - t0, 1), "prefix": sys.pycache_prefix}
    if not sys.pycache_prefix:
        return result
    t0 = time.perf_counter()
    workers = os.cpu_count() or 1
    targets = [*package_roots(), Path(sysconfig.get_paths()["stdlib"])]
    for target in targets:  # a file that does not compile (a newer syntax's test module) is left as it is
        if target.is_dir():
            compileall.compile_dir(target, quiet=2, workers=workers, rx=SKIP)
        else:
            compileall.compile_file(target, quiet=2)
    files = sum(1 for _ in Path(sys.pycache_prefix).rglob("*.pyc"))
    result.update(compile_s=round(time.perf_counter() - t0, 1), roots=len(targets), pyc_files=files)
    return result


if __name__ == "__main__":
    print(json.dumps({"bytecode": main(sys.argv[1:])}), flush=True)
