"""``mmw plugin new NAME``: a plugin package a provider fills in, with the contract in its docstrings and a test.

The package works as written (a keyed green list over the previous token, with its exact Binomial null), so
``pip install --no-deps -e <dir>`` and its test pass before anything is changed; the provider then replaces the
bodies of two functions, ``watermark_scores`` (generation) and ``green_units`` (detection), with calls into their
own library, and adds parameters to ``Params``.
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path

from mmw.errors import SpecError

#: A plugin's name: its entry-point name, package name and distribution name.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,62}")

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{name}: a watermark for the MarkMyWords benchmark (mmw plugin)"
requires-python = ">=3.11"
# mmw itself is not listed: the package is installed into mmw's environment (pip install --no-deps -e .).
# List your library's own runtime dependencies here only if they agree with mmw's pins (docs/PLUGINS.md).
dependencies = []

[project.entry-points."mmw.watermarks"]
{name} = "{name}.watermark:Watermark"

[tool.setuptools]
packages = ["{name}"]
'''

WATERMARK = '''\
"""{name}: a watermark plugin for mmw (entry point ``{name}`` in the group ``mmw.watermarks``).

Fill in the two functions marked FILL IN; everything else is the contract's plumbing. The contract, in short
(docs/PLUGINS.md in mmw has all of it):
- ``processor`` is called once per batch of rows and returns a fresh object; that object is called once per
  decoding step with ``input_ids`` int64 [B, S] (prompt + tokens so far) and ``scores`` float [B, V]: the step's
  logits ALREADY divided by the temperature, cut to the vocabulary and copied (modify them freely). It returns
  float [B, V] logits; mmw samples from their softmax with its own per-row uniforms. -inf excludes a token; NaN,
  +inf and a changed shape are refused. A library that applies its own temperature/top-k: give it
  ``scores * temperature`` and spread its top-k back with ``mmw.watermark.plugins.spread_candidates``.
- the detector's ``score(tokens int64 [N])`` returns ``Pivots``: per token, ``values`` (evidence counts DOWN: a
  green unit is -1) and ``units`` (how many independent units the token contributes; 0 masks it), under a declared
  null ("green" with its gamma, or "exp_up"). Then mmw gives every size (E, checkpoint, anytime). A detector with
  only a p-value per prefix returns ``PrefixPValues`` and says why in ``no_pivot_reason``.
- set ``needs_model = True`` to receive the generator (``model=``: ``model.logits(tokens)`` -> [N, V] next-token
  logits, ``model.model``, ``model.tokenizer``) in ``detector``, e.g. for entropy-weighted detection.
- never log or write ``key``; derive your library's keys from it one-way (``mmw.watermark.prf.prf_int``).
"""

from __future__ import annotations

import numpy as np

from mmw.watermark import prf
from mmw.watermark.plugins import Pivots, PluginDetector, WatermarkPlugin
from mmw.validation import Section, allowed


class Params(Section):
    """The plugin's parameters (``scheme.plugin_params``): strict types, unknown keys refused, ``allowed`` is what
    an error message lists."""

    delta: float = allowed("a number > 0 (logit bias of green tokens)", default=2.0, gt=0.0, le=100.0)
    gamma: float = allowed("a number in (0, 1) (share of green tokens)", default=0.25, gt=0.0, lt=1.0)


def _green(key: int, previous: np.ndarray, tokens: np.ndarray, gamma: float) -> np.ndarray:
    """Whether each token is green after its previous token under ``key`` (a keyed hash below gamma)."""
    seeded = prf.prf_np(np.uint64(key & prf.MASK64), previous.astype(np.uint64))
    return prf.unit_np(prf.prf_np(seeded, tokens.astype(np.uint64))) < gamma


# ------------------------------------------------------------------------------------------------ FILL IN (1 of 2)
def watermark_scores(params: Params, key: int, input_ids, scores):
    """Generation: the watermarked logits of one step. input_ids int64 [B, S]; scores float [B, V] (already
    temperature-scaled, a copy). Returns float [B, V]. Replace the body with your library's processor."""
    import torch

    previous = input_ids[:, -1:].cpu().numpy()
    candidates = np.arange(scores.shape[1])[None, :]
    green = torch.from_numpy(_green(key, previous, candidates, params.gamma)).to(scores.device)
    return scores + params.delta * green.to(scores.dtype)


