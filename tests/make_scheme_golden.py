"""Record how the config model answers a fixed set of inputs: ``tests/data/scheme_golden.json.gz``.

Three groups, each input with the normalized result (typed values) or the exact error text:

- ``sweeps``: every config of sweeps/paper.yaml, small.yaml and smoke.yaml (expanded by ``mmw.sweep.definition``)
  -> the normalized scheme (``SchemeSpec.to_dict``);
- ``schemes``: a seeded random set of scheme mappings, valid and invalid, drawn key by key from pools of good,
  bad and mistyped values -> the normalized scheme or the ``SpecError`` text;
- ``boards``: params.yaml (its key replaced by a placeholder) with one entry changed (each section key set to a
  bad value, unknown keys, missing sections) -> the validated board's sections (``mmw.params.parse_params``) or
  the ``SpecError`` text.

Every input is stored (the boards as the base board they are derived from), so the file keeps its meaning when
params.yaml or sweeps/*.yaml change.

``tests/test_config_model.py`` holds the config model to this file. Run ``python tests/make_scheme_golden.py``
from the repository root (``MMW_GOLDEN_ROOT`` points at another checkout to record its answers instead) only
after a deliberate change of what a config means, and commit the file with it.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(os.environ.get("MMW_GOLDEN_ROOT", Path(__file__).resolve().parents[1]))
PATH = Path(__file__).with_name("data") / "scheme_golden.json.gz"
SWEEPS = ("paper", "small", "smoke")
N_SCHEMES = 4000
PLACEHOLDER_KEY = "golden-file-placeholder-key"
ABSENT = object()

# Values per scheme key: valid ones first and more often, then out-of-range, mistyped and null values.
POOLS: dict[str, list[Any]] = {
    "sampler": ["distribution_shift", "exponential", "inverse_transform", "binary", "exp", "none"],
    "randomness": ["window", "minhash", "fixed", "windw", None],
    "score": ["sum", "align", "edit", "sums", 1],
    "window": [ABSENT, 1, 0, 2, 3, 4, None, -1, 1.5, "1", 2.0, True],
    "key_length": [ABSENT, 4, 1, 256, None, 0, 2.0],
    "delta": [ABSENT, 2.0, 5, 0.5, None, -1, "2", 0.0, float("nan")],
    "gamma": [ABSENT, 0.25, 0.5, None, 1.0, 0, "0.5"],
    "skip_prob": [ABSENT, 0.05, 0.0, None, 1.0, -0.1],
    "psi": [ABSENT, 0.5, 0.0, 1, None, -1],
    "trials": [ABSENT, 100, 49, 200, 10, None, 0, 1.5],
    "alpha": [ABSENT, 0.02, 0.05, 0.001, None, 0.0, 1.0],
    "binary_code": [ABSENT, "huffman", "fixed", None, "gray"],
}
EXTRA: list[dict[str, Any]] = [{}] * 40 + [{"colour": "red"}, {"key": "abc"}, {"key": None}, {"Window": 1}]


def _typed(value: Any) -> Any:
    """A JSON form that keeps the type: 2 and 2.0 and True differ."""
    return [type(value).__name__, value if not isinstance(value, float) else repr(value)]


def random_schemes(seed: int = 0, n: int = N_SCHEMES) -> list[dict[str, Any]]:
    """A sensible scheme per draw (each part and the keys it needs), then 0-3 changes drawn from the pools."""
    rng = random.Random(seed)
    schemes = []
    for _ in range(n):
        scheme: dict[str, Any] = {part: rng.choice(POOLS[part][:-2]) for part in ("sampler", "randomness", "score")}
        if scheme["randomness"] == "fixed":
            scheme["key_length"] = rng.choice([4, 256, 2])
        else:
            scheme["window"] = rng.choice([1, 1, 2, 3, 0])
        if scheme["sampler"] == "distribution_shift":
            scheme["delta"] = rng.choice([2.0, 5, 0.5])
        if scheme["score"] == "edit":
            scheme["psi"] = rng.choice([0.5, 0.0, 1])
        for key in ("gamma", "skip_prob", "trials", "alpha", "binary_code"):
            if rng.random() < 0.15:
                scheme[key] = POOLS[key][1 + rng.randrange(2)]
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            key = rng.choice(list(POOLS))
            value = rng.choice(POOLS[key])
            if value is ABSENT:
                scheme.pop(key, None)
            else:
                scheme[key] = value
        if rng.random() < 0.03:
            scheme.pop(rng.choice(["sampler", "randomness", "score"]), None)
        scheme.update(rng.choice(EXTRA))
        schemes.append(scheme)
    return schemes


def scheme_result(scheme: Any) -> dict[str, Any]:
    from mmw.errors import SpecError
    from mmw.watermark.scheme import SchemeSpec

    try:
        spec = SchemeSpec.from_params(scheme)
    except SpecError as err:
        return {"error": str(err)}
    return {"spec": {k: _typed(v) for k, v in sorted(spec.to_dict().items())}, "describe": spec.describe(),
            "text_dependent": spec.text_dependent, "exact_null": spec.exact_null}


def board_variants(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, params mapping) pairs: the board itself, then one change each."""
    bad_values: list[Any] = [None, -1, 0, 1.5, True, "x", "cuda:x", [], {}, "auto", 2.0]
    variants = [("board", copy.deepcopy(board))]
    for section in ("seed", "model", "prompts", "attacks", "detect", "rate", "scheme", "low_entropy", "quality"):
        missing = copy.deepcopy(board)
        missing.pop(section, None)
        variants.append((f"-{section}", missing))
        if isinstance(board.get(section), dict):
            for key in board[section]:
                for value in bad_values:
                    changed = copy.deepcopy(board)
                    changed[section][key] = value
                    variants.append((f"{section}.{key}={value!r}", changed))
                dropped = copy.deepcopy(board)
                del dropped[section][key]
                variants.append((f"-{section}.{key}", dropped))
            extra = copy.deepcopy(board)
            extra[section]["bogus"] = 1
            variants.append((f"{section}.bogus", extra))
        else:
            for value in bad_values:
                changed = copy.deepcopy(board)
                changed[section] = value
                variants.append((f"{section}={value!r}", changed))
    for top in ("attack", "Key"):
        extra = copy.deepcopy(board)
        extra[top] = 1
        variants.append((top, extra))
    variants.append(("not a mapping", [board]))  # type: ignore[list-item]
    return variants


