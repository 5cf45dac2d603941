"""The watermark's front door: the processor (generation) and the detector of any scheme.

A scheme of mmw's own blocks gets :class:`mmw.watermark.processor.WatermarkProcessor` and
:class:`mmw.watermark.detector.Detector`; a plugin scheme (``scheme.sampler: plugin``) gets their plugin adapters,
which subclass them (``mmw.watermark.plugin_generation``, ``mmw.watermark.plugin_detection``). Every stage, engine
and sweep builds through here. The processor side imports torch and transformers; import it where generation runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mmw.watermark.detector import Detector
from mmw.watermark.plugin_detection import PluginSchemeDetector
from mmw.watermark.plugins import DetectionModel
from mmw.watermark.scheme import SchemeSpec

if TYPE_CHECKING:
    from mmw.watermark.processor import RecordingLogitsProcessor


def build_processor(spec: SchemeSpec | None, key: int | None, vocab_size: int, row_seeds: Sequence[int],
                    temperature: float, compiled: bool | None = None,
                    compile_mode: str | None = None) -> RecordingLogitsProcessor:
    """The processor of one batch of rows (``row_seeds``: one 64-bit seed per row): mmw's own (``spec`` None:
    plain sampling; ``compiled``/``compile_mode`` from params ``engine``, as ``WatermarkProcessor`` takes them) or
    a plugin's. Imports torch."""
    if spec is not None and spec.is_plugin:
        from mmw.watermark.plugin_generation import PluginProcessor

        return PluginProcessor(spec, key, vocab_size, row_seeds, temperature)
    from mmw.watermark.processor import WatermarkProcessor

    return WatermarkProcessor(spec, key, vocab_size, row_seeds, temperature, compiled, compile_mode)


def build_detector(spec: SchemeSpec, key: int, vocab_size: int, device: str = "auto",
                   model: DetectionModel | None = None) -> Detector:
    """The detector of a scheme: mmw's own (``device``: its backend) or a plugin's, which brings its own scoring
    (``model``: what a plugin that ``needs_model`` gets, see ``mmw.watermark.plugin_detection.needs_model``)."""
    if spec.is_plugin:
        return PluginSchemeDetector(spec, key, vocab_size, model)
    return Detector(spec, key, vocab_size, device=device)
