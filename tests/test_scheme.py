"""SchemeSpec validation: every meaningless combination fails with the key named and the allowed values."""

import subprocess
import sys
from pathlib import Path

import pytest

from mmw.errors import SpecError
from mmw.watermark.samplers import DECLARED, LABELS, WATERMARKING, implementation
from mmw.watermark.samplers.base import Sampler
from mmw.watermark.scheme import SAMPLERS, SchemeSpec

ROOT = Path(__file__).resolve().parents[1]

OK = [
    dict(sampler="distribution_shift", randomness="window", window=1, delta=2.5, score="sum"),
    dict(sampler="distribution_shift", randomness="minhash", window=3, delta=2.0, gamma=0.25, score="sum"),
    dict(sampler="exponential", randomness="window", window=0, score="sum"),
    dict(sampler="exponential", randomness="window", window=3, skip_prob=0.05, score="sum"),
    dict(sampler="inverse_transform", randomness="fixed", key_length=4, score="align"),
    dict(sampler="binary", randomness="fixed", key_length=256, score="align", binary_code="fixed"),
    dict(sampler="exponential", randomness="window", window=1, score="edit", psi=0.0, trials=200),
    dict(sampler="distribution_shift", randomness="window", window=1, delta=2.0, score="sum", psi=None, trials=None),
    # beyond the paper: SelfHash (per-candidate seeds) and DiPmark reweighting
    dict(sampler="distribution_shift", randomness="selfhash", window=4, delta=2.0, score="sum"),
    dict(sampler="exponential", randomness="selfhash", window=1, score="sum"),
    dict(sampler="reweight", randomness="window", window=1, score="sum"),
    dict(sampler="reweight", randomness="minhash", window=3, reweight_alpha=0.25, gamma=0.4, score="sum"),
    dict(sampler="reweight", randomness="fixed", key_length=8, score="align"),
]

