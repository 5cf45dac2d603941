"""Samplers C1-C4 (+ plain sampling for the unwatermarked baseline)."""

from mmw.samplers.base import Plain, Sampler
from mmw.samplers.binary import Binary
from mmw.samplers.distribution_shift import DistributionShift
from mmw.samplers.exponential import Exponential
from mmw.samplers.inverse_transform import InverseTransform

#: The watermarking samplers, in the paper's order: the values of the scheme's ``sampler``.
WATERMARKING: tuple[type[Sampler], ...] = (DistributionShift, Exponential, InverseTransform, Binary)
#: Every sampler by name, plain sampling (``none``) included.
SAMPLERS: dict[str, type[Sampler]] = {cls.name: cls for cls in (*WATERMARKING, Plain)}
#: Display names of the watermarking samplers (the report's families), in the paper's order.
LABELS: dict[str, str] = {cls.name: cls.label for cls in WATERMARKING}


def build_sampler(spec, key: int, vocab_size: int) -> Sampler:
    return SAMPLERS[spec.sampler](spec, key, vocab_size)


__all__ = ["LABELS", "SAMPLERS", "WATERMARKING", "Sampler", "build_sampler"]
