"""The one place where mmw changes transformers' internals, and the versions it was checked against.

mmw's CUDA paths (:mod:`mmw.engines.attention`) need three things transformers does not offer as an API:

1. **The "sdpa" attention function replaced while a block runs** (:func:`sdpa_function_replaced`): written into the
   override slot of ``transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS`` (its private ``_local_mapping``) and
   put back after. Used for the decoding step's reproducible kernels and the judge's widened attention.
2. **transformers' GQA rule replaced while a block runs** (:func:`gqa_rule_replaced`):
   ``transformers.integrations.sdpa_attention.use_gqa_in_sdpa`` refuses SDPA's GQA kernel under a mask; the
   replacement drops that condition (the grouped-heads speed-up).
3. **Keyword arguments of a model's forward reach the attention function**: the static decode loop passes its
   per-step state as :data:`DECODE_WINDOW_KWARG` (``mmw.engines.graph_decode``), which transformers forwards through
   every decoder layer to the attention function.

A fourth change needs no version check: inside the static decode loop on CUDA, :mod:`mmw.engines.fused_layers`
swaps the model's RMS-norm and gated-MLP ``forward`` and its modeling module's ``apply_rotary_pos_emb`` for
``torch.compile``d versions of those same functions (params ``engine.fuse_layers``), and puts them back after; it
reads no internal name beyond those it replaces, and a model without them is left as it is.

Each of the three was read and tested against the transformers versions in :data:`PATCHED_VERSIONS` (5.17.0: the
GPU image the CUDA numbers in docs/GPU.md were measured on; 5.19.0: the CPU setup's pin, tests/test_attention.py).
Another version may have moved any of them, silently: then the patch would change nothing, or the wrong thing. So
every patch calls :func:`require_patched_version` when it is applied, which raises :class:`TransformersVersionError`
naming the installed and the supported versions. Nothing here runs on a CPU path (the patches apply to CUDA models
only), so a CPU run works with any transformers the package accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mmw.engines import ahead

#: transformers versions whose internals the patches below were read and tested against.
PATCHED_VERSIONS = ("5.17.0", "5.19.0")
#: The forward keyword the static decode loop passes its ``DecodeWindow`` under (patch 3).
DECODE_WINDOW_KWARG = "mmw_decode_window"


class TransformersVersionError(RuntimeError):
    """The installed transformers is not one whose internals mmw's CUDA patches were checked against."""


def installed_version() -> str:
    import transformers

    return str(transformers.__version__)


def require_patched_version(version: str | None = None) -> None:
    """Raise :class:`TransformersVersionError` unless ``version`` (default: the installed transformers) is one of
    :data:`PATCHED_VERSIONS`."""
    version = installed_version() if version is None else version
    if version not in PATCHED_VERSIONS:
        raise TransformersVersionError(
            f"mmw.engines.transformers_patches changes transformers internals on CUDA (the sdpa attention override "
            f"slot, use_gqa_in_sdpa, forward kwargs reaching attention) and was checked against transformers "
            f"{', '.join(PATCHED_VERSIONS)}; installed: {version}. Install one of those versions, or check the "
            f"three patches against {version} and add it to PATCHED_VERSIONS")


@contextmanager
def sdpa_function_replaced(replace: Callable[[Any], Any]) -> Iterator[None]:
    """transformers' "sdpa" attention function replaced by ``replace(current function)`` while the block runs (in
    transformers' own override slot), and put back after (patch 1)."""
    require_patched_version()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with ahead.swapped(ALL_ATTENTION_FUNCTIONS._local_mapping, "sdpa", replace(ALL_ATTENTION_FUNCTIONS["sdpa"])):
        yield


def sdpa_module() -> Any:
    """``transformers.integrations.sdpa_attention`` when it has the GQA rule this module replaces, else None."""
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return None
    return sdpa_attention if hasattr(sdpa_attention, "use_gqa_in_sdpa") else None


@contextmanager
def gqa_rule_replaced(rule: Callable[[Any, Any, Any], bool]) -> Iterator[None]:
    """``use_gqa_in_sdpa`` is ``rule`` while the block runs, transformers' own after (patch 2). Every entry with the
    same ``rule`` installs the same object (a compiled layer that calls it keeps its graph)."""
    require_patched_version()
    with ahead.swapped(sdpa_module(), "use_gqa_in_sdpa", rule):
        yield

