"""Outside watermarks through the plugin interface (``mmw.watermark.plugins``, entry-point group ``mmw.watermarks``).

The contract and every bad-input error use tiny in-test plugins, registered by a fake installed distribution
(a ``*.dist-info`` with ``entry_points.txt`` on ``sys.path``), as a pip-installed package registers them. The
shipped adapters (transformers' KGW and SynthID-Text) are tested statistically: each detector holds its
false-positive rate at alpha on unwatermarked text (every size), and detects its own watermarked text, generated
through mmw's processor from a synthetic language model (random logits per step). vLLM's adapter is tested in
tests/test_vllm.py (it needs .venv-vllm).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from mmw.watermark import plugins
from mmw.errors import SpecError
from mmw.watermark.build import build_detector, build_processor
from mmw.watermark.plugin_detection import PluginSchemeDetector, preflight_detector
from mmw.watermark.plugin_generation import PluginProcessor, preflight
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec

ROOT = Path(__file__).resolve().parents[1]
KEY = 0x0DDB_A11_5EED
ALPHA = 0.02
V = 300

FAKE = '''
import numpy as np
import torch
from typing import Literal
from scipy import stats
from mmw.watermark import prf
from mmw.watermark.plugins import Pivots, PluginDetector, PrefixPValues, WatermarkPlugin
from mmw.validation import Section, allowed


class ToyParams(Section):
    delta: float = allowed("a number > 0", default=3.0, gt=0.0)
    gamma: float = allowed("a number in (0, 1)", default=0.5, gt=0.0, lt=1.0)
    mode: Literal["pivots", "pvalues"] = allowed("pivots, pvalues", default="pivots")


def greens(key, prev, tokens, gamma):
    """Green iff the keyed hash of (previous token, token) falls below gamma (one unit per token)."""
    return prf.unit_np(prf.prf_np(prf.prf_np(np.uint64(key), np.asarray(prev)), np.asarray(tokens))) < gamma


class ToyProcessor:
    def __init__(self, params, key):
        self.params, self.key = params, key

    def __call__(self, input_ids, scores):
        prev = input_ids[:, -1:].numpy().astype(np.uint64)
        green = greens(self.key, prev, np.arange(scores.shape[1], dtype=np.uint64)[None, :], self.params.gamma)
        return scores + self.params.delta * torch.from_numpy(green).to(scores.dtype)


class ToyDetector(PluginDetector):
    def __init__(self, params, key):
        self.params, self.key = params, key

    def score(self, tokens):
        g = np.zeros(len(tokens))
        units = np.zeros(len(tokens), dtype=np.int64)
        if len(tokens) > 1:
            g[1:] = greens(self.key, tokens[:-1].astype(np.uint64), tokens[1:].astype(np.uint64), self.params.gamma)
            units[1:] = 1
        if self.params.mode == "pivots":
            return Pivots(-g, units, "green", self.params.gamma)
        n, k = np.cumsum(units), np.cumsum(g)
        return PrefixPValues(np.where(n > 0, stats.binom.sf(k - 1, n, self.params.gamma), 1.0), "toy p-values")


class Toy(WatermarkPlugin):
    label = "Toy green list"
    Params = ToyParams

    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return ToyProcessor(params, key)

    def detector(self, params, key, vocab_size):
        return ToyDetector(params, key)

    def no_pivot_reason(self, params):
        return None if params.mode == "pivots" else "toy p-values"


class ShapeChanger(Toy):
    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return lambda ids, scores: scores[:, :-1]


class NaNs(Toy):
    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return lambda ids, scores: scores * float("nan")


class BadDetector(PluginDetector):
    def __init__(self, out):
        self.out = out

    def score(self, tokens):
        return self.out(len(tokens))


class BadPValues(Toy):
    def detector(self, params, key, vocab_size):
        return BadDetector(lambda n: PrefixPValues(np.full(n, 1.5)))


class PValuesAnnouncedAsPivots(Toy):
    def detector(self, params, key, vocab_size):
        return BadDetector(lambda n: PrefixPValues(np.full(n, 0.5)))


class NoNull(Toy):
    def detector(self, params, key, vocab_size):
        return BadDetector(lambda n: Pivots(np.zeros(n), np.ones(n, dtype=np.int64), None))


def not_a_plugin():
    pass
'''

ENTRY_POINTS = """[mmw.watermarks]
toy = mmw_fake_watermarks:Toy
shape = mmw_fake_watermarks:ShapeChanger
nan = mmw_fake_watermarks:NaNs
badp = mmw_fake_watermarks:BadPValues
nonull = mmw_fake_watermarks:NoNull
mismatch = mmw_fake_watermarks:PValuesAnnouncedAsPivots
broken = mmw_fake_watermarks_broken:Anything
notplugin = mmw_fake_watermarks:not_a_plugin
"""


@pytest.fixture(scope="module")
def fake_dist(tmp_path_factory) -> Path:
    """A fake installed distribution registering the in-test plugins, first on sys.path for this module."""
    site = tmp_path_factory.mktemp("site")
    (site / "mmw_fake_watermarks.py").write_text(FAKE)
    (site / "mmw_fake_watermarks_broken.py").write_text("raise ImportError('libfoo.so: cannot open shared object')\n")
    info = site / "mmw_fake_watermarks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mmw-fake-watermarks\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("mmw_fake_watermarks", None)


def plugin_spec(name: str, **params) -> SchemeSpec:
    return SchemeSpec.from_params({"sampler": "plugin", "plugin": name, "alpha": ALPHA,
                                   **({"plugin_params": params} if params else {})})


def synthetic_generate(spec: SchemeSpec | None, rows: int, steps: int, seed: int, temperature: float = 1.0,
                       scale: float = 3.0, key: int = KEY) -> list[np.ndarray]:
    """Texts from a synthetic language model: i.i.d. normal logits (sd ``scale``) per row and step, sampled through
    mmw's processor for ``spec`` (None: plain sampling). Returns the generated token ids, int64 [steps] each."""
    rng = np.random.default_rng(seed)
    proc = build_processor(spec, key, V, [seed * 10_007 + r for r in range(rows)], temperature)
    ids = torch.from_numpy(rng.integers(0, V, (rows, 4)))
    for _ in range(steps):
        scores = torch.from_numpy((rng.normal(size=(rows, V)) * scale).astype(np.float32))
        ids = torch.cat([ids, proc(ids, scores).argmax(-1, keepdim=True)], dim=1)
    return [row[4:].copy() for row in ids.numpy()]