BAD = [
    (dict(sampler="exp", randomness="window", window=1, score="sum"), "scheme.sampler", "distribution_shift"),
    (dict(sampler="exponential", randomness="windw", window=1, score="sum"), "scheme.randomness", "minhash"),
    (dict(sampler="exponential", randomness="window", window=1, score="sums"), "scheme.score", "align"),
    (dict(sampler="exponential", randomness="fixed", key_length=4, score="sum"), "scheme.score", "align"),
    (dict(sampler="exponential", randomness="window", window=1, score="align"), "scheme.score", "sum"),
    (dict(sampler="exponential", randomness="minhash", window=2, score="edit", psi=1), "scheme.score", "window=1"),
    (dict(sampler="exponential", randomness="fixed", key_length=1, score="align"), "scheme.score", "sum"),
    (dict(sampler="exponential", randomness="window", window=1, delta=2.0, score="sum"), "scheme.delta", None),
    (dict(sampler="binary", randomness="window", window=1, gamma=0.5, score="sum"), "scheme.gamma", None),
    (dict(sampler="distribution_shift", randomness="window", window=1, score="sum"), "scheme.delta", "> 0"),
    (dict(sampler="distribution_shift", randomness="window", window=1, delta=-1, score="sum"), "scheme.delta", "> 0"),
    (dict(sampler="distribution_shift", randomness="window", window=1, delta=2, gamma=1.0, score="sum"),
     "scheme.gamma", "(0, 1)"),
    (dict(sampler="distribution_shift", randomness="window", window=1, delta=2, skip_prob=0.1, score="sum"),
     "scheme.skip_prob", None),
    (dict(sampler="exponential", randomness="window", window=1, skip_prob=1.0, score="sum"), "scheme.skip_prob", "[0, 1)"),
    (dict(sampler="exponential", randomness="window", window=1, score="sum", psi=0.5), "scheme.psi", None),
    (dict(sampler="exponential", randomness="fixed", key_length=4, score="edit"), "scheme.psi", ">= 0"),
    (dict(sampler="exponential", randomness="window", window=1, score="sum", trials=100), "scheme.trials", None),
    (dict(sampler="exponential", randomness="fixed", key_length=4, score="align", trials=10), "scheme.trials", ">= 49"),
    (dict(sampler="exponential", randomness="window", window=1, score="sum", alpha=0.0), "scheme.alpha", "(0, 1)"),
    (dict(sampler="exponential", randomness="window", window=-1, score="sum"), "scheme.window", ">= 0"),
    (dict(sampler="exponential", randomness="window", window=1.5, score="sum"), "scheme.window", "integer"),
    (dict(sampler="exponential", randomness="window", score="sum"), "scheme.window", None),
    (dict(sampler="exponential", randomness="fixed", window=2, key_length=4, score="align"), "scheme.window", None),
    (dict(sampler="exponential", randomness="minhash", window=0, score="sum"), "scheme.window", ">= 1"),
    (dict(sampler="exponential", randomness="window", window=1, score="sum", binary_code="huffman"),
     "scheme.binary_code", None),
    (dict(sampler="binary", randomness="window", window=1, score="sum", binary_code="gray"), "scheme.binary_code", "huffman"),
    (dict(sampler="exponential", randomness="window", window=1, score="sum", colour="red"), "scheme.colour", "sampler"),
    (dict(sampler="exponential", randomness="window", window="1", score="sum"), "scheme.window", None),
    # binary x edit: the per-token cost (~depth Exp(1) node values) always exceeds 2 psi, so p = 1 always
    (dict(sampler="binary", randomness="fixed", key_length=256, score="edit", psi=0.5), "scheme.score", "align"),
    (dict(sampler="binary", randomness="window", window=1, score="edit", psi=0.5), "scheme.score", "sum"),
    # constant randomness: C2 has one draw per text, C3 one per tree node shared by every token
    (dict(sampler="inverse_transform", randomness="window", window=0, score="sum"), "scheme.window", ">= 1"),
    (dict(sampler="binary", randomness="window", window=0, score="sum"), "scheme.window", ">= 1"),
    # SelfHash: per-candidate seeds only where each candidate's draw is its own; never a fixed key; sum score only
    (dict(sampler="distribution_shift", delta=2, randomness="selfhash", window=4, key_length=8, score="sum"),
     "scheme.key_length", None),
    (dict(sampler="exponential", randomness="selfhash", window=0, score="sum"), "scheme.window", ">= 1"),
    (dict(sampler="inverse_transform", randomness="selfhash", window=4, score="sum"), "scheme.sampler",
     "distribution_shift, exponential"),
    (dict(sampler="binary", randomness="selfhash", window=4, score="sum"), "scheme.sampler", "exponential"),
    (dict(sampler="reweight", randomness="selfhash", window=4, score="sum"), "scheme.sampler", "exponential"),
    (dict(sampler="exponential", randomness="selfhash", window=1, score="edit", psi=0.5), "scheme.score", "sum"),
    # reweighting: alpha in (0, 0.5] (0.5 = gamma-reweight); it takes no skip and no delta
    (dict(sampler="reweight", randomness="window", window=1, reweight_alpha=0.6, score="sum"),
     "scheme.reweight_alpha", "(0, 0.5]"),
    (dict(sampler="reweight", randomness="window", window=1, reweight_alpha=0.0, score="sum"),
     "scheme.reweight_alpha", "(0, 0.5]"),
    (dict(sampler="reweight", randomness="window", window=1, skip_prob=0.1, score="sum"), "scheme.skip_prob", None),
    (dict(sampler="reweight", randomness="window", window=1, delta=2.0, score="sum"), "scheme.delta", None),
    (dict(sampler="exponential", randomness="window", window=1, reweight_alpha=0.3, score="sum"),
     "scheme.reweight_alpha", None),
]


@pytest.mark.parametrize("params", OK)
def test_valid_specs_build(params):
    spec = SchemeSpec.from_params(params)
    assert spec.sampler == params["sampler"]
    assert "key" not in spec.to_dict()


@pytest.mark.parametrize("params,key,allowed", BAD)
def test_invalid_specs_name_the_key(params, key, allowed):
    with pytest.raises(SpecError) as err:
        SchemeSpec.from_params(params)
    message = str(err.value)
    assert message.startswith(key + ":"), message
    assert "\n" not in message
    if allowed is not None:
        assert "allowed:" in message and allowed in message.split("allowed:")[1], message


def test_defaults():
    spec = SchemeSpec.from_params(dict(sampler="distribution_shift", randomness="window", window=1, delta=2, score="sum"))
    assert (spec.gamma, spec.alpha, spec.trials, spec.psi) == (0.5, 0.02, None, None)
    spec = SchemeSpec.from_params(dict(sampler="binary", randomness="fixed", key_length=8, score="align"))
    assert spec.binary_code == "huffman" and spec.trials == 100


