"""False-positive rates and power of the shipped plugin adapters (mmw.watermark.plugins), on simulated text.

Null: i.i.d. uniform token sequences the key did not write (vocabulary V, N texts of L tokens): per adapter the
full-text FPR, the any-prefix FPR of E (first crossing), the any-checkpoint FPR of size_valid and the any-prefix
FPR of the anytime size, each with its exact (Clopper-Pearson) 95 % interval. Power: texts sampled through mmw's
processor from a synthetic language model (i.i.d. normal logits, sd 3, per step) at T = 0.7 and 1: detection
rate and median E / size_valid / anytime size (undetected = inf).

    nice -n 15 .venv/bin/python bench/plugins.py [N] [L]          # hf_kgw, hf_synthid
    nice -n 15 .venv-vllm/bin/python bench/plugins.py [N] [L]     # + vllm_gumbel

``--sweet N L``: the model-aware ``sweet_kgw`` detector (entropies from the embedded SmolLM2 generator) on real
text the generator did not write (this machine's licences and man pages, tokenized by the generator: the null
corpus of bench/oracles.py), each text under its own key (independent verdicts): the FPRs as above and the share of
tokens above the entropy threshold. Writes bench/results/plugin_sweet_fpr.json.

    nice -n 15 .venv/bin/python bench/plugins.py --sweet 1000 200

``--exp-run``: the bad plugins of tests/test_plugins.py through ``dvc exp run`` in a copy of this checkout (the key
stage run once first): each case's last error line, dvc's exit code, and what changed on disk (params.yaml,
dvc.lock, data/, the DVC cache, git refs). Writes bench/results/plugin_exp_run.json.

    nice -n 15 .venv/bin/python bench/plugins.py --exp-run ["processor returns NaN" ...]
"""

from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np
import torch
from scipy import stats

from mmw.watermark.build import build_detector, build_processor
from mmw.watermark.scheme import SchemeSpec

KEY, ALPHA, V = 0x0DDB_A11_5EED, 0.02, 1000
ADAPTERS = {
    "kgw lefthash (green)": ("hf_kgw", {}),
    "kgw selfhash (green)": ("hf_kgw", {"seeding_scheme": "selfhash", "context_width": 4}),
    "kgw lefthash (zscore)": ("hf_kgw", {"detection": "zscore"}),
    "synthid m=30 n=5": ("hf_synthid", {}),
}
if importlib.util.find_spec("vllm") is not None:
    ADAPTERS |= {"vllm gumbel": ("vllm_gumbel", {}), "vllm dual_key_gumbel": ("vllm_gumbel", {"algorithm": "dual_key_gumbel"})}


def ci(k: int, n: int) -> str:
    lo, hi = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return f"{k / n:.2%} [{lo:.2%}, {hi:.2%}]"