def upper_limit(n: int, alpha: float = ALPHA, level: float = 1e-3) -> int:
    """The largest count of false positives among n that is consistent (one-sided, at ``level``) with a rate alpha."""
    return int(stats.binom.isf(level, n, alpha))


# ------------------------------------------------------------------------------------------------ the contract
def test_a_plugin_is_chosen_and_validated_like_a_built_in_sampler(fake_dist):
    spec = plugin_spec("toy", delta=2.0)
    assert spec.plugin_params == {"delta": 2.0, "gamma": 0.5, "mode": "pivots"}  # the plugin's defaults filled in
    assert spec.exact_null and spec.describe() == "plugin toy delta=2.0 gamma=0.5 mode=pivots"
    assert not plugin_spec("toy", mode="pvalues").exact_null
    assert plugins.label("toy") == "Toy green list"
    assert SchemeSpec(**spec.model_dump()) == spec  # normalized values rebuild the spec (the vLLM/pack path)


@pytest.mark.parametrize(("params", "message"), [
    ({"sampler": "plugin", "plugin": "toy", "plugin_params": {"delta": -1.0}},
     "scheme.plugin_params.delta: -1.0 is out of range (plugin 'toy': Toy green list); allowed: a number > 0"),
    ({"sampler": "plugin", "plugin": "toy", "plugin_params": {"detla": 1.0}},
     "scheme.plugin_params.detla: unknown key (plugin 'toy': Toy green list); allowed: delta, gamma, mode"),
    ({"sampler": "plugin", "plugin": "toy", "plugin_params": {"mode": "both"}},
     "scheme.plugin_params.mode: unknown value 'both' (plugin 'toy': Toy green list); allowed: pivots, pvalues"),
    ({"sampler": "plugin", "plugin": "toy", "window": 2},
     "scheme.window: not used by sampler=plugin"),
    ({"sampler": "plugin"}, "scheme.plugin: required with sampler=plugin"),
    ({"sampler": "exponential", "randomness": "window", "window": 1, "score": "sum", "plugin": "toy"},
     "scheme.plugin: not used by sampler=exponential"),
    ({"sampler": "plugin", "plugin": "nosuch"},
     "scheme.plugin: no watermark plugin 'nosuch' is installed (entry-point group mmw.watermarks); allowed: "),
    ({"sampler": "plugin", "plugin": "broken"},
     "scheme.plugin: plugin 'broken' (mmw_fake_watermarks_broken:Anything) failed to load: ImportError: libfoo.so"),
    ({"sampler": "plugin", "plugin": "notplugin"},
     "scheme.plugin: plugin 'notplugin' (mmw_fake_watermarks:not_a_plugin) is not a mmw.watermark.plugins.WatermarkPlugin"),
])
def test_bad_plugin_settings_fail_with_one_line_naming_the_setting(fake_dist, params, message):
    with pytest.raises(SpecError) as err:
        SchemeSpec.from_params(params)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_processor_picks_one_token_per_row_reproducibly(fake_dist):
    spec = plugin_spec("toy")
    proc = build_processor(spec, KEY, V, [1, 2, 3], 0.7)
    assert isinstance(proc, PluginProcessor)
    assert isinstance(build_processor(None, None, V, [1], 0.7), WatermarkProcessor)
    scores = torch.randn(3, V + 5)  # a padded output layer: columns past the vocabulary are never chosen
    out = proc(torch.zeros(3, 4, dtype=torch.int64), scores)
    assert out.shape == scores.shape and (torch.isfinite(out).sum(-1) == 1).all()
    assert int(out.argmax(-1).max()) < V
    assert proc.mean_entropy([1, 1, 0]).shape == (3,)
    first = synthetic_generate(spec, rows=3, steps=20, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(first, synthetic_generate(spec, rows=3, steps=20, seed=4)))
    other_key = synthetic_generate(spec, rows=3, steps=20, seed=4, key=KEY + 1)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other_key))