# ------------------------------------------------------------------------------------------------ FILL IN (2 of 2)
def green_units(params: Params, key: int, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Detection: per token of a text (int64 [N]), its green count and its unit count, and the green probability
    gamma of a unit under H0 (text not written with this key). Replace the body with your library's detector."""
    green = np.zeros(len(tokens))
    units = np.zeros(len(tokens), dtype=np.int64)
    if len(tokens) > 1:  # the first token has no previous token: no unit
        green[1:] = _green(key, tokens[:-1], tokens[1:], params.gamma)
        units[1:] = 1
    return green, units, params.gamma


# ------------------------------------------------------------------------------------------------ the plumbing
class Processor:
    """One batch's processor (built fresh per batch: keep per-row state here if your library has any)."""

    def __init__(self, params: Params, key: int):
        self.params, self.key = params, key

    def __call__(self, input_ids, scores):
        return watermark_scores(self.params, self.key, input_ids, scores)


class Detector(PluginDetector):
    def __init__(self, params: Params, key: int):
        self.params, self.key = params, key

    def score(self, tokens: np.ndarray) -> Pivots:
        green, units, gamma = green_units(self.params, self.key, np.asarray(tokens, dtype=np.int64))
        return Pivots(values=-np.asarray(green, dtype=np.float64), units=np.asarray(units, dtype=np.int64),
                      null="green", gamma=float(gamma))


class Watermark(WatermarkPlugin):
    label = "{name}"
    distortion_free = False
    requires = ()  # import names of the packages processor/detector need, e.g. ("my_library",)
    Params = Params

    def processor(self, params, key, vocab_size, temperature, row_seeds):
        return Processor(params, key)

    def detector(self, params, key, vocab_size):
        return Detector(params, key)
'''

TEST = '''\
"""The mmw plugin contract and the null false-positive rate of {name} (run: python -m pytest tests)."""

import numpy as np
from scipy import stats

from mmw.watermark.plugin_detection import PluginSchemeDetector, SyntheticModel
from mmw.watermark.plugin_contract import check_plugin

ALPHA = 0.02


def test_the_plugin_keeps_the_mmw_contract():
    check_plugin("{name}")  # raises SpecError naming the plugin and the broken rule


def test_the_false_positive_rate_on_random_text_is_at_most_alpha():
    spec = check_plugin("{name}", temperatures=(1.0,)).model_copy(update={{"alpha": ALPHA}})
    rng = np.random.default_rng(7)
    texts = [rng.integers(0, 1000, 100) for _ in range(500)]
    # SyntheticModel: random logits for a detector with needs_model (ignored otherwise); measure the FPR on real
    # text with the generator too (mmw's bench/plugins.py --sweet does so for its SWEET adapter).
    detector = PluginSchemeDetector(spec, 0x1234_5678, 1000, SyntheticModel(1000))
    positives = sum(r.detected for r in detector.detect(texts))
    assert positives <= stats.binom.isf(1e-3, len(texts), ALPHA)
'''

README = '''\
# {name}: an mmw watermark plugin

1. Fill in `watermark_scores` and `green_units` in `{name}/watermark.py` (and `Params`).
2. Install into mmw's environment without touching its pins: `.venv/bin/python -m pip install --no-deps -e <this folder>`
   (from the mmw checkout; docs/PLUGINS.md says what to do when your library pins other versions).
3. `.venv/bin/python -m pytest <this folder>/tests`: the contract check and the null FPR.
4. In the mmw checkout: `.venv/bin/dvc exp run -S scheme.sampler=plugin -S scheme.plugin={name} ...` (docs/PLUGINS.md).
'''


def new_plugin(name: str, directory: Path) -> list[Path]:
    """Write the package ``directory/name``: SpecError (exit 2) for a bad name or an existing folder."""
    if not NAME_PATTERN.fullmatch(name) or keyword.iskeyword(name):
        raise SpecError("NAME", f"{name!r} is not a plugin name",
                        "a lowercase Python identifier: a letter, then letters, digits or _ (at most 63)")
    root = directory / name
    if root.exists():
        raise SpecError("--dir", f"{root} already exists (nothing is overwritten)", "a folder without NAME in it")
    if not directory.is_dir():
        raise SpecError("--dir", f"{directory} is not a folder", "an existing folder")
    files = {"pyproject.toml": PYPROJECT, f"{name}/__init__.py": '"""{name}: an mmw watermark plugin."""\n',
             f"{name}/watermark.py": WATERMARK, f"tests/test_{name}.py": TEST, "README.md": README}
    # Written into a hidden sibling, then renamed: an interrupted run leaves no half package under the name.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory))
    try:
        for relative, template in files.items():
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            (staging / relative).write_text(template.format(name=name))
        os.rename(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [root / relative for relative in files]
