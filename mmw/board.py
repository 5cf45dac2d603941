"""The whole params board, checked at once: every section (``mmw.params``) plus the checks that need a consumer's
code (task names and prompt ranges, attack specs, quality measures, installed embedded models).

The ``key`` stage runs this first on every ``dvc repro``, so a typo anywhere on the board fails in seconds; the
other stages validate only the sections they read (their DVC ``params:``) and run their own consumer checks.
This module imports the consumers, which is why it is not part of ``mmw.params`` (every stage imports that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmw.attacks import build_attacks
from mmw.engines import models
from mmw.errors import SpecError
from mmw.params import DEFAULT_PARAMS, Params, check_task_names, parse_params, read_params
from mmw.quality.params import LowEntropyParams, QualityParams
from mmw.quality.registry import check_metric_names
from mmw.watermark.scheme import SchemeSpec
from mmw.tasks import ALL_TASKS, check_range


def _model_installed(value: str, key: str) -> None:
    """An embedded model must be installed (a cheap check that assembles nothing)."""
    if value.startswith(models.EMBEDDED_PREFIX):
        try:
            models.embedded_files(value[len(models.EMBEDDED_PREFIX):])
        except SpecError as err:  # the loader names model.name; this may be rate.judge
            raise SpecError(key, err.problem, err.allowed) from None


def check_board(raw: Any) -> Params:
    """Validate a parsed params mapping completely; raises ``SpecError`` naming the first offending key."""
    params = parse_params(raw, models={"scheme": SchemeSpec, "low_entropy": LowEntropyParams,
                                       "quality": QualityParams})
    check_task_names(params.prompts.tasks, ALL_TASKS)
    check_range(params.prompts.tasks, params.prompts.per_task, params.prompts.offset, params.prompts.pool)
    build_attacks(params.attacks.specs)
    check_metric_names(params.quality.metrics)
    _model_installed(params.model.name, "model.name")
    if params.rate.backend != "openai":  # a served model's name is the server's business
        _model_installed(params.rate.judge, "rate.judge")
    return params


def load_board(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Read a params YAML file and :func:`check_board` it."""
    return check_board(read_params(path))