@pytest.mark.parametrize(("name", "problem"), [
    ("shape", "scheme.plugin (shape): the processor changed the batch's shape from (2, 300) to (2, 299)"),
    ("nan", "scheme.plugin (nan): the processor returned NaN or +inf scores"),
    ("badp", "scheme.plugin (badp): the detector returned a p-value outside [0, 1] (1.5 at prefix 1)"),
    ("nonull", "scheme.plugin (nonull): the detector returned per-token pivots without a declared null"),
])
def test_a_misbehaving_plugin_fails_the_preflight_with_one_line(fake_dist, name, problem):
    check = preflight if name in ("shape", "nan") else (lambda spec, key, v, t: preflight_detector(spec, key, v))
    with pytest.raises(SpecError) as err:
        check(plugin_spec(name), KEY, V, 1.0)
    assert str(err.value).startswith(problem) and "\n" not in str(err.value)


def test_p_values_alone_give_e_and_the_checkpoint_size_but_no_anytime_size(fake_dist):
    texts = synthetic_generate(plugin_spec("toy"), rows=6, steps=64, seed=1)
    pivots = build_detector(plugin_spec("toy"), KEY, V).detect(texts)
    pvalues = build_detector(plugin_spec("toy", mode="pvalues"), KEY, V)
    assert isinstance(pvalues, PluginSchemeDetector)
    for a, b in zip(pivots, pvalues.detect(texts)):
        np.testing.assert_allclose(a.pvalues, b.pvalues, rtol=1e-9)  # the same exact null, two ways
        assert (a.size, a.size_valid) == (b.size, b.size_valid) and a.size_valid is not None
        assert a.size_anytime is not None and b.size_anytime is None and b.log_evalues is None
    assert pvalues.anytime_unavailable == "toy p-values"
    # An audit key's whole-text p-values come from the plugin's own scores, as detect's do.
    for detector in (build_detector(plugin_spec("toy"), KEY, V), pvalues):
        np.testing.assert_array_equal(detector.full_text_pvalues(texts), [r.pvalue for r in detector.detect(texts)])


def test_a_plugin_failure_in_a_stage_exits_2_with_one_line_and_writes_nothing(fake_dist, tmp_path):
    """``mmw key`` validates the whole board first: a broken plugin ends it with exit code 2 and one line naming the
    plugin, and no fingerprint is written."""
    board = yaml.safe_load((ROOT / "params.yaml").read_text())
    board["scheme"] = {"sampler": "plugin", "plugin": "broken", "alpha": ALPHA}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(board))
    (tmp_path / "data").symlink_to(ROOT / "data")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake_dist), "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "mmw", "key"], cwd=tmp_path, capture_output=True, text=True,
                            env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "scheme.plugin: plugin 'broken'" in lines[0] and "ImportError" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "params.yaml"]


