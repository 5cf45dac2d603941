"""The registries derived from the samplers' declarations (``mmw.watermark.samplers.parts``) against what uses them:
a new sampler is its declaration, its class, its kernel statistic and its params line, and these tests fail when
one of the derived lists drifts from the declarations.

- kernel codes: ``mmw.kernels.stats`` numbers the samplers as their declarations do, and every code has its
  statistic (a code without its branch in ``token_statistic`` / ``token_unit`` falls through to another
  sampler's, and its values then differ from the sampler's own numpy statistic);
- scheme keys: the generation-only keys are the declared ones, and dvc.yaml's detection stages list the others;
- the sweep's identity keys: the first keys plus every key declared since are the scheme's keys;
- the kernel tests run every declared sampler.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import yaml

from mmw.kernels import stats
from mmw.kernels.backend import SamplerArrays
from mmw.sweep.definition import FIRST_SCHEME_KEYS, LATER_SCHEME_KEYS, SCHEME_KEYS
from mmw.validation import Key
from mmw.watermark.prf import key_from_string
from mmw.watermark.samplers import build_sampler
from mmw.watermark.samplers.parts import DECLARED, KERNEL_CODES, WATERMARKING
from mmw.watermark.scheme import DETECTION_KEYS, GENERATION_ONLY, KNOWN_KEYS, SchemeSpec

REPO = Path(__file__).resolve().parents[1]
KEY = key_from_string("declarations test key")
VOCAB = 64
#: Values for keys a sampler requires and does not default (a new required key must be added here).
REQUIRED = {"delta": 2.0}


def declared_spec(name: str) -> SchemeSpec:
    """The scheme of sampler ``name`` with its declared defaults (window-1 randomness, sum score)."""
    declared = DECLARED[name]
    needed = {r.name: REQUIRED[r.name] for r in declared.scheme_keys
              if isinstance(r, Key) and r.required and r.name in REQUIRED}
    missing = [r.name for r in declared.scheme_keys if isinstance(r, Key) and r.required and r.name not in REQUIRED]
    assert not missing, f"give tests/test_declarations.py REQUIRED a value for {missing}"
    return SchemeSpec.from_params({"sampler": name, "randomness": "window", "window": 1, "score": "sum", **needed})


def test_kernel_codes_number_the_declared_samplers():
    coded = [cls.name for cls in WATERMARKING if cls.kernel_statistic]
    assert list(KERNEL_CODES) == coded and sorted(KERNEL_CODES.values()) == list(range(1, len(coded) + 1))
    assert stats.SAMPLER_CODES == KERNEL_CODES
    # every built-in sampler is scored by the kernels; plain sampling and plugins are not
    assert {cls.name for cls in WATERMARKING if not cls.kernel_statistic} == {"plugin"}
    assert not DECLARED["none"].kernel_statistic


@pytest.mark.parametrize("name", list(KERNEL_CODES))
def test_every_kernel_code_has_its_statistic(name: str):
    """The kernels' statistic and unit of each coded sampler (the shared spec run as Python, as in the CUDA
    simulator) equal the sampler's own numpy ``statistic`` and ``units``."""
    sampler = build_sampler(declared_spec(name), KEY, VOCAB)
    arrays = SamplerArrays.of(sampler)
    assert arrays.kind == KERNEL_CODES[name]
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, 24).astype(np.int64)
    seeds = rng.integers(0, 2**63, 24, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    want = sampler.statistic(tokens, seeds)
    tables = (arrays.gamma, arrays.rank, arrays.denominator, arrays.path_nodes, arrays.path_bits)
    with np.errstate(over="ignore"):  # the PRF's 64-bit products wrap by design
        got = [stats.token_statistic(arrays.kind, np.int64(t), np.uint64(s), *tables) for t, s in zip(tokens, seeds)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{name}: token_statistic")
    positions, ids, values = sampler.units(tokens, seeds)
    kernel = []
    with np.errstate(over="ignore"):
        for t, s in zip(tokens, seeds):
            for k in range(stats.unit_count(arrays.kind, np.int64(t), arrays.path_nodes)):
                kernel.append(stats.token_unit(arrays.kind, np.int64(t), np.uint64(s), k, *tables))
    assert [int(h) for h, _ in kernel] == [int(i) for i in ids], f"{name}: token_unit ids"
    np.testing.assert_allclose([v for _, v in kernel], values, rtol=1e-12, atol=1e-12, err_msg=f"{name}: units")


def test_generation_only_keys_are_the_declared_ones_and_dvc_yaml_lists_the_rest():
    rules = [rule for cls in DECLARED.values() for rule in cls.scheme_keys if isinstance(rule, Key)]
    declared = {r.name for r in rules if r.generation_only} - {r.name for r in rules if not r.generation_only}
    assert set(GENERATION_ONLY) == declared
    assert set(DETECTION_KEYS) == set(KNOWN_KEYS) - declared
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in ("detect_baseline", "detect_watermarked"):
        listed = {p.removeprefix("scheme.") for p in stages[name].get("params", [])
                  if isinstance(p, str) and p.startswith("scheme.")}
        assert listed == set(DETECTION_KEYS), f"dvc.yaml {name}: {sorted(listed ^ set(DETECTION_KEYS))}"
    for board in ("params.yaml", "params-full.yaml"):
        scheme = yaml.safe_load((REPO / board).read_text())["scheme"]
        assert set(scheme) == set(KNOWN_KEYS), f"{board}: {sorted(set(scheme) ^ set(KNOWN_KEYS))}"


def test_the_sweep_identity_keys_are_the_first_keys_and_every_later_declared_one():
    assert set(FIRST_SCHEME_KEYS) <= set(SCHEME_KEYS)
    assert set(LATER_SCHEME_KEYS) == set(SCHEME_KEYS) - set(FIRST_SCHEME_KEYS)


def test_the_kernel_tests_run_every_declared_sampler():
    """tests/test_kernels.py's SAMPLERS (the twins against the reference) holds every sampler the kernels score."""
    tree = ast.parse((REPO / "tests" / "test_kernels.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SAMPLERS")
    SAMPLERS = ast.literal_eval(node.value)
    assert {params["sampler"] for params in SAMPLERS.values()} == set(KERNEL_CODES)
