"""Stage ``rate``: judge ratings of the baseline (and the judge's discrimination check), or of the watermarked
and attacked texts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import polars as pl

from mmw.errors import SpecError
from mmw.io import GENERATIONS, JUDGE_REPORT, PERTURBED, RATINGS, read_json, read_table, write_json, write_table
from mmw.judge import MODES, Judge, judge_discrimination
from mmw.params import RateParams, derive_seed, load_params
from mmw.stages.common import timed

RATING_SCHEMA = {"prompt_id": pl.String, "task": pl.String, "source": pl.String, "attack": pl.String,
                 "rating": pl.Float64, "rating_greedy": pl.Float64, "rating_expected": pl.Float64}
#: Used when ``rate.mode: auto`` and neither mode tells texts from word salad: the expected-value rating is the
#: finer-grained one (greedy replies of small judges collapse to a few grades). The summary flags the judge.
FALLBACK_MODE = "expected"


def _load_judge(rate: RateParams) -> Judge:
    from mmw.engines.models import load_model

    try:
        tokenizer, model = load_model(rate.judge, rate.device, rate.dtype)
    except SpecError as err:  # the loader names model.name, but this is the judge
        raise SpecError("rate.judge", err.problem, err.allowed) from None
    return Judge(tokenizer, model, batch_size=rate.batch_size, max_new_tokens=rate.max_new_tokens,
                 progress=True)


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
    """
    with timed(f"rate_{which}") as info:
        params = load_params(params_path)
        generations = read_table(GENERATIONS[which])
        judge = _load_judge(params.rate)
        if which == "baseline":
            prompts, texts = generations["prompt"].to_list(), generations["text"].to_list()
            requested = params.rate.mode
            modes = MODES if requested == "auto" else (requested,)  # a fixed mode spares the other one's cost
            discrimination = judge_discrimination(judge, prompts, texts, seed=derive_seed(params.seed, "judge"),
                                                  modes=modes)
            ratings = discrimination.pop("original_ratings")  # the baseline's own ratings, in every mode checked
            mode = requested if requested != "auto" else discrimination["best_mode"] or FALLBACK_MODE
            report = {"requested_mode": requested, "mode": mode,
                      "discriminates": discrimination[mode]["discriminates"],
                      "best_mode": discrimination["best_mode"], "n_texts": discrimination["n_texts"],
                      "modes": {m: discrimination[m] for m in modes}}
            table = rating_rows(generations, "baseline", ratings, mode)
        else:
            mode = read_json(JUDGE_REPORT)["mode"]
            attacked = read_table(PERTURBED).filter(pl.col("ok")).join(
                generations.select("prompt_id", "prompt"), on="prompt_id", how="left")
            table = pl.concat([
                rating_rows(frame, source, judge.rate(frame["prompt"].to_list(), frame["text"].to_list(), [mode]),
                            mode)
                for frame, source in ((generations, "watermarked"), (attacked, "attack"))
            ])
        write_table(table, RATINGS[which])
        if which == "baseline":
            write_json(report, JUDGE_REPORT)
        info.update(rows=table.height, mode=mode, missing=int(table["rating"].null_count()))
