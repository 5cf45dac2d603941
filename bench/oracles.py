"""The reference implementations as oracles: mmw's own blocks against the outside implementations they
are meant to be, at matched settings, on the embedded generator (SmolLM2-135M) and real prompts of the repo's tasks.

Pairs (mmw side | reference side, through its adapter in ``mmw.watermark.plugins``):
- tournament m = 30, 2 leaves, window 4          | transformers' SynthID-Text, depth 30, ngram_len 5 (4 + 1)
- C4 + SelfHash window 4, gamma 0.25, delta 2 T  | transformers' KGW selfhash, context_width 4, ratio 0.25, bias 2
- C4 window 1, gamma 0.25, delta 2 T             | transformers' KGW lefthash, context_width 1, ratio 0.25, bias 2
- C1 exponential window 4 (units deduplicated)   | vLLM's gumbel, context_width 4, deduplicate_contexts single_turn
- the same C1 with mask_repeated (repeated        | the same vLLM gumbel generations (stored once)
  contexts sampled plainly, as vLLM does)

Delta: mmw's C4 adds delta to the logits *before* the temperature, transformers adds its bias to the
temperature-scaled logits (its processor runs after the warpers), so mmw's delta = bias x T gives the same sampling
distribution softmax(l / T + bias * green) (bench/results/oracles.md states what is matched and what is not).

Per pair and temperature, on watermarked text of the same prompts, row seeds and mmw key (each adapter derives its
own key from it), generated in-process and batched through mmw's engine (``mmw.engines.generate.generate``) with
``mmw.watermark.build.build_processor`` and detected with ``mmw.watermark.build.build_detector``:
(a) detection score: the per-unit score normalised the same way on both sides -- green share (KGW/C4), share of
    g = 1 among the m bits (tournament/SynthID), mean Exp(1) score (C1/vLLM) -- and the per-text z of it; both are
    the same statistic of the same null (Binomial/Erlang per deduplicated unit), so under "the two implement the same
    scheme" their distributions agree; Mann-Whitney U (two-sided) and KS at level 0.05;
(b) relative quality: per prompt, log perplexity of the watermarked reply minus that of the same prompt's
    unwatermarked reply (same row seed), under the pipeline's quality scorer (``mmw.quality.scoring.score_texts``,
    the generator SmolLM2-135M: the generator's own likelihood, a proxy for the judge); Mann-Whitney U between the
    sides at 0.05 (and the paired Wilcoxon signed-rank test on the same prompts); with ``--judge``, the same tests
    on the judge's rating of each reply minus that of the same prompt's baseline (the benchmark's own quality);
(c) each side's null FPR at alpha: on the unwatermarked replies (both temperatures, the run's key) and on
    ``--null-texts`` windows of real text the generator did not write (licences and man pages of this machine,
    bench/anytime_corpus.py's builder; one key per window), full-text detection with exact Clopper-Pearson 95 %
    intervals.

Needs vllm for the fourth pair (run in .venv-vllm; in .venv the pair is skipped with a line saying so):

    nice -n 5 .venv-vllm/bin/python bench/oracles.py --per-task 8 --tokens 200 --null-texts 500 \\
        --out bench/results/oracles.json

``--judge embedded:...`` in .venv-vllm needs the judge's model there once: ``.venv-vllm/bin/python -m pip install -e '.[judges]'``.

Generations are stored under ``--parts`` (resumable: rerunning skips finished batches).
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import typer
from scipy import stats

from mmw.engines.generate import generate
from mmw.engines.models import load_model
from mmw.io import write_json
from mmw.judge.judge import Judge
from mmw.watermark.build import build_detector, build_processor
from mmw.watermark.prf import key_from_string, prf_int
from mmw.quality.scoring import score_texts
from mmw.watermark.scheme import SchemeSpec
from mmw.stages.common import generator_vocab_size
from mmw.tasks import build_prompts, render_chat

MODEL = "embedded:smollm2-135m"
KEY = key_from_string("bench-oracles")
#: KGW as transformers ships it by default.
KGW_BIAS, KGW_GAMMA = 2.0, 0.25
SYNTHID_DEPTH, SYNTHID_NGRAM = 30, 5
GUMBEL_WIDTH = 4


@dataclass(frozen=True)
class Pair:
    """One matched pair: ``kind`` names the per-unit score (green, bits, exp)."""

    name: str
    kind: str
    ours_label: str
    ref_label: str
    plugin: str
    plugin_params: dict
    #: the pair whose stored reference generations this one shares (same reference, another mmw side)
    same_reference_as: str | None = None

    def ours(self, temperature: float) -> dict:
        raise NotImplementedError


def mmw_delta(bias: float, temperature: float) -> float:
    """mmw's C4 delta that matches transformers' bias at this temperature (mmw shifts before the temperature)."""
    return bias * temperature


class Tournament(Pair):
    def ours(self, temperature):
        return {"sampler": "tournament", "layers": SYNTHID_DEPTH, "leaves": 2, "randomness": "window",
                "window": SYNTHID_NGRAM - 1, "score": "sum"}


class SelfHash(Pair):
    def ours(self, temperature):
        return {"sampler": "distribution_shift", "delta": mmw_delta(KGW_BIAS, temperature), "gamma": KGW_GAMMA,
                "randomness": "selfhash", "window": 4, "score": "sum"}


class LeftHash(Pair):
    def ours(self, temperature):
        return {"sampler": "distribution_shift", "delta": mmw_delta(KGW_BIAS, temperature), "gamma": KGW_GAMMA,
                "randomness": "window", "window": 1, "score": "sum"}


class Gumbel(Pair):
    def ours(self, temperature):
        return {"sampler": "exponential", "randomness": "window", "window": GUMBEL_WIDTH, "score": "sum"}


class MaskedGumbel(Pair):
    def ours(self, temperature):
        return {**Gumbel.ours(self, temperature), "mask_repeated": True}


PAIRS = {
    "synthid": Tournament("Tournament vs SynthID-Text", "bits", "tournament m=30 leaves=2 window 4",
                          "hf_synthid depth=30 ngram_len=5", "hf_synthid",
                          {"depth": SYNTHID_DEPTH, "ngram_len": SYNTHID_NGRAM}),
    "selfhash": SelfHash("C4 + SelfHash vs KGW selfhash", "green", "C4 selfhash H=4 gamma=0.25 delta=2T",
                         "hf_kgw selfhash width 4 ratio 0.25 bias 2", "hf_kgw",
                         {"seeding_scheme": "selfhash", "context_width": 4, "bias": KGW_BIAS,
                          "greenlist_ratio": KGW_GAMMA}),
    "lefthash": LeftHash("C4 window vs KGW lefthash", "green", "C4 window H=1 gamma=0.25 delta=2T",
                         "hf_kgw lefthash width 1 ratio 0.25 bias 2", "hf_kgw",
                         {"seeding_scheme": "lefthash", "context_width": 1, "bias": KGW_BIAS,
                          "greenlist_ratio": KGW_GAMMA}),
    "gumbel": Gumbel("C1 Gumbel-max vs vLLM gumbel", "exp", "C1 exponential window 4 (dedup units)",
                     "vllm_gumbel gumbel width 4 single_turn", "vllm_gumbel",
                     {"algorithm": "gumbel", "context_width": GUMBEL_WIDTH, "deduplicate_contexts": "single_turn"}),
    "gumbel-masked": MaskedGumbel("C1 Gumbel-max, repeats plain, vs vLLM gumbel", "exp",
                                  "C1 exponential window 4, mask_repeated (dedup units)",
                                  "vllm_gumbel gumbel width 4 single_turn", "vllm_gumbel",
                                  {"algorithm": "gumbel", "context_width": GUMBEL_WIDTH,
                                   "deduplicate_contexts": "single_turn"}, same_reference_as="gumbel"),
}


def specs(pair: Pair, temperature: float, alpha: float) -> dict[str, SchemeSpec]:
    return {"ours": SchemeSpec.from_params({**pair.ours(temperature), "alpha": alpha}),
            "ref": SchemeSpec.from_params({"sampler": "plugin", "plugin": pair.plugin,
                                           "plugin_params": pair.plugin_params, "alpha": alpha})}


def normalised(kind: str, side: str, result) -> tuple[float, float, int]:
    """(per-unit score, z, units) of one detection. green: share of green units; bits: share of g = 1 among the
    scored bits (mmw's tournament counts a token as one unit of m bits, the adapter counts its bits); exp: mean
    Exp(1) score per unit. Larger = more watermark on every side."""
    hits = -result.score
    units = result.n_scored * (SYNTHID_DEPTH if kind == "bits" and side == "ours" else 1)
    if units == 0:
        return float("nan"), float("nan"), 0
    if kind == "exp":
        return hits / units, (hits - units) / np.sqrt(units), units
    p0 = KGW_GAMMA if kind == "green" else 0.5
    return hits / units, (hits - p0 * units) / np.sqrt(units * p0 * (1 - p0)), units


def cp(k: int, n: int) -> list[float]:
    lo, hi = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return [k / n, float(lo), float(hi)]


def pct(cell: list[float]) -> str:
    return f"{cell[0]:.2%} [{cell[1]:.2%}, {cell[2]:.2%}]"


def null_corpus(tokenizer, texts: int, length: int, seed: int = 20261128) -> tuple[list[np.ndarray], dict]:
    """``texts`` windows of real text the generator did not write, half licences, half man pages."""
    sys.path.insert(0, str(Path(__file__).parent))
    from anytime_corpus import build_kind

    tokenizer.model_max_length = sys.maxsize
    windows, record = [], {}
    for kind, n in (("licences", texts // 2), ("man", texts - texts // 2)):
        block, record[kind] = build_kind(kind, tokenizer, n, length, per_file=4, seed=seed)
        record[kind].pop("windows")
        windows.extend(np.asarray(w, dtype=np.int64) for w in block)
    return windows, record


def main(per_task: int = 8, tokens: int = 200, temperatures: str = "0.7,1.0", alpha: float = 0.02,
         batch_size: int = 12, null_texts: int = 500, null_length: int = 200, only: str = "",
         parts: Path = Path("/tmp/mmw-oracles"), out: Path | None = None,
         judge: str = typer.Option("", help="also rate every reply with this judge (expected mode, the rate "
                                            "stage's), e.g. embedded:qwen2.5-coder-1.5b: the relative quality "
                                            "becomes the rating's difference to the same prompt's baseline too"),
         judge_dtype: str = "bfloat16") -> None:
    """``--only``: comma-separated pair names (synthid, selfhash, lefthash, gumbel, gumbel-masked; default all that
    can run)."""
    wanted = [p for p in only.split(",") if p] or list(PAIRS)
    for name in [n for n in wanted if n.startswith("gumbel")]:
        if importlib.util.find_spec("vllm") is None:
            print(f"{name}: vllm is not installed in this environment (run in .venv-vllm); pair skipped", flush=True)
            wanted.remove(name)
    tokenizer, model = load_model(MODEL, "cpu", "float32")
    vocab = generator_vocab_size(tokenizer, model)
    prompts = build_prompts(["book_report", "story", "fake_news"], per_task=per_task)
    texts_in = prompts["prompt"].to_list()
    chats = render_chat(tokenizer, texts_in)
    ids = prompts["prompt_id"].to_list()
    temps = [float(t) for t in temperatures.split(",")]
    record = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": sys.version.split()[0],
              "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "command": " ".join(sys.argv),
              "alpha": alpha, "tokens": tokens, "prompts": len(ids), "pairs": wanted, "texts": [], "tests": [],
              "null": []}

    def save() -> None:
        if out is not None:
            write_json(record, out)

    def run(name: str, spec: SchemeSpec | None, temperature: float) -> tuple[list[np.ndarray], list[str], float]:
        t0 = time.perf_counter()
        table = generate(model, tokenizer, chats,
                         lambda s: build_processor(spec, KEY, vocab, s, temperature),
                         tokens, batch_size, prompt_ids=ids, seed=1, parts_dir=parts / f"{name}-T{temperature:g}",
                         fingerprint=spec.describe() if spec is not None else "baseline", progress=False)
        return ([np.asarray(t, dtype=np.int64) for t in table["tokens"].to_list()], table["text"].to_list(),
                time.perf_counter() - t0)

    def log_ppl(texts: list[str]) -> np.ndarray:
        return np.log(score_texts(tokenizer, model, texts_in, texts, max_tokens=512, batch_size=batch_size).perplexity)

    rater = Judge(*load_model(judge, "cpu", judge_dtype), batch_size=8) if judge else None
    if judge:
        record["judge"] = {"model": judge, "dtype": judge_dtype, "mode": "expected"}

    def ratings(texts: list[str]) -> np.ndarray:
        """The judge's expected ratings (NaN where it put too little mass on grades, or without a judge)."""
        if rater is None:
            return np.full(len(texts), np.nan)
        return np.array([np.nan if r is None else r for r in rater.rate_expected(texts_in, texts)], dtype=float)

    baselines: dict[float, list[np.ndarray]] = {}
    for temperature in temps:
        base_tokens, base_text, seconds = run("baseline", None, temperature)
        baselines[temperature] = base_tokens
        base_lp = log_ppl(base_text)
        base_rating = ratings(base_text)
        n_base = sum(len(t) for t in base_tokens)
        print(f"T={temperature:g} baseline: {len(ids)} texts, {n_base} tokens, {seconds:.0f} s "
              f"({n_base / seconds:.1f} tok/s)", flush=True)
        record.setdefault("baseline", []).append({"temperature": temperature, "seconds": seconds, "tokens": n_base})
        for name in wanted:
            pair = PAIRS[name]
            side_rows = {}
            for side, spec in specs(pair, temperature, alpha).items():
                stored = pair.same_reference_as if side == "ref" and pair.same_reference_as else name
                toks, text, seconds = run(f"{stored}-{side}", spec, temperature)
                t0 = time.perf_counter()
                results = build_detector(spec, KEY, vocab, device="cpu").detect(toks)
                detect_s = time.perf_counter() - t0
                lp = log_ppl(text)
                rated = ratings(text)
                rows = []
                for pid, tok, res, l, lb, g, gb in zip(ids, toks, results, lp, base_lp, rated, base_rating,
                                                       strict=True):
                    score, z, units = normalised(pair.kind, side, res)
                    rows.append({"pair": name, "side": side, "temperature": temperature, "prompt_id": pid,
                                 "n_tokens": int(len(tok)), "units": units, "score": score, "z": z,
                                 "pvalue": res.pvalue, "detected": bool(res.detected),
                                 "size_valid": res.size_valid, "log_ppl": float(l), "log_ppl_base": float(lb),
                                 "rel_quality": float(l - lb), "rating": float(g), "rating_base": float(gb),
                                 "rel_rating": float(g - gb)})
                side_rows[side] = rows
                record["texts"].extend(rows)
                n_tok = sum(len(t) for t in toks)
                print(f"T={temperature:g} {name} {side}: {n_tok} tokens, generate {seconds:.0f} s "
                      f"({n_tok / seconds:.1f} tok/s), detect {detect_s:.1f} s, "
                      f"detected {sum(r['detected'] for r in rows)}/{len(rows)}, "
                      f"median score {np.nanmedian([r['score'] for r in rows]):.4f}", flush=True)
                save()
            record["tests"].append(compare(name, temperature, side_rows))
            save()
    # (c) null FPRs: the unwatermarked replies (run's key) and real text the generator did not write (one key each)
    corpus, corpus_record = null_corpus(tokenizer, null_texts, null_length) if null_texts else ([], {})
    record["null_corpus"] = {"texts": len(corpus), "length": null_length, "kinds": corpus_record}
    base_all = [t for temperature in temps for t in baselines[temperature]]
    for name in wanted:
        pair = PAIRS[name]
        for side, spec in specs(pair, temps[0], alpha).items():  # detection does not depend on delta
            t0 = time.perf_counter()
            base = build_detector(spec, KEY, vocab, device="cpu").detect(base_all)
            k_base = sum(r.detected for r in base)
            k_corpus = sum(build_detector(spec, prf_int(KEY, i), vocab, device="cpu").detect([w])[0].detected
                           for i, w in enumerate(corpus))
            row = {"pair": name, "side": side, "baseline": cp(k_base, len(base)) + [k_base, len(base)],
                   "corpus": cp(k_corpus, len(corpus)) + [k_corpus, len(corpus)] if corpus else None,
                   "seconds": time.perf_counter() - t0}
            record["null"].append(row)
            print(f"null {name} {side}: unwatermarked replies {k_base}/{len(base)}; corpus {k_corpus}/{len(corpus)} "
                  f"({row['seconds']:.0f} s)", flush=True)
            save()
    print_tables(record)


def compare(name: str, temperature: float, sides: dict[str, list[dict]]) -> dict:
    """(a) and (b) for one pair at one temperature."""
    def col(side: str, key: str) -> np.ndarray:
        values = np.array([r[key] for r in sides[side]], dtype=float)
        return values[np.isfinite(values)]

    out = {"pair": name, "temperature": temperature, "n": len(sides["ours"])}
    for key in ("score", "z", "rel_quality", "rel_rating"):
        a, b = col("ours", key), col("ref", key)
        if len(a) < 2 or len(b) < 2:  # no judge: no ratings
            continue
        mw = stats.mannwhitneyu(a, b, alternative="two-sided")
        ks = stats.ks_2samp(a, b)
        out[key] = {"ours_median": float(np.median(a)), "ref_median": float(np.median(b)), "n_ours": len(a),
                    "n_ref": len(b), "mw_u": float(mw.statistic), "mw_p": float(mw.pvalue),
                    "ks_d": float(ks.statistic), "ks_p": float(ks.pvalue)}
    for key in ("rel_quality", "rel_rating"):
        paired = [(o[key], r[key]) for o, r in zip(sides["ours"], sides["ref"], strict=True)
                  if np.isfinite(o.get(key, np.nan)) and np.isfinite(r.get(key, np.nan))]
        if key in out and len(paired) >= 2:
            w = stats.wilcoxon([p[0] for p in paired], [p[1] for p in paired])
            out[key]["wilcoxon_w"], out[key]["wilcoxon_p"], out[key]["n_paired"] = \
                float(w.statistic), float(w.pvalue), len(paired)
    for side in ("ours", "ref"):
        k = sum(r["detected"] for r in sides[side])
        out[f"detected_{side}"] = [k, len(sides[side])]
        out[f"tokens_{side}"] = float(np.mean([r["n_tokens"] for r in sides[side]]))
    return out


def quality_table(record: dict, key: str, measure: str, digits: int) -> None:
    """The (b) table of one relative-quality measure (``rel_quality`` or ``rel_rating``) over every test."""
    print(f"\n| pair | T | n | rel. quality ({measure}): ours median | ref median | MW U | MW p | KS p | "
          "Wilcoxon p (paired) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in record["tests"]:
        q = t[key]
        print(f"| {PAIRS[t['pair']].name} | {t['temperature']:g} | {q['n_ours']}/{q['n_ref']} | "
              f"{q['ours_median']:+.{digits}f} | {q['ref_median']:+.{digits}f} | {q['mw_u']:.0f} | {q['mw_p']:.3g} | "
              f"{q['ks_p']:.3g} | {q.get('wilcoxon_p', float('nan')):.3g} |")


def print_tables(record: dict) -> None:
    print("\n| pair | T | n | score: ours median | ref median | MW U | MW p | KS D | KS p | z: MW p | detected ours / ref |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t in record["tests"]:
        s, z = t["score"], t["z"]
        print(f"| {PAIRS[t['pair']].name} | {t['temperature']:g} | {t['n']} | {s['ours_median']:.4f} | "
              f"{s['ref_median']:.4f} | {s['mw_u']:.0f} | {s['mw_p']:.3g} | {s['ks_d']:.3f} | {s['ks_p']:.3g} | "
              f"{z['mw_p']:.3g} | {t['detected_ours'][0]}/{t['detected_ours'][1]} / "
              f"{t['detected_ref'][0]}/{t['detected_ref'][1]} |")
    quality_table(record, "rel_quality", "log ppl wm - base", 4)
    if any("rel_rating" in t for t in record["tests"]):
        quality_table(record, "rel_rating", f"judge rating wm - base, {record['judge']['model']}", 2)
    print(f"\n| pair | side | FPR at alpha={record['alpha']}: unwatermarked replies | real text (corpus) |")
    print("|---|---|---|---|")
    for row in record["null"]:
        pair = PAIRS[row["pair"]]
        label = pair.ours_label if row["side"] == "ours" else pair.ref_label
        b, c = row["baseline"], row["corpus"]
        print(f"| {pair.name} | {label} | {b[3]}/{b[4]} = {pct(b)} | "
              + (f"{c[3]}/{c[4]} = {pct(c)} |" if c else "- |"))


if __name__ == "__main__":
    typer.run(main)
