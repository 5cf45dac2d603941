"""Samplers C1-C4 (+ plain sampling for the unwatermarked baseline).

The registry reads the declarations (``mmw.watermark.samplers.parts``, no torch); an implementation (torch) is imported
when :func:`build_sampler` first builds it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING

from mmw.watermark.samplers.parts import DECLARED, LABELS, WATERMARKING
from mmw.watermark.scheme_values import SchemeValues

if TYPE_CHECKING:
    from mmw.watermark.samplers.base import Sampler


def implementation(name: str) -> type[Sampler]:
    """The class that samples and scores for the sampler ``name``: the subclass of its declaration in the module
    the declaration names (imported here, hence torch)."""
    declared = DECLARED[name]
    module = importlib.import_module(declared.implementation)
    found = [obj for obj in vars(module).values() if isinstance(obj, type) and issubclass(obj, declared)
             and obj.__module__ == module.__name__ and not inspect.isabstract(obj)]
    if len(found) != 1:
        raise ImportError(f"{declared.implementation} must define exactly one subclass of {declared.__name__}, "
                          f"found {len(found)}")
    return found[0]


def build_sampler(spec: SchemeValues, key: int, vocab_size: int) -> Sampler:
    return implementation(spec.sampler)(spec, key, vocab_size)


__all__ = ["DECLARED", "LABELS", "WATERMARKING", "build_sampler", "implementation"]
