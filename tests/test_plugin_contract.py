"""The plugin contract as types and checks (``mmw.watermark.plugins``, ``mmw.watermark.plugin_contract``), the scaffold
(``mmw plugin new``), plugin parameters given as a string, and a model-aware detector (``sweet_kgw``).

The in-test plugins are test_plugins.py's (a fake installed distribution); the scaffold's package is installed for
real (``pip install --no-deps -e``) and its own generated test runs, then it is uninstalled.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from mmw.watermark import plugins
from mmw.errors import SpecError
from mmw.watermark.build import build_detector
from mmw.watermark.plugin_detection import PluginSchemeDetector, SyntheticModel
from mmw.watermark.plugins import DetectionModel, PluginLogitsProcessor, spread_candidates
from mmw.watermark.plugin_contract import check_contract, check_plugin
from mmw.watermark.plugins.sweet import entropies
from mmw.watermark.scheme import SchemeSpec
from test_plugins import ALPHA, KEY, V, fake_dist, plugin_spec, synthetic_generate, upper_limit  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ the checks
@pytest.mark.parametrize(("name", "problem"), [
    ("shape", "scheme.plugin (shape): the processor changed the batch's shape"),
    ("nan", "scheme.plugin (nan): the processor returned NaN or +inf scores"),
    ("badp", "scheme.plugin (badp): the detector returned a p-value outside [0, 1] (1.5 at prefix 1)"),
    ("nonull", "scheme.plugin (nonull): the detector returned per-token pivots without a declared null"),
    ("mismatch", "scheme.plugin (mismatch): the detector returned PrefixPValues while the plugin's no_pivot_reason "
                 "says it returns Pivots"),
])
def test_the_contract_check_refuses_each_broken_rule_in_one_line(fake_dist, name, problem):
    with pytest.raises(SpecError) as err:
        check_contract(plugin_spec(name), KEY, V, 0.7)
    assert str(err.value).startswith(problem) and "\n" not in str(err.value)


def test_the_contract_check_passes_a_plugin_that_keeps_it(fake_dist):
    assert check_plugin("toy").plugin_params == {"delta": 3.0, "gamma": 0.5, "mode": "pivots"}
    check_plugin("toy", {"mode": "pvalues"})


def test_pivots_that_count_evidence_upwards_are_refused():
    good = plugins.Pivots(np.array([0.0, -1.0, 0.0]), np.array([0, 1, 1]), "green", 0.5)
    plugins.check_pivots(good, 3, "p")
    for values, units, rule in [([0.0, 1.0, 0.0], [0, 1, 1], "positive pivots"),
                                ([-1.0, 0.0, 0.0], [0, 1, 1], "positive pivots or pivots on tokens with no units"),
                                ([0.0, -2.0, 0.0], [0, 1, 1], "below -units")]:
        with pytest.raises(SpecError, match=rule):
            plugins.check_pivots(plugins.Pivots(np.array(values), np.array(units), "green", 0.5), 3, "p")


def test_plugin_params_name_the_plugin_and_may_be_a_string(fake_dist):
    with pytest.raises(SpecError) as err:
        plugin_spec("toy", delta=-1.0)
    assert str(err.value) == ("scheme.plugin_params.delta: -1.0 is out of range (plugin 'toy': Toy green list); "
                              "allowed: a number > 0")
    as_string = SchemeSpec.from_params({"sampler": "plugin", "plugin": "toy", "plugin_params": "{delta: 2.0}"})
    assert as_string == plugin_spec("toy", delta=2.0)  # normalized to the same mapping
    for text, message in [("{delta: [", "not a YAML/JSON mapping"), ("[1, 2]", "expected a mapping, got list"),
                          ('{"gamma": 2}', "scheme.plugin_params.gamma: 2 is out of range (plugin 'toy'")]:
        with pytest.raises(SpecError, match=message.replace("(", r"\(")):
            SchemeSpec.from_params({"sampler": "plugin", "plugin": "toy", "plugin_params": text})


def test_spread_candidates_samples_only_among_the_candidates():
    scores = torch.tensor([[1.0, 2.0], [0.5, -1.0]])
    ids = torch.tensor([[3, 0], [1, 2]])
    out = spread_candidates(scores, ids, 5)
    assert out.shape == (2, 5) and torch.isfinite(out).sum() == 4
    assert out[0, 3] == 1.0 and out[0, 0] == 2.0 and out[1, 2] == -1.0


def test_the_protocols_describe_what_mmw_passes():
    assert isinstance(SyntheticModel(7), DetectionModel)
    logits = SyntheticModel(7).logits(np.array([1, 2, 3]))
    assert logits.shape == (3, 7) and not logits[0].any()  # row 0: no prefix, uniform
    assert isinstance(lambda ids, scores: scores, PluginLogitsProcessor)


# ------------------------------------------------------------------------------------------------ the scaffold
def test_the_scaffold_installs_and_passes_its_own_contract_test(tmp_path):
    result = CliRunner().invoke(_app(), ["plugin", "new", "acme_wm", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    package = tmp_path / "acme_wm"
    again = CliRunner().invoke(_app(), ["plugin", "new", "acme_wm", "--dir", str(tmp_path)])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = CliRunner().invoke(_app(), ["plugin", "new", "Acme-WM", "--dir", str(tmp_path)])
    assert bad.exit_code == 2 and "NAME: 'Acme-WM' is not a plugin name" in bad.output
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(package)], check=True,
                   capture_output=True, timeout=300)
    try:
        test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               str(package / "tests")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert test.returncode == 0, test.stdout[-3000:]
        assert "2 passed" in test.stdout
    finally:
        subprocess.run([*pip, "uninstall", "-y", "acme_wm"], check=True, capture_output=True, timeout=300)


def _app():
    from mmw.cli import app

    return app


# ------------------------------------------------------------------------------------------------ model-aware
class TinyLM:
    """A DetectionModel whose next-token distribution alternates: uniform over V (high entropy) after an even
    token, one token almost surely (low entropy) after an odd one."""

    model = tokenizer = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def logits(self, tokens):
        out = np.zeros((len(tokens), self.vocab_size), dtype=np.float32)
        odd = np.r_[False, np.asarray(tokens[:-1]) % 2 == 1]
        out[odd, 0] = 50.0
        return out


def test_a_model_aware_detector_receives_the_model_and_scores_only_high_entropy_tokens():
    spec = SchemeSpec.from_params({"sampler": "plugin", "plugin": "sweet_kgw", "alpha": ALPHA})
    with pytest.raises(SpecError, match="needs the generator"):
        PluginSchemeDetector(spec, KEY, V)
    detector = PluginSchemeDetector(spec, KEY, V, TinyLM(V))
    tokens = np.random.default_rng(3).integers(0, V, 400)
    pivots = detector.inner.score(tokens)
    low = np.r_[False, tokens[:-1] % 2 == 1]
    assert pivots.units[low].sum() == 0 and pivots.units[~low][1:].all()
    np.testing.assert_allclose(entropies(TinyLM(V).logits(tokens))[~low], np.log(V))
    check_contract(spec, KEY, V, 0.7)


def test_the_sweet_detector_holds_its_fpr_and_detects_kgw_text(one_thread):
    """Null: random texts, each with its own key (independent verdicts), at most alpha (binomial bound). Power:
    KGW-watermarked text from a synthetic model (sd 3 logits) is detected."""
    spec = SchemeSpec.from_params({"sampler": "plugin", "plugin": "sweet_kgw", "alpha": ALPHA,
                                   "plugin_params": {"entropy_threshold": 0.5}})
    rng = np.random.default_rng(11)
    n = 300
    positives = sum(PluginSchemeDetector(spec, KEY + i, V, TinyLM(V)).detect([rng.integers(0, V, 64)])[0].detected
                    for i in range(n))
    assert positives <= upper_limit(n)
    texts = synthetic_generate(spec, rows=8, steps=80, seed=5)
    with pytest.raises(SpecError, match="needs the generator"):  # the stages pass the generator (params.model)
        build_detector(spec, KEY, V)
    detected = [r.detected for r in PluginSchemeDetector(spec, KEY, V, SyntheticModel(V)).detect(texts)]
    assert sum(detected) >= 7
    assert stats.binom.sf(sum(detected) - 1, len(detected), ALPHA) < 1e-6


def test_switching_plugins_with_dvc_set_param_needs_the_string_form(fake_dist, tmp_path):
    """DVC applies ``-S key={...}`` by merging into the mapping params.yaml holds (struct mode: a new key fails);
    a quoted string replaces it whole, and mmw parses it."""
    import yaml
    from dvc.utils.hydra import apply_overrides

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"scheme": {"sampler": "plugin", "plugin": "hf_synthid",
                                                 "plugin_params": {"depth": 30, "ngram_len": 5}}}))
    with pytest.raises(Exception, match="--set-param"):
        apply_overrides(str(params), ["scheme.plugin=toy", "scheme.plugin_params={delta: 2.0}"])
    apply_overrides(str(params), ["scheme.plugin=toy", "scheme.plugin_params='{delta: 2.0, mode: pvalues}'"])
    scheme = yaml.safe_load(params.read_text())["scheme"]
    assert scheme["plugin_params"] == "{delta: 2.0, mode: pvalues}"
    assert SchemeSpec.from_params({**scheme, "alpha": ALPHA}) == plugin_spec("toy", delta=2.0, mode="pvalues")


@pytest.mark.parametrize("bos", [None, 5])
def test_the_generator_model_gives_the_next_token_logits_before_each_token(bos):
    """Row n is the model's output after tokens[:n] (after BOS + tokens[:n] when the tokenizer has one); without a
    BOS, row 0 is uniform (zeros)."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    from mmw.stages.common import GeneratorModel

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    model = GeneratorModel(lm, SimpleNamespace(bos_token_id=bos), vocab_size=37)  # a padded output layer: 40 > 37
    tokens = np.array([3, 9, 1, 30, 7])
    rows = model.logits(tokens)
    assert rows.shape == (5, 37)
    for n in range(5):
        prefix = ([bos] if bos is not None else []) + tokens[:n].tolist()
        if not prefix:
            assert not rows[0].any()
            continue
        with torch.no_grad():
            expected = lm(torch.tensor([prefix])).logits[0, -1, :37].numpy()
        np.testing.assert_allclose(rows[n], expected, rtol=1e-4, atol=1e-5)
    assert model.logits(np.array([], dtype=np.int64)).shape == (0, 37)
