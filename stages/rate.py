"""Stage ``rate``: judge ratings of the baseline (and the judge's discrimination check), or of the watermarked
and attacked texts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import polars as pl

from mmw.engines import ahead
from mmw.errors import SpecError
from mmw.io import (
    GENERATIONS,
    JUDGE_REPORT,
    PERTURBED,
    RATING_SCHEMA,
    RATINGS,
    read_json,
    read_table,
    write_json,
    write_table,
)
from mmw.judge.judge import MODES, judge_discrimination
from mmw.judge.backends import CachedRater, JudgementCache, RatingBackend, default_cache_root
from mmw.params import RateParams, load_params
from mmw.provenance import note_engine, note_model
from mmw.seeds import derive_seed
from mmw.stages.timing import timed

#: Used when ``rate.mode: auto`` and neither mode tells texts from word salad: the expected-value rating is the
#: finer-grained one (greedy replies of small judges collapse to a few grades). The summary flags the judge.
FALLBACK_MODE = "expected"


def load_backend(rate: RateParams, want_expected: bool, compile_judge: bool = True) -> tuple[RatingBackend, str]:
    """The judge backend named by ``rate.backend``, checked before any rating, and a note for the report.

    An OpenAI-compatible server is probed first (reachable, serves ``rate.judge``, returns top_logprobs when
    ``want_expected``): a server that is down or serves another model fails here with a one-line error.
    """
    if rate.backend == "openai":
        from mmw.judge.backends import ServerBackend

        server = ServerBackend(rate.base_url, rate.judge, rate.api_key_env, rate.timeout_s, rate.max_retries,
                               rate.concurrency, rate.max_new_tokens)
        server.probe(want_expected)
        return server, server.note
    if rate.backend == "vllm":
        from mmw.judge.backends import VLLMBackend

        return VLLMBackend(rate.judge, rate.dtype, rate.max_new_tokens), ""
    backend = ahead.take(_judge_key(rate, want_expected, compile_judge),
                         lambda: _in_process_backend(rate, want_expected, compile_judge),
                         problem=lambda built: built.judge.compile_error)  # compiled ahead, or built again here
    note_model(rate.judge, backend.judge.model)  # also where it was built ahead, beside another stage
    return backend, ""


def _judge_key(rate: RateParams, want_expected: bool, compile_judge: bool) -> tuple:
    """What decides the in-process judge :func:`_in_process_backend` builds."""
    return ("judge", rate.judge, rate.device, rate.dtype, rate.batch_size, rate.max_new_tokens, want_expected,
            compile_judge)


def _in_process_backend(rate: RateParams, want_expected: bool, compile_judge: bool) -> RatingBackend:
    """The judge in this process: its model loaded and, for the expected mode on CUDA, its layers compiled."""
    from mmw.engines.models import compile_workers_up, load_model
    from mmw.judge.judge import Judge
    from mmw.judge.backends import TransformersBackend

    try:
        with compile_workers_up(rate.device, enabled=want_expected and compile_judge):  # the judge's layers compile
            tokenizer, model = load_model(rate.judge, rate.device, rate.dtype)
    except SpecError as err:  # the loader names model.name, but this is the judge
        raise SpecError("rate.judge", err.problem, err.allowed) from None
    # The compiled forward serves the expected mode only: a greedy-only judge does not pay its compilation.
    # compile_judge: params engine.compile_judge (None below: compile on CUDA).
    judge = Judge(tokenizer, model, batch_size=rate.batch_size, max_new_tokens=rate.max_new_tokens,
                  compiled=None if want_expected and compile_judge else False)
    return TransformersBackend(judge, rate.judge)


def schedule_ahead(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """In a process that runs several stages (``mmw.sweep.pipeline.schedule_ahead``): have the baseline's in-process
    judge built while a generation stage decodes (``mmw.engines.ahead``), where the judge is not the generator (whose
    layers that decode is using) and its weights are on this machine. The watermarked stage's judge is the one the
    baseline's stage took, where the mode is the same."""
    if which != "baseline":
        return
    from mmw.engines.models import weight_bytes

    params = load_params(params_path, ("model", "rate", "engine"))
    rate = params.rate
    if rate.backend != "transformers" or rate.judge == params.model.name:
        return
    want_expected = rate.mode != "greedy"
    compile_judge = params.engine.compile_judge
    ahead.schedule(_judge_key(rate, want_expected, compile_judge),
                   lambda: _in_process_backend(rate, want_expected, compile_judge), weight_bytes(rate.judge))


def _modes(requested: str, backend: RatingBackend) -> tuple[str, ...]:
    """Rating modes to compute on the baseline: ``auto`` = both, greedy only where expected is unavailable."""
    if backend.expected_via is None:
        return ("greedy",)
    return MODES if requested == "auto" else (requested,)  # a fixed mode spares the other one's cost