def generate(spec: SchemeSpec | None, rows: int, steps: int, temperature: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    proc = build_processor(spec, KEY, V, [seed * 10_007 + r for r in range(rows)], temperature)
    ids = torch.from_numpy(rng.integers(0, V, (rows, 4)))
    for _ in range(steps):
        scores = torch.from_numpy((rng.normal(size=(rows, V)) * 3).astype(np.float32))
        ids = torch.cat([ids, proc(ids, scores).argmax(-1, keepdim=True)], dim=1)
    return [row[4:].copy() for row in ids.numpy()]


def median(sizes: list[int | None]) -> str:
    m = np.median([np.inf if s is None else s for s in sizes])
    return "inf" if not np.isfinite(m) else f"{m:g}"


def main(n: int, length: int) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(2026)
    nulls = [rng.integers(0, V, length) for _ in range(n)]
    print(f"V = {V}, alpha = {ALPHA}, null: {n} uniform texts x {length} tokens; power: 50 texts x {length} tokens")
    print("| adapter | FPR full text | any prefix (E) | any checkpoint (valid) | any prefix (anytime) | "
          "T | detected | median E / valid / anytime | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (plugin, params) in ADAPTERS.items():
        start = time.time()
        spec = SchemeSpec.from_params({"sampler": "plugin", "plugin": plugin, "plugin_params": params, "alpha": ALPHA})
        detector = build_detector(spec, KEY, V)
        res = detector.detect(nulls)
        anytime = ci(sum(r.size_anytime is not None for r in res), n) if spec.exact_null else "n/a"
        row = (f"| {name} | {ci(sum(r.detected for r in res), n)} | {ci(sum(r.size is not None for r in res), n)} | "
               f"{ci(sum(r.size_valid is not None for r in res), n)} | {anytime} |")
        for temperature in (0.7, 1.0):
            marked = detector.detect(generate(spec, 50, length, temperature, seed=7))
            sizes = " / ".join(median([getattr(r, k) for r in marked]) for k in ("size", "size_valid", "size_anytime"))
            print(f"{row} {temperature:g} | {sum(r.detected for r in marked)}/50 | {sizes} | {time.time() - start:.0f} |",
                  flush=True)


#: Texts a forward pass in --sweet.
BATCH = 8


class Precomputed:
    """A DetectionModel whose logits for one text were computed in a batch (what GeneratorModel.logits returns)."""

    tokenizer = None

    def __init__(self, rows: np.ndarray, model):
        self.rows, self.model, self.vocab_size = rows, model.model, model.vocab_size

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        return self.rows[: len(tokens)]


def sweet(n: int, length: int, threshold: float = 0.9) -> dict:
    """The FPR of ``sweet_kgw`` on real null text with the generator's entropies (module docstring)."""
    import json
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from oracles import null_corpus

    from mmw.stages.common import generator_model
    from mmw.watermark.plugin_detection import PluginSchemeDetector
    from mmw.watermark.prf import prf_int

    torch.set_num_threads(1)
    model = generator_model("embedded:smollm2-135m", "cpu", "float32")
    texts, record = null_corpus(model.tokenizer, n, length)
    spec = SchemeSpec.from_params({"sampler": "plugin", "plugin": "sweet_kgw", "alpha": ALPHA,
                                   "plugin_params": {"entropy_threshold": threshold}})
    start, results, kept = time.time(), [], []
    bos = model.tokenizer.bos_token_id
    for first in range(0, len(texts), BATCH):  # one forward pass a batch (the windows have one length)
        block = np.stack(texts[first: first + BATCH])
        ids = block if bos is None else np.concatenate([np.full((len(block), 1), bos), block], axis=1)
        with torch.inference_mode():
            logits = model.model(torch.as_tensor(ids)).logits[:, :, : model.vocab_size].float().numpy()
        for j, text in enumerate(block):
            rows = logits[j, : len(text)] if bos is not None else np.vstack(
                [np.zeros((1, model.vocab_size), np.float32), logits[j, : len(text) - 1]])
            i = first + j
            detector = PluginSchemeDetector(spec, prf_int(KEY, i), model.vocab_size, Precomputed(rows, model))
            results.append(detector.detect([text])[0])
            kept.append(results[-1].n_scored / max(len(text) - 1, 1))
        print(f"{len(results)}/{len(texts)} texts, {sum(r.detected for r in results)} detected, "
              f"{time.time() - start:.0f} s", flush=True)
    counts = {"full text": sum(r.detected for r in results), "any prefix (E)": sum(r.size is not None for r in results),
              "any checkpoint (valid)": sum(r.size_valid is not None for r in results),
              "any prefix (anytime)": sum(r.size_anytime is not None for r in results)}
    out = {"texts": n, "length": length, "alpha": ALPHA, "entropy_threshold": threshold,
           "generator": "embedded:smollm2-135m (cpu, float32)", "corpus": record, "keys": "one per text",
           "fpr": {k: ci(v, n) for k, v in counts.items()}, "counts": counts,
           "kept_token_share_median": float(np.median(kept)), "seconds": round(time.time() - start, 1)}
    print(json.dumps({k: v for k, v in out.items() if k != "corpus"}, indent=1))
    Path("bench/results/plugin_sweet_fpr.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


BAD = {  # case -> (the -S overrides beyond sampler=plugin and the nulled blocks)
    "not installed": ["scheme.plugin=nosuch"],
    "import fails": ["scheme.plugin=broken"],
    "not a plugin class": ["scheme.plugin=notplugin"],
    "bad plugin_params": ["scheme.plugin=toy", "scheme.plugin_params='{delta: -1.0}'"],
    "processor changes shape": ["scheme.plugin=shape"],
    "processor returns NaN": ["scheme.plugin='nan'"],  # quoted: DVC's override grammar reads a bare nan as a float
    "p-values above 1": ["scheme.plugin=badp"],
    "pivots without a null": ["scheme.plugin=nonull"],
}
NULLED = [f"scheme.{k}=null" for k in ("randomness", "window", "delta", "gamma", "score")]


def exp_run(only: list[str], workdir: str = "/tmp/mmw-plugin-exp-run") -> dict:
    """The bad plugins through ``dvc exp run`` (module docstring); ``only``: case names (default all), merged into
    the results file."""
    import json
    import shutil
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from pipeline_repo import copy_checkout, run
    from test_plugin_exp_run import disk_state, install_fake_plugins

    shutil.rmtree(workdir, ignore_errors=True)
    repo = copy_checkout(Path(workdir))
    install_fake_plugins(repo)
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "checkout")
    run(repo, "dvc", "repro", "key")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "key")
    out = Path("bench/results/plugin_exp_run.json")
    rows = json.loads(out.read_text()) if only and out.exists() else {}
    for case, overrides in BAD.items():
        if only and case not in only:
            continue
        before = disk_state(repo)
        start = time.time()
        args = [a for o in ["scheme.sampler=plugin", *overrides, *NULLED] for a in ("-S", o)]
        done = run(repo, "dvc", "exp", "run", *args, check=False)
        after = disk_state(repo)
        errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")]
        rows[case] = {"exit": done.returncode, "message": errors[-1] if errors else None,
                      "changed": sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)),
                      "seconds": round(time.time() - start, 1)}
        run(repo, "git", "checkout", "--", "params.yaml")  # what the error says to do
        restored = disk_state(repo)
        rows[case]["changed after git checkout -- params.yaml"] = sorted(
            k for k in before.keys() | restored.keys() if before.get(k) != restored.get(k))
        print(case, json.dumps(rows[case]), flush=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sweet"]:
        sweet(int(sys.argv[2]) if len(sys.argv) > 2 else 1000, int(sys.argv[3]) if len(sys.argv) > 3 else 200)
    elif sys.argv[1:2] == ["--exp-run"]:
        exp_run(sys.argv[2:])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000, int(sys.argv[2]) if len(sys.argv) > 2 else 200)
