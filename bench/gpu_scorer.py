"""The quality stage's work and a model load on one GPU, before and after, in one process: the scorer's forward
(``mmw.quality.scoring.score_texts``), the repetition measure, and loading a model whose tokenizer is not loaded
yet (the judge's case in a warm process).

    PYTHONPATH=.:bench python3 bench/gpu_scorer.py --tokenizer /tmp/tok --before .gpu/before --out DIR
    ... --passes 1 --extra-batches "" --no-load      # the bits check alone

``--before``: a folder holding the earlier ``scoring.py`` and ``repetition.py`` (``git show REV:mmw/quality/...``).
Texts: the paper's 296 prompts, each with two replies of 1,024 tokens drawn uniformly from the vocabulary and
decoded (what the random-init generator of bench/gpu_fullscale.py writes), so 592 texts as in the full
configuration's quality stage; the scorer is a random-init Llama-3-8B-shaped model in bf16 (gpu_fullscale's
``ARCHS``). Scoring runs before, after, after, before (``--passes`` each; the first includes any warm-up), and
the perplexities and features of the variants are compared, bit for bit and by their largest relative
difference; then the current code at other batch sizes (``--extra-batches``). A profile of each variant's first
batches lists the kernels that take the time. The load part saves the model once, then loads it through links of
fresh names (so no tokenizer is shared): the tokenizer alone, the weights alone, both one after the other (the earlier
``load_model``), and ``mmw.engines.models.load_model`` (the current one), alternately.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import torch
import typer


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _texts(tokenizer, n_per_prompt: int, new_tokens: int, vocab: int) -> tuple[list[str], list[str]]:
    from mmw.tasks import task_prompts

    prompts = [p for task in ("book_report", "story", "fake_news") for p in task_prompts(task)[0]]
    generator = torch.Generator().manual_seed(0)
    out_prompts, texts = [], []
    for _ in range(n_per_prompt):
        ids = torch.randint(0, vocab, (len(prompts), new_tokens), generator=generator)
        texts += tokenizer.batch_decode(ids, skip_special_tokens=True)
        out_prompts += prompts
    return out_prompts, texts


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn):
    _sync()
    start = time.perf_counter()
    result = fn()
    _sync()
    return result, time.perf_counter() - start


def _profile(fn, rows: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:rows]
    return [dict(name=e.key[:90], ms=round(e.device_time_total / 1e3, 2), calls=e.count) for e in events]


def main(tokenizer: Path = Path("/tmp/tok"), before: Path = Path(".gpu/before"), out: str = "",
         batch_size: int = 8, max_tokens: int = 512, load: bool = True, arch: str = "llama3-8b",
         new_tokens: int = 1024, extra_batches: str = "16,32", passes: int = 2) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from gpu_fullscale import ARCHS
    from mmw.engines import models
    from mmw.quality import repetition as rep_after
    from mmw.quality import scoring as after

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = models.resolve_dtype("auto", device)
    result: dict = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "arch": arch,
                    "torch": torch.__version__,
                    "transformers": __import__("transformers").__version__, "batch_size": batch_size,
                    "max_tokens": max_tokens}
    tok = models._padding_left(AutoTokenizer.from_pretrained(tokenizer))
    cfg = LlamaConfig(**ARCHS[arch], bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    result["model_init_s"] = round(time.perf_counter() - t0, 1)
    prompts, texts = _texts(tok, 2, new_tokens, cfg.vocab_size)
    result["texts"] = len(texts)

    # --- repetition: the same numbers, and the time over the 592 texts
    rep_before = _module(before / "repetition.py", "repetition_before")
    t0 = time.perf_counter()
    old = [rep_before.repetition(t) for t in texts]
    t1 = time.perf_counter()
    new = [rep_after.repetition(t) for t in texts]
    t2 = time.perf_counter()
    result["repetition"] = dict(before_s=round(t1 - t0, 3), after_s=round(t2 - t1, 3), identical=old == new,
                                words_mean=round(float(np.mean([len(rep_after.words(t)) for t in texts])), 1))
    print("repetition", json.dumps(result["repetition"]), flush=True)

    # --- the scorer
    score_before = _module(before / "scoring.py", "scoring_before").score_texts
    variants = {"before": score_before, "after": after.score_texts}
    runs, scores = [], {}
    for label in ("before", "after", "after", "before"):
        for attempt in range(1, passes + 1):
            s, seconds = _timed(lambda f=variants[label]: f(tok, model, prompts, texts, max_tokens, batch_size))
            runs.append(dict(variant=label, attempt=attempt, seconds=round(seconds, 3)))
            print(json.dumps(runs[-1]), flush=True)
            scores.setdefault(label, []).append(s)
    result["runs"] = runs

    def compare(a, b) -> dict:
        pa, pb = a.perplexity, b.perplexity
        both = ~np.isnan(pa) & ~np.isnan(pb)
        rel = np.abs(pa[both] - pb[both]) / np.abs(pb[both])
        feat = np.linalg.norm(a.features - b.features, axis=1) / np.maximum(np.linalg.norm(b.features, axis=1), 1e-30)
        return dict(same_nan=bool((np.isnan(pa) == np.isnan(pb)).all()),
                    ppl_bit_identical=bool(np.array_equal(pa[both], pb[both])),
                    ppl_max_rel=float(rel.max()), ppl_median_rel=float(np.median(rel)),
                    features_bit_identical=bool(np.array_equal(a.features, b.features)),
                    features_max_rel=float(feat.max()))

    result["compare"] = {"before vs before": compare(scores["before"][0], scores["before"][-1]),
                         "after vs after": compare(scores["after"][0], scores["after"][-1]),
                         "after vs before": compare(scores["after"][0], scores["before"][0])}
    # the scale of bf16 rounding: the same code with another batch composition (rows meet other rows, widths)
    other, _ = _timed(lambda: score_before(tok, model, prompts, texts, max_tokens, batch_size // 2))
    result["compare"]["before, batch/2 vs before"] = compare(other, scores["before"][0])
    for size in (int(b) for b in extra_batches.split(",") if b):
        s, seconds = _timed(lambda size=size: after.score_texts(tok, model, prompts, texts, max_tokens, size))
        runs.append(dict(variant=f"after, batch {size}", attempt=1, seconds=round(seconds, 3)))
        result["compare"][f"after, batch {size} vs after"] = compare(s, scores["after"][0])
        print(json.dumps(runs[-1]), flush=True)
    result["perplexity_median"] = float(np.nanmedian(scores["before"][0].perplexity))
    for key, value in result["compare"].items():
        print(key, json.dumps(value), flush=True)
    n = batch_size * 4
    result["profile"] = {label: _profile(lambda f=f: f(tok, model, prompts[:n], texts[:n], max_tokens, batch_size), 14)
                         for label, f in variants.items()}
    for label, rows in result["profile"].items():
        print("profile", label, json.dumps(rows[:8]), flush=True)
    del model
    torch.cuda.empty_cache()

    # --- loading a model whose tokenizer is not loaded yet
    if load:
        folder = Path("/tmp/scorer-model")
        t0 = time.perf_counter()
        if not (folder / "config.json").is_file():
            torch.manual_seed(0)
            with device:
                LlamaForCausalLM(cfg).to(dtype).save_pretrained(folder)
            tok.save_pretrained(folder)
            torch.cuda.empty_cache()
        result["save_s"] = round(time.perf_counter() - t0, 1)
        loads = []

        def link(name: str) -> str:
            path = Path(f"/tmp/scorer-link-{name}")
            if not path.exists():
                path.symlink_to(folder, target_is_directory=True)
            return str(path)

        from transformers import AutoModelForCausalLM

        for round_ in (1, 2):
            with models.shared_loads():
                _, seconds = _timed(lambda: models.load_tokenizer(link(f"tok{round_}")))
                loads.append(dict(round=round_, way="tokenizer alone", seconds=round(seconds, 2)))
                m, seconds = _timed(lambda: AutoModelForCausalLM.from_pretrained(
                    link(f"w{round_}"), dtype=dtype, device_map=device))
                loads.append(dict(round=round_, way="weights alone", seconds=round(seconds, 2)))
                del m
                torch.cuda.empty_cache()

                def sequential(name=f"seq{round_}"):
                    models.load_tokenizer(link(name))
                    return AutoModelForCausalLM.from_pretrained(link(name), dtype=dtype, device_map=device)

                m, seconds = _timed(sequential)
                loads.append(dict(round=round_, way="tokenizer then weights (before)", seconds=round(seconds, 2)))
                del m
                torch.cuda.empty_cache()
                (_, m), seconds = _timed(lambda: models.load_model(link(f"new{round_}"), device.type, "auto"))
                loads.append(dict(round=round_, way="load_model (after)", seconds=round(seconds, 2)))
                del m
                torch.cuda.empty_cache()
            for row in loads[-4:]:
                print(json.dumps(row), flush=True)
        result["loads"] = loads
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_scorer.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    typer.run(main)