# ------------------------------------------------------------------------------------------------ the adapters
ADAPTERS = {
    "kgw-lefthash": ("hf_kgw", {}),
    "kgw-selfhash": ("hf_kgw", {"seeding_scheme": "selfhash", "context_width": 4}),
    "kgw-zscore": ("hf_kgw", {"detection": "zscore"}),
    "synthid": ("hf_synthid", {"depth": 30, "ngram_len": 5}),
}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_adapter_holds_its_false_positive_rate_at_alpha(adapter, one_thread):
    """Texts the key did not write (uniform tokens: the worst case for repeated n-grams is absent, so the units are
    as many as possible): the full-text FPR, the any-checkpoint FPR of size_valid and the any-prefix FPR of the
    anytime size are each consistent with at most alpha (one-sided binomial bound at 1e-3)."""
    name, params = ADAPTERS[adapter]
    detector = build_detector(plugin_spec(name, **params), KEY, V)
    rng = np.random.default_rng(11)
    n = 600
    results = detector.detect([rng.integers(0, V, 96) for _ in range(n)])
    limit = upper_limit(n)
    assert sum(r.detected for r in results) <= limit
    assert sum(r.size_valid is not None for r in results) <= limit
    if detector.anytime_unavailable is None:
        assert sum(r.size_anytime is not None for r in results) <= limit
    # and the p-values are not degenerate: their full-text distribution is near uniform (exact nulls are
    # discrete, so only a coarse check: the median p-value lies well inside (0.2, 0.8))
    assert 0.2 < float(np.median([r.pvalue for r in results])) < 0.8


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_adapter_detects_its_own_watermarked_text(adapter, temperature, one_thread):
    """Watermarked texts of 96 tokens from the synthetic model: nearly all detected at alpha, and the plain
    texts from the same seeds (the baseline) not."""
    name, params = ADAPTERS[adapter]
    spec = plugin_spec(name, **params)
    detector = build_detector(spec, KEY, V)
    marked = detector.detect(synthetic_generate(spec, rows=12, steps=96, seed=2, temperature=temperature))
    plain = detector.detect(synthetic_generate(None, rows=12, steps=96, seed=2, temperature=temperature))
    assert sum(r.detected for r in marked) >= 11, [r.pvalue for r in marked]
    assert sum(r.detected for r in plain) <= 2
    if spec.exact_null:
        assert sum(r.size_anytime is not None for r in marked) >= 10


# ------------------------------------------------------------------------------------------------ vLLM's watermark
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAVE_VLLM, reason="checks the missing-vLLM error")
def test_vllm_adapter_without_vllm_fails_at_validation_naming_the_plugin():
    with pytest.raises(SpecError) as err:
        plugin_spec("vllm_gumbel")
    assert str(err.value).startswith("scheme.plugin: plugin 'vllm_gumbel' needs vllm, which is not installed here")


@pytest.mark.vllm
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (.venv-vllm)")
@pytest.mark.parametrize("algorithm", ["gumbel", "dual_key_gumbel"])
def test_vllm_adapter_holds_its_fpr_and_detects_its_own_text(algorithm, one_thread):
    """vLLM's own Watermarker samples (driven from mmw's processor) and vLLM's own detector scores: on texts the
    key did not write the FPR (full text, any checkpoint, any prefix for the anytime size) is consistent with at
    most alpha; watermarked texts at T = 0.7 and 1 are detected, their plain baselines are not. With ``gumbel``
    the pivots reproduce vLLM's own full-text p-value."""
    from vllm.v1.watermarking.gumbel import DualKeyGumbelWatermarkDetector, GumbelWatermarkDetector

    from mmw.watermark.plugins.vllm_gumbel import vllm_key

    spec = plugin_spec("vllm_gumbel", algorithm=algorithm)
    detector = build_detector(spec, KEY, V)
    rng = np.random.default_rng(12)
    n = 300
    nulls = [rng.integers(0, V, 64) for _ in range(n)]
    results = detector.detect(nulls)
    assert sum(r.detected for r in results) <= upper_limit(n)
    assert sum(r.size_valid is not None for r in results) <= upper_limit(n)
    assert 0.2 < float(np.median([r.pvalue for r in results])) < 0.8
    reference = (GumbelWatermarkDetector if algorithm == "gumbel" else DualKeyGumbelWatermarkDetector)(vllm_key(KEY))
    for text, r in zip(nulls[:10], results[:10]):  # vLLM's own verdict on the whole text and on a prefix
        assert r.pvalue == pytest.approx(reference.detect([int(t) for t in text]).p_value, rel=1e-6)
        assert r.pvalues[40] == pytest.approx(reference.detect([int(t) for t in text[:41]]).p_value, rel=1e-6)
    if algorithm == "gumbel":
        assert sum(r.size_anytime is not None for r in results) <= upper_limit(n)
    else:
        assert detector.anytime_unavailable is not None and all(r.size_anytime is None for r in results)
    for temperature in (0.7, 1.0):
        marked = detector.detect(synthetic_generate(spec, rows=10, steps=64, seed=3, temperature=temperature))
        plain = detector.detect(synthetic_generate(None, rows=10, steps=64, seed=3, temperature=temperature))
        assert sum(r.detected for r in marked) >= 9 and sum(r.detected for r in plain) <= 2