def rating_rows(texts: pl.DataFrame, source: str, ratings: dict[str, list[float | None]], mode: str) -> pl.DataFrame:
    """``texts`` (prompt_id, task[, attack]) and ``{mode: ratings}`` -> rows of the ratings table.

    ``rating`` is the ``mode`` column; a failed judgement stays null (never 0). A mode missing from ``ratings``
    (not computed) leaves its column null.
    """
    attack = texts["attack"] if "attack" in texts.columns else [""] * texts.height
    missing = [None] * texts.height
    return pl.DataFrame({
        "prompt_id": texts["prompt_id"], "task": texts["task"], "source": [source] * texts.height,
        "attack": attack, "rating": ratings[mode], "rating_greedy": ratings.get("greedy", missing),
        "rating_expected": ratings.get("expected", missing),
    }, schema=RATING_SCHEMA)


def run(which: Literal["baseline", "watermarked"], params_path: Path) -> None:
    """Write ``data/ratings/<which>.parquet`` (and, for the baseline, ``reports/judge.json``).

    The baseline run measures, per rating mode, whether the judge can tell each baseline text from the same
    words shuffled (rating the baseline on the way; both modes with ``auto``), and fixes the mode used everywhere
    (``rate.mode``, or with ``auto`` the mode that discriminates better). The watermarked run reads that choice
    and rates the watermarked and attacked texts in that mode only (the other mode's column stays null), which
    halves its cost.

    Judgements come from ``rate.backend`` (in process, vLLM, or an OpenAI-compatible server probed first) through
    the judgement cache (``mmw.judge.backends``): an interrupted run keeps every finished judgement and the next
    run makes only the missing ones; a judgement that failed is a null rating, counted in ``judge.json``
    (``missing``) and the timings. See docs/JUDGE.md.
    """
    with timed(f"rate_{which}") as info:
        params = load_params(params_path, ("seed", "rate", "engine") if which == "baseline" else ("rate", "engine"))
        rate = params.rate
        note_engine(params.engine)
        generations = read_table(GENERATIONS[which], columns=("prompt_id", "task", "prompt", "text"))
        chosen = read_json(JUDGE_REPORT) if which == "watermarked" else None
        # every input checked before the judge loads
        perturbed = read_table(PERTURBED) if which == "watermarked" else None
        want_expected = rate.mode != "greedy" if chosen is None else chosen["mode"] == "expected"
        loading = time.perf_counter()
        backend, note = load_backend(rate, want_expected, params.engine.compile_judge)
        info["load_s"] = round(time.perf_counter() - loading, 3)  # ~0 where a warm process shares its load
        ahead_s = ahead.built_ahead(_judge_key(rate, want_expected, params.engine.compile_judge))
        if which == "baseline" and ahead_s is not None:  # built beside a decode (mmw.engines.ahead)
            info["built_ahead_s"] = round(ahead_s, 3)
        if chosen is not None and chosen["mode"] == "expected" and backend.expected_via is None:
            raise SpecError("rate.base_url", "the baseline was rated in expected mode, but this judge server returns "
                                             f"no top_logprobs ({note}); rerun rate_baseline", ["greedy"])
        # Every judgement is cached the moment it is made: a killed run resumes where it stopped.
        rater = CachedRater(backend, JudgementCache(default_cache_root()), progress=True)
        if which == "baseline":
            prompts, texts = generations["prompt"].to_list(), generations["text"].to_list()
            requested = rate.mode
            modes = _modes(requested, backend)
            discrimination = judge_discrimination(rater, prompts, texts, seed=derive_seed(params.seed, "judge"),
                                                  modes=modes)
            ratings = discrimination.pop("original_ratings")  # the baseline's own ratings, in every mode checked
            if requested in modes:
                mode = requested
            else:  # auto, or expected on a server without logprobs
                mode = discrimination["best_mode"] or (FALLBACK_MODE if FALLBACK_MODE in modes else modes[0])
            report = {"requested_mode": requested, "mode": mode,
                      "discriminates": discrimination[mode]["discriminates"],
                      "best_mode": discrimination["best_mode"], "n_texts": discrimination["n_texts"],
                      "modes": {m: discrimination[m] for m in modes},
                      "backend": rate.backend, "judge": rate.judge,
                      # how the expected value was computed: tree-attention (exact, in process), top-logprobs
                      # (from the server's/vLLM's top tokens), or null (not available: greedy only)
                      "expected_via": backend.expected_via, "note": note,
                      "missing": rater.stats.failed, "errors": rater.stats.errors}
            table = rating_rows(generations, "baseline", ratings, mode)
        else:
            mode = chosen["mode"]
            attacked = perturbed.filter(pl.col("ok")).join(
                generations.select("prompt_id", "prompt"), on="prompt_id", how="left")
            table = pl.concat([
                rating_rows(frame, source, rater.rate(frame["prompt"].to_list(), frame["text"].to_list(), [mode]),
                            mode)
                for frame, source in ((generations, "watermarked"), (attacked, "attack"))
            ])
        write_table(table, RATINGS[which])
        if which == "baseline":
            write_json(report, JUDGE_REPORT)
        info.update(rows=table.height, mode=mode, missing=int(table["rating"].null_count()), backend=rate.backend,
                    judgements_cached=rater.stats.cached, judgements_made=rater.stats.computed,
                    judgements_failed=rater.stats.failed, judging_s=round(rater.stats.backend_s, 3),
                    first_judgement_s=None if rater.stats.first_judgement_s is None
                    else round(rater.stats.first_judgement_s, 3))
