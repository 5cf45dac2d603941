"""Quality-measure registry: ``quality.metrics: [task, perplexity, ...]`` -> the :class:`QualityMetric` classes.

Each name maps to the module that defines its class (the subclass of QualityMetric whose ``name`` is that name).
The order is that of data/quality/scores.parquet's columns, quality.json's numbers and summary.md's columns.
Adding a measure = one class + one line here (and its name in ``quality.metrics`` to compute it).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from functools import cache

from mmw.errors import SpecError
from mmw.quality.base import QualityMetric
from mmw.quality.params import QualityParams

QUALITY_METRICS: dict[str, str] = {
    "task": "mmw.quality.task_measures",
    "perplexity": "mmw.quality.perplexity",
    "repetition": "mmw.quality.repetition",
    "mauve": "mmw.quality.mauve",
}


@cache
def metric_class(name: str) -> type[QualityMetric]:
    """The QualityMetric subclass registered under ``name``; SpecError naming ``quality.metrics`` if unknown."""
    if name not in QUALITY_METRICS:
        raise SpecError("quality.metrics", f"unknown metric {name!r}", list(QUALITY_METRICS))
    module = importlib.import_module(QUALITY_METRICS[name])
    found = [obj for obj in vars(module).values()
             if inspect.isclass(obj) and issubclass(obj, QualityMetric) and obj.__dict__.get("name") == name]
    if len(found) != 1:
        raise ImportError(f"{module.__name__} must define exactly one QualityMetric with name={name!r}, "
                          f"found {len(found)}")
    return found[0]


def metric_classes() -> tuple[type[QualityMetric], ...]:
    """Every registered measure, in registry order."""
    return tuple(metric_class(name) for name in QUALITY_METRICS)


def check_metric_names(names: Sequence[str]) -> None:
    """SpecError naming ``quality.metrics`` for a name no measure has (params validation cannot: it would import
    the measures into every stage)."""
    for name in names:
        metric_class(name)


def build_metrics(settings: QualityParams) -> list[QualityMetric]:
    """The measures ``settings.metrics`` chose, built (a measure that cannot run here refuses now)."""
    check_metric_names(settings.metrics)
    return [metric_class(name)(settings) for name in settings.metrics]
