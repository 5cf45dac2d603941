"""Params sections ``quality:`` (stage ``quality``) and ``low_entropy:`` (stage ``low_entropy_inputs``).

Both are optional in params.yaml: a board without them gets these defaults, so older boards keep validating.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, field_validator

from mmw.model_fields import DEVICES, DTYPES, MODEL_SPECS, Device, Dtype, ModelName
from mmw.validation import Integer, Section, allowed

#: The measures computed when ``quality.metrics`` is left out (the names are those of mmw.quality.registry, which
#: checks them: validating params must not import the measures, or every stage would depend on them).
DEFAULT_METRICS = ("task", "repetition", "perplexity", "mauve")


def _metrics(value: list[str]) -> list[str]:
    if len(set(value)) != len(value):
        raise ValueError(f"duplicate metric in {value}")
    return value


class QualityParams(Section):
    """``scorer``: the local model whose log-probabilities give perplexity and whose last hidden states are the
    MAUVE features (no hub download). ``max_tokens``: each text is scored on its first ``max_tokens`` tokens.
    ``sandbox``: how generated code is isolated (:mod:`mmw.sandbox`): ``bwrap`` (OS namespaces; refused where
    bubblewrap does not work) or ``unsafe`` (the explicit opt-in to weaker layers, recorded in quality.json)."""

    metrics: Annotated[list[str], AfterValidator(_metrics)] = allowed(
        f"a list of {', '.join(DEFAULT_METRICS)}", default=list(DEFAULT_METRICS))
    scorer: ModelName = allowed(MODEL_SPECS, default="embedded:smollm2-135m")
    device: Device = allowed(DEVICES, default="auto")
    dtype: Dtype = allowed(", ".join(DTYPES), default="auto")
    batch_size: Integer = allowed("an integer >= 1", default=8, ge=1)
    max_tokens: Integer = allowed("an integer >= 8", default=512, ge=8)
    mauve_buckets: int | str = allowed("auto or an integer >= 2", default="auto")
    sandbox_timeout_s: float = allowed("a number in (0, 600]", default=10.0, gt=0.0, le=600.0)
    sandbox_memory_mb: Integer = allowed("an integer in [64, 65536]", default=1024, ge=64, le=65536)
    # The values of mmw.sandbox.MODES, spelled out so that validating params does not import the sandbox (a test
    # keeps the two equal).
    sandbox: Literal["bwrap", "unsafe"] = allowed("bwrap, unsafe", default="bwrap")

    @field_validator("mauve_buckets")
    @classmethod
    def _buckets(cls, value: int | str) -> int | str:
        if value != "auto" and not (isinstance(value, int) and value >= 2):
            raise ValueError(f"expected auto or an integer >= 2, got {value!r}")
        return value


class LowEntropyParams(Section):
    """The V3 inputs: the pipeline's own book reports, unwatermarked, sampled at ``temperature`` (paper: 1.0)."""

    temperature: float = allowed("a number in (0, 100]", default=1.0, gt=0.0, le=100.0)
