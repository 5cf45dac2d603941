"""The plugin contract, checked on a tiny synthetic batch before any work (the ``key`` stage runs it, and the test
that ``mmw plugin new`` writes).

What is checked, each failure one line naming the plugin (``SpecError``, exit 2 from a stage):
- the parameters, by the plugin's own model (at validation, before this);
- the processor, built as for a batch of 2 rows and called for 3 steps on random logits at the run's temperature:
  same shape, no NaN/+inf, no row that is -inf everywhere (``mmw.watermark.plugin_generation.preflight``);
- the detector, on one random text of 48 tokens (given a ``mmw.watermark.plugin_detection.SyntheticModel`` when it ``needs_model``):
  ``Pivots`` with a declared null, finite, counting evidence downwards and aligned with the text, or p-values in
  [0, 1] one per prefix; and the kind its ``no_pivot_reason`` announces (``mmw.watermark.plugin_detection.preflight_detector``).

A synthetic batch cannot show that a detector's null is right; the FPR tests of each adapter (tests/test_plugins.py,
bench/plugins.py) do that on real null text.
"""

from __future__ import annotations

from typing import Any

from mmw.watermark.plugin_detection import SyntheticModel  # noqa: F401  (part of the contract's API)
from mmw.watermark.scheme import SchemeSpec

#: The vocabulary of the synthetic batch when the generator's is not given (the scaffold's test).
SYNTHETIC_VOCAB = 1000


def check_contract(spec: SchemeSpec, key: int, vocab_size: int = SYNTHETIC_VOCAB, temperature: float = 1.0) -> None:
    """Run a plugin scheme's processor and detector on a tiny synthetic batch; SpecError naming the plugin on the
    first broken rule (module docstring)."""
    from mmw.watermark.plugin_detection import preflight_detector
    from mmw.watermark.plugin_generation import preflight

    preflight(spec, key, vocab_size, temperature)
    preflight_detector(spec, key, vocab_size)


def check_plugin(name: str, params: dict[str, Any] | str | None = None, key: int = 0x5EED_C0DE,
                 vocab_size: int = SYNTHETIC_VOCAB, temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)) -> SchemeSpec:
    """The contract check of the installed plugin ``name`` with ``params`` at each of ``temperatures``: the
    validated scheme, or SpecError. What a plugin package's own test calls (``mmw plugin new``)."""
    spec = SchemeSpec.from_params({"sampler": "plugin", "plugin": name, "plugin_params": params})
    for temperature in temperatures:
        check_contract(spec, key, vocab_size, temperature)
    return spec
