"""Samplers C1-C4 (+ plain sampling for the unwatermarked baseline)."""

from mmw.samplers.base import Plain, Sampler
from mmw.samplers.binary import Binary
from mmw.samplers.distribution_shift import DistributionShift
from mmw.samplers.exponential import Exponential
from mmw.samplers.inverse_transform import InverseTransform

SAMPLERS: dict[str, type[Sampler]] = {
    cls.name: cls for cls in (Exponential, InverseTransform, Binary, DistributionShift, Plain)
}


def build_sampler(spec, key: int, vocab_size: int) -> Sampler:
    return SAMPLERS[spec.sampler](spec, key, vocab_size)


__all__ = ["SAMPLERS", "Sampler", "build_sampler"]
