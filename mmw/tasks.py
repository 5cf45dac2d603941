"""The paper's three core tasks -> prompts (appendix "Task prompts"), and their rendering with a chat template.

Task content lives in ``data/tasks/`` (CSV, in git):
  book_report  100 = books.csv                                 "Write a book report about X, written by Y."
  story         96 = tones.csv (6, incl. none) x topics.csv (16) "Write a X story about Y." / "Write a story about Y."
  fake_news    100 = ordered pairs of leaders.csv (8) x locations.csv (4) = 224, capped at 100
                                                               "Write a news article about X's visit to Y in Z."
A prompt's id is its index in the full task (``story-017``), so subsets keep the ids of the full benchmark.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from mmw.errors import SpecError

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "tasks"
NEWS_CAP = 100
NO_TONE = "none"
# Fixed seed of the subset permutation: part of the benchmark's definition, not a run parameter, so a subset
# never changes between runs and smaller subsets are prefixes of larger ones.
SUBSET_SEED = 20240611


def _column(data_dir: Path, file: str, column: str) -> list[str]:
    return pl.read_csv(data_dir / file)[column].to_list()


def book_report_prompts(data_dir: Path) -> list[str]:
    books = pl.read_csv(data_dir / "books.csv")
    return [f"Write a book report about {title}, written by {author}." for title, author in books.iter_rows()]


def story_prompts(data_dir: Path) -> list[str]:
    tones = _column(data_dir, "tones.csv", "tone")
    topics = _column(data_dir, "topics.csv", "topic")
    return [
        f"Write a story about {topic}." if tone == NO_TONE else f"Write a {tone} story about {topic}."
        for tone, topic in itertools.product(tones, topics)
    ]


def fake_news_prompts(data_dir: Path) -> list[str]:
    leaders = _column(data_dir, "leaders.csv", "leader")
    locations = _column(data_dir, "locations.csv", "location")
    combos = [
        (visitor, host, place)
        for visitor, host in itertools.permutations(leaders, 2)
        for place in locations
    ]
    # Evenly spaced picks over (pair, place) so the cap keeps every leader as visitor and host and every place.
    picks = [combos[i * len(combos) // NEWS_CAP] for i in range(min(NEWS_CAP, len(combos)))]
    return [f"Write a news article about {x}'s visit to {y} in {z}." for x, y, z in picks]


TASKS: dict[str, Callable[[Path], list[str]]] = {
    "book_report": book_report_prompts,
    "story": story_prompts,
    "fake_news": fake_news_prompts,
}


def subset_indices(n: int, per_task: int | None) -> list[int]:
    """Indices of the prompts kept from a task of ``n``: all, or the first ``per_task`` of a fixed permutation.

    A fixed random permutation spreads any subset over the task's factors (tone and topic, pairs and places),
    which evenly spaced indices do not (every 16th story shares its topic). Returned sorted.
    """
    if per_task is None or per_task >= n:
        return list(range(n))
    return sorted(np.random.default_rng(SUBSET_SEED).permutation(n)[:per_task].tolist())


def build_prompts(tasks: Sequence[str], per_task: int | None = None, data_dir: Path = DATA_DIR) -> pl.DataFrame:
    """Prompts of the requested tasks (in the given task order, then by id).

    Returns columns ``prompt_id`` (``<task>-NNN``, index in the full task), ``task``, ``prompt``;
    at most ``per_task`` rows per task (``None``: all 296 for the three tasks).
    """
    if isinstance(tasks, str) or len(tasks) == 0:
        raise SpecError("prompts.tasks", f"expected a non-empty list of tasks, got {tasks!r}", TASKS)
    for task in tasks:
        if task not in TASKS:
            raise SpecError("prompts.tasks", f"unknown task {task!r}", TASKS)
    if len(set(tasks)) != len(tasks):
        raise SpecError("prompts.tasks", f"duplicate task in {list(tasks)!r}", TASKS)
    if per_task is not None and (isinstance(per_task, bool) or not isinstance(per_task, int) or per_task < 1):
        raise SpecError("prompts.per_task", f"must be an integer >= 1 or null (all), got {per_task!r}")
    rows: list[dict[str, str]] = []
    for task in tasks:
        prompts = TASKS[task](data_dir)
        rows.extend(
            {"prompt_id": f"{task}-{i:03d}", "task": task, "prompt": prompts[i]}
            for i in subset_indices(len(prompts), per_task)
        )
    return pl.DataFrame(rows, schema={"prompt_id": pl.String, "task": pl.String, "prompt": pl.String})


def render_chat(tokenizer, prompts: Sequence[str]) -> list[str]:
    """Each prompt as a single user turn in the tokenizer's chat template, ending with the assistant header.

    ``tokenizer``: any HF tokenizer with a chat template. Returns one string per prompt (special tokens included,
    so encode it with ``add_special_tokens=False``).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise SpecError("model.name", "the tokenizer has no chat template; use an instruction-tuned (chat) model")
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
