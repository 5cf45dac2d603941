"""The PRF (docs/PRF.md) as numba functions usable from both ``@njit`` and ``@cuda.jit`` code.

``register_jitable`` compiles the same source for the CPU and, when called from a CUDA kernel, for the GPU:
one specification, two twins. All values are ``uint64``; every constant is typed so numba never promotes to float.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from mmw.watermark import prf as _spec

MUL1 = np.uint64(_spec.MUL1)
MUL2 = np.uint64(_spec.MUL2)
GOLDEN = np.uint64(_spec.GOLDEN)
S30 = np.uint64(30)
S27 = np.uint64(27)
S31 = np.uint64(31)
S12 = np.uint64(12)
UNIT_SCALE = _spec.UNIT_SCALE


@register_jitable
def mix64(x):
    x = x ^ (x >> S30)
    x = x * MUL1
    x = x ^ (x >> S27)
    x = x * MUL2
    return x ^ (x >> S31)


@register_jitable
def prf(seed, x):
    return mix64(seed ^ mix64(np.uint64(x) + GOLDEN))


@register_jitable
def unit(h):
    return (np.float64(h >> S12) + 0.5) * UNIT_SCALE