# ------------------------------------------------------------------------------------------------ in the reports
def test_each_plugin_is_its_own_family_in_the_tables_and_the_page():
    """A plugin's configurations form their own family (named by the plugin, labelled by its label) beside the
    paper's four samplers: in the paper's table as a column after them, on the page by its label."""
    import polars as pl

    from mmw.reporting import data
    from mmw.sweep.tables import FAMILIES, paper_rows

    assert data.family_label("hf_synthid") == "SynthID-Text (transformers)"
    assert data.family_label("exponential") == "Exponential"
    assert data.ordered_families(["hf_kgw", "exponential", "distribution_shift"]) == [
        "distribution_shift", "exponential", "hf_kgw"]
    table = pl.DataFrame({"max_quality_loss": [0.1, 0.1], "min_tamper_resistance": [0.0, 0.0],
                          "temperature": [1.0, 1.0], "family": ["exponential", "hf_kgw"], "size": [20, 30]})
    header, _, row = paper_rows(table, lambda r: str(r["size"]), "≥")
    assert header == "| constraint | T | " + " | ".join((*FAMILIES, "hf_kgw")) + " |"
    cells = [("20" if family == "exponential" else "–") for family in FAMILIES] + ["30"]
    assert row.endswith("| " + " | ".join(cells) + " |") and row.count("|") == len(FAMILIES) + 4


# ------------------------------------------------------------------------------------------------ end to end
#: The worked example of docs/PLUGINS.md: transformers' SynthID-Text through its plugin, configured by -S alone.
EXAMPLE = ("-S", "scheme.sampler=plugin", "-S", "scheme.plugin=hf_synthid",
           "-S", "scheme.plugin_params='{depth: 30, ngram_len: 5}'", "-S", "scheme.randomness=null",
           "-S", "scheme.window=null", "-S", "scheme.delta=null", "-S", "scheme.gamma=null", "-S", "scheme.score=null")


@pytest.mark.heavy
def test_an_outside_watermark_runs_end_to_end_through_dvc_exp_run(tmp_path_factory):
    """The tiny pipeline (shared with tests/test_dvc.py), then the docs' worked example: only the watermark side
    reruns, the baseline's outputs are reused, and the metrics are the plugin's: sizes from its detector (all
    three, SynthID has pivots), the FPR of the baseline under it, the scheme named in the summary."""
    from pipeline_repo import run, traced_tiny_pipeline

    repo = traced_tiny_pipeline(tmp_path_factory.getbasetemp() / "tiny-pipeline").repo
    run(repo, "git", "checkout", "--", ".")
    run(repo, "dvc", "checkout", "--force")
    baseline = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["generate_baseline"]["outs"]
    try:
        check_example_run(repo, baseline)
    finally:  # the workspace is shared: leave it at the committed run for the tests that follow
        run(repo, "git", "checkout", "--", ".")
        run(repo, "dvc", "checkout", "--force")


def check_example_run(repo, baseline) -> None:
    import json

    from pipeline_repo import run, stages_run

    completed = run(repo, "dvc", "exp", "run", *EXAMPLE)
    ran = stages_run(completed.stdout + completed.stderr)
    assert {"generate_watermarked", "detect_watermarked", "detect_baseline", "aggregate"} <= ran
    assert not ran & {"prompts", "generate_baseline", "rate_baseline"}, ran
    assert yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["generate_baseline"]["outs"] == baseline
    metrics = json.loads((repo / "reports/metrics.json").read_text())["all"]
    assert metrics["fpr"] is not None and metrics["detection_rate"] is not None
    assert "size_anytime" in metrics and "fpr_any_prefix_anytime" in metrics
    assert "plugin hf_synthid" in (repo / "reports/summary.md").read_text()