@pytest.mark.parametrize("alpha,trials,smallest,need", [
    (0.03, 32, "1/33", 33),   # T >= 1/alpha - 1 = 32.3: the ceiling, not the floor
    (0.02, 48, "1/49", 49),
    (0.02, 49, None, None),   # 1/50 = alpha exactly: the smallest p-value reaches alpha, so the trials suffice
    (0.03, 33, None, None),
])
def test_permutation_trials_must_reach_alpha(alpha, trials, smallest, need):
    """With T trials the permutation p-value is at least 1/(T + 1): the spec refuses T where that is above alpha,
    saying the smallest p-value and the least T that works; T with 1/(T + 1) <= alpha builds."""
    params = dict(sampler="exponential", randomness="fixed", key_length=4, score="align", alpha=alpha, trials=trials)
    if smallest is None:
        assert SchemeSpec.from_params(params).trials == trials
        return
    with pytest.raises(SpecError) as err:
        SchemeSpec.from_params(params)
    assert err.value.key == "scheme.trials" and err.value.allowed == f"trials >= {need}"
    assert err.value.problem == (f"with {trials} trials the smallest p-value is {smallest} > alpha={alpha}: nothing "
                                 "could ever be detected")


def test_constant_randomness_refusal_says_what_the_sampler_shares():
    """window=0 gives every token one seed: the refusal blames scheme.window, allows window >= 1 only, and says what
    the whole text then holds for this sampler; the spec raises exactly that message."""
    from mmw.watermark.samplers.parts import refuse_constant_randomness

    rule = refuse_constant_randomness("one random draw")
    assert rule.key == "window" and rule.allowed == "an integer >= 1"
    assert rule.when({"window": 0}) and not rule.when({"window": 1})
    problem = ("window=0 (constant randomness) cannot detect sampler=inverse_transform: every token shares one seed, "
               "so the text holds one random draw and evidence stops growing with length")
    assert rule.problem.format(sampler="inverse_transform") == problem
    with pytest.raises(SpecError) as err:
        SchemeSpec.from_params(dict(sampler="inverse_transform", randomness="window", window=0, score="sum"))
    assert str(err.value) == f"scheme.window: {problem}; allowed: an integer >= 1"


def test_binary_edit_rejection_says_why():
    with pytest.raises(SpecError, match="always exceeds the gap cost"):
        SchemeSpec.from_params(dict(sampler="binary", randomness="minhash", window=1, score="edit", psi=5.0))


def test_validation_imports_no_torch():
    """The config path (scheme, params, the whole board, the key and aggregate stages, the CLI) reads the
    samplers' declarations only: validating a scheme and the default board must not load torch, nor the attacks'
    text tools (seconds each)."""
    code = ("import sys, mmw.watermark.scheme, mmw.params, mmw.board, mmw.watermark.samplers, mmw.cli, stages.key, stages.aggregate\n"
            "from mmw.watermark.scheme import SAMPLERS, SchemeSpec\n"
            "for name in SAMPLERS:\n"
            "    SchemeSpec.from_params(dict(sampler=name, randomness='window', window=1, score='sum', "
            "delta=2.0 if name == 'distribution_shift' else None) if name != 'plugin' else "
            "dict(sampler=name, plugin='hf_synthid'))\n"
            "mmw.board.check_board(mmw.params.read_params('params.yaml'))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'numba', 'nltk')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]", result.stdout[:500]


def test_each_declaration_names_its_implementation():
    """The scheme's samplers are the declared ones, in the paper's order; each declaration's implementation
    samples and scores under the same name, label and rules (it subclasses the declaration)."""
    assert SAMPLERS == tuple(cls.name for cls in WATERMARKING) == (*LABELS, "plugin")  # each plugin: its own label
    assert set(DECLARED) == {*SAMPLERS, "none"}
    for name, part in DECLARED.items():
        if name == "plugin":  # an outside watermark brings its own implementation (tests/test_plugins.py)
            continue
        cls = implementation(name)
        assert issubclass(cls, Sampler) and issubclass(cls, part), (name, cls.__mro__)
        assert (cls.name, cls.label, cls.scheme_keys, cls.refuses, cls.pivot) == (
            name, part.label, part.scheme_keys, part.refuses, part.pivot)


def test_what_parts_read_of_a_scheme_are_its_fields():
    """The parts take a scheme as ``mmw.watermark.scheme_values.SchemeValues`` (they must not import the validator built from
    their declarations): every value it names is a SchemeSpec field of the same type."""
    from typing import get_type_hints

    from mmw.watermark.scheme_values import SchemeValues

    read = {name: get_type_hints(getattr(SchemeValues, name).fget)["return"]
            for name, member in vars(SchemeValues).items() if isinstance(member, property)}
    assert read and set(read) <= set(SchemeSpec.model_fields)
    spec = SchemeSpec.from_params(dict(sampler="distribution_shift", randomness="window", window=1, score="sum",
                                       delta=2.0))
    for name, kind in read.items():
        value = getattr(spec, name)
        assert value is None or isinstance(value, tuple(a for a in getattr(kind, "__args__", (kind,))
                                                        if isinstance(a, type))), (name, value, kind)