def _dump(value: Any) -> Any:
    if hasattr(value, "to_dict"):  # the scheme: its normalized keys
        return {k: _typed(v) for k, v in sorted(value.to_dict().items())}
    if hasattr(value, "model_dump"):
        return {k: _dump(v) for k, v in value.model_dump().items()}
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return _typed(value)


def board_result(raw: Any) -> dict[str, Any]:
    from mmw.errors import SpecError
    from mmw.params import parse_params
    from mmw.quality.params import LowEntropyParams, QualityParams
    from mmw.watermark.scheme import SchemeSpec

    try:
        params = parse_params(raw, models={"scheme": SchemeSpec, "low_entropy": LowEntropyParams,
                                           "quality": QualityParams})
    except SpecError as err:
        return {"error": str(err)}
    names = ("seed", "model", "prompts", "scheme", "attacks", "detect", "rate", "low_entropy", "quality")
    # The key is left out (it never goes into a file); whether it validated shows as no error.
    return {"params": {name: _dump(getattr(params, name)) for name in names}}


def record() -> dict[str, Any]:
    from mmw.sweep.definition import expand

    board = yaml.safe_load((ROOT / "params.yaml").read_text())
    board["key"] = PLACEHOLDER_KEY  # the recorded inputs carry no real key
    sweeps = {}
    for name in SWEEPS:
        sweep = expand(name, board, ROOT / "sweeps", validate=False)
        sweeps[name] = {}
        for config in sweep.configs:
            scheme = {k.split(".", 1)[1]: v for k, v in config.overrides.items() if k.startswith("scheme.")}
            sweeps[name][config.config_id] = {"scheme": scheme, **scheme_result(scheme)}
    schemes = [{"scheme": scheme, **scheme_result(scheme)} for scheme in random_schemes()]
    boards = [{"label": label, **board_result(raw)} for label, raw in board_variants(board)]
    return {"sweeps": sweeps, "schemes": schemes, "board": board, "boards": boards}


def load() -> dict[str, Any]:
    """The recorded answers."""
    return json.loads(gzip.decompress(PATH.read_bytes()))


def main() -> None:
    sys.path.insert(0, str(ROOT))
    data = record()
    PATH.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=0, sort_keys=True, default=repr) + "\n"
    with open(PATH, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:  # same bytes each time
        out.write(text.encode())
    errors = sum("error" in s for s in data["schemes"])
    print(f"wrote {PATH}: {sum(len(s) for s in data['sweeps'].values())} sweep configs, {len(data['schemes'])} "
          f"schemes ({errors} invalid), {len(data['boards'])} boards")


if __name__ == "__main__":
    main()
