"""Inductor's settings for every graph mmw compiles (the generator's fused layer pieces and flex decoding, the
watermark step, the judge's layers): one home, so every compile gets the same arithmetic guarantees. Below the
engines, the watermark and the judge, which all import it; torch is imported only when a compile asks."""

from __future__ import annotations

from typing import Any


def inductor_options(mode: str | None = None) -> dict[str, Any]:
    """``torch.compile`` options for every graph mmw compiles: ``mode``'s own settings (None: the default mode) with
    Inductor's deterministic mode on, where this torch has it.

    Why: with Inductor's cache empty, a reduction's launch settings are timed on the device the first time it runs
    and the fastest is kept in the cache, and two settings that time alike sum in another order. On H100s the
    decoding step's RMS norm (296 rows x 4,096) kept 2,048 or 4,096 elements a block from one fresh cache to the
    next, and the generated texts followed that choice (10 runs of 10 on two machines; bench/results/gpu.md). The
    deterministic mode picks a reduction's settings by a fixed rule instead, so fresh caches compile one arithmetic
    (pointwise kernels are still timed: their settings cannot change a number). It is passed with each compile, not
    set once in ``torch._inductor.config`` (or by ``TORCHINDUCTOR_DETERMINISTIC=1``): after every frame it traces,
    Dynamo puts back ``torch.use_deterministic_algorithms``, which writes that global too (torch 2.11-2.13), so a
    global setting reaches only a process's first compile."""
    from torch._inductor import config, list_mode_options

    options = dict(list_mode_options(mode) if mode and mode != "default" else {})
    if hasattr(config, "deterministic"):
        options["deterministic"] = True
    return options
