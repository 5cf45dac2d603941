"""Stage ``prompts``: the task prompts of params ``prompts:``, rendered with the generator's chat template."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from mmw.io import PROMPTS, write_table
from mmw.params import check_task_names, load_params
from mmw.stages.common import load_generator_vocabulary
from mmw.stages.timing import timed
from mmw.tasks import ALL_TASKS, build_prompts, render_chat


def run(params_path: Path) -> None:
    """Write ``data/prompts.parquet`` (prompt_id, task, prompt, chat)."""
    with timed("prompts") as info:
        params = load_params(params_path, ("prompts", "model"))
        check_task_names(params.prompts.tasks, ALL_TASKS)  # before the tokenizer loads
        prompts = build_prompts(params.prompts.tasks, params.prompts.per_task, offset=params.prompts.offset,
                                pool=params.prompts.pool)
        tokenizer, _ = load_generator_vocabulary(params.model)
        table = prompts.with_columns(pl.Series("chat", render_chat(tokenizer, prompts["prompt"].to_list()),
                                               dtype=pl.String))
        write_table(table, PROMPTS)
        info["rows"] = table.height
