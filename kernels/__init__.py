"""Numba twins of the detector's per-token and per-text work (imported as ``mmw.kernels``).

- ``prf``: the PRF (docs/PRF.md) as ``register_jitable`` functions;
- ``stats``: seeds, per-token statistics, unit ids, the hash set and the edit-DP cell — the one specification
  of the math, shared by both twins;
- ``cpu``: ``@njit(parallel=True)`` traversals; ``cuda``: ``@cuda.jit`` kernels;
- ``backend``: ``NumbaBackend``, the detector's batch interface, choosing the twin (``device='auto'|'cpu'|'cuda'``).
"""
