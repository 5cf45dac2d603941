"""The generator's elementwise layer code fused by Inductor while the static decode loop runs (params
``engine.fuse_layers``; CUDA only).

A decoding step of an 8B Llama at 296 rows ran ~1,500 kernels, ~1,200 of them small eager elementwise kernels of
the decoder layers (the RMS norms' float32 upcast, square, mean, rsqrt and scale; the rotary embedding's slices,
negation, concatenation and products; SiLU and the gate product): 4.2 ms of a 19.7 ms step on one H200, each kernel
a launch and a round trip of its activations through memory. Inside :func:`fused_layers` three pieces of the
model's own code run as ``torch.compile``d versions of themselves:

* every ``*RMSNorm`` class's ``forward`` (one kernel instead of ~6; 2 a layer and the final norm);
* every gated-MLP class's ``forward`` (a module with ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``): the
  activation and the gate product in one kernel, the three matrix products still cuBLAS;
* the model's modeling module's ``apply_rotary_pos_emb`` (one or two kernels instead of ~10), which its attention
  looks up there at every call.

Measured on one H200 (bench/results/gpu.md): 749 kernels a step instead of 1,492, the elementwise share 4.16 ->
1.31 ms, a step 19.7 -> 16.6-16.8 ms. The attention, the cache writes, the residual additions and the matrix products
are transformers' own code, untouched, so the patch does not depend on how a transformers version writes its
attention forward, and a model without these pieces runs as it is. The modules' parameters are graph inputs
(Dynamo's default ``inline_inbuilt_nn_modules``), so one compiled graph serves every layer. Each distinct decoding
step's shape compiles a static graph once and later batches of that shape reuse it (``dynamic=False``, as in the
measurement above. With torch's default, automatic dynamic shapes, the machine's first process decoded no faster
fused than unfused: 22.0 s against 20.6 s of decode loop, one H200; a later process 17.9 s). A batch's prefill, run
once, stays eager (``mmw.engines.graph_decode``). Past Dynamo's recompile limit a new shape runs transformers'
code unfused, which computes the same.

The patches are class and module attributes, so they hold only inside the context and are put back after it (the
judge, a greedy rating or another role sharing the classes runs transformers' code as always). The tokens keep their
law; fused kernels round in another order, so GPU texts differ from the unfused ones in the last bits of some
logits (a param, recorded with the run). A CPU run never enters it (``fuse_default``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from mmw.engines import ahead
from mmw.inductor import inductor_options


#: (owner, attribute) -> the compiled version of the owner's original attribute, made once per process: a second
#: batch or stage reuses its graphs.
_COMPILED: dict[tuple[Any, str], Callable[..., Any]] = {}


def fuse_default(device: torch.device, fuse_layers: bool = True) -> bool:
    """Fuse on CUDA when ``fuse_layers`` (params ``engine.fuse_layers``); a CPU's step is matrix-product bound and a
    compile would cost a C++ toolchain and seconds a process there."""
    return device.type == "cuda" and fuse_layers


def fusable(model: torch.nn.Module) -> list[tuple[Any, str]]:
    """The (owner, attribute) pairs :func:`fused_layers` replaces for ``model``: each RMS-norm class's and each
    gated-MLP class's ``forward``, and ``apply_rotary_pos_emb`` of the module that defines the model's class."""
    targets: list[tuple[Any, str]] = []
    seen: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__name__.endswith("RMSNorm") or all(hasattr(module, part)
                                                    for part in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            targets.append((cls, "forward"))  # its own or an inherited forward: set on the class itself
    modeling = sys.modules.get(type(model).__module__)
    if modeling is not None and callable(getattr(modeling, "apply_rotary_pos_emb", None)):
        targets.append((modeling, "apply_rotary_pos_emb"))
    return targets


@contextmanager
def fused_layers(model: torch.nn.Module, enabled: bool = True) -> Iterator[list[tuple[Any, str]]]:
    """Inside the block, the pieces :func:`fusable` names run compiled (``enabled``; else nothing changes); yields
    the replaced (owner, attribute) pairs. Put back on exit, whatever happens inside."""
    replaced: list[tuple[Any, str]] = []
    with ExitStack() as patches:  # each put back (or inherited again) on exit: mmw.engines.ahead.swapped
        if enabled:
            for owner, name in fusable(model):
                compiled = _COMPILED.get((owner, name))
                if compiled is None:
                    compiled = _COMPILED[(owner, name)] = torch.compile(getattr(owner, name), dynamic=False,
                                                                          options=inductor_options())
                patches.enter_context(ahead.swapped(owner, name, compiled))
                replaced.append((owner, name))
        yield replaced
