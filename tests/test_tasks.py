"""Task prompts: counts and formats of the paper's three tasks, their pools (``prompts.pool``), stable ids, subset
selection, errors, chat rendering."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re

import polars as pl
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mmw.errors import SpecError
from mmw.tasks import DATA_DIR, build_prompts, check_range, range_pool, render_chat

ALL_TASKS = ["book_report", "story", "fake_news"]
#: Each core task's pool: the paper's prompts (ids 0 .. paper - 1), then the ones written for mmw.
PAPER = {"book_report": 100, "story": 96, "fake_news": 100}
POOL = {"book_report": 350, "story": 354, "fake_news": 350}


def read_column(file: str, column: str) -> list[str]:
    with (DATA_DIR / file).open(newline="", encoding="utf-8") as fh:
        return [row[column] for row in csv.DictReader(fh)]


@pytest.fixture(scope="module")
def full():
    return build_prompts(ALL_TASKS, None, pool="extended")


def test_counts_are_the_papers_lists_extended_to_350(full):
    counts = dict(full.group_by("task").len().iter_rows())
    assert counts == POOL and all(size >= 350 for size in counts.values())
    assert full.height == sum(POOL.values()) == 1054
    assert full["prompt_id"].n_unique() == full.height
    assert full["prompt"].n_unique() == full.height  # distinct prompts, within and across tasks


def test_the_default_pool_is_the_papers_296_prompts(full):
    """``prompts.pool: paper`` (the default) at ``per_task: null`` is the paper's full scale: its 296 prompts, ids
    0 .. 99 / 95, the first ones of the extended pool."""
    paper = build_prompts(ALL_TASKS, None)
    assert paper.equals(build_prompts(ALL_TASKS, None, pool="paper"))
    assert dict(paper.group_by("task").len().iter_rows()) == PAPER and paper.height == 296
    for task, size in PAPER.items():
        assert paper.filter(task=task)["prompt_id"].to_list() == [f"{task}-{i:03d}" for i in range(size)]
        assert paper.filter(task=task)["prompt"].to_list() == full.filter(task=task)["prompt"].to_list()[:size]
    # The other tasks are one pool: the same prompts in both.
    assert build_prompts(["book_report_fr", "rfc_summary"], None, pool="extended").equals(
        build_prompts(["book_report_fr", "rfc_summary"], None))


@pytest.mark.parametrize(("per_task", "offset", "pool", "key", "message", "remedy"), [
    (20, 90, "paper", "prompts.pool",
     "task book_report holds 100 prompts in the paper pool; prompts [90, 110) run past them",
     "prompts.pool: extended (350 prompts of book_report), or prompts.offset + prompts.per_task <= 100"),
    (None, 96, "paper", "prompts.pool", "task story holds 96 prompts in the paper pool; prompts from 96 on run past them",
     "prompts.pool: extended (354 prompts of story), or prompts.offset < 96"),
    (500, 0, "paper", "prompts.per_task",
     "task book_report holds 100 prompts in the paper pool; prompts [0, 500) run past them",
     "prompts.offset + prompts.per_task <= 100"),
    (20, 340, "extended", "prompts.per_task",
     "task book_report holds 350 prompts in the extended pool; prompts [340, 360) run past them",
     "prompts.offset + prompts.per_task <= 350"),
])
def test_a_range_past_the_pool_fails_naming_the_task_its_count_and_the_remedy(per_task, offset, pool, key, message,
                                                                             remedy):
    with pytest.raises(SpecError) as caught:
        build_prompts(ALL_TASKS, per_task, offset=offset, pool=pool)
    assert (caught.value.key, caught.value.problem, caught.value.allowed) == (key, message, remedy)
    assert "\n" not in str(caught.value)
    with pytest.raises(SpecError):
        check_range(ALL_TASKS, per_task, offset, pool)  # what mmw.board runs before any stage


def test_a_range_inside_the_pool_and_other_tasks_pass(full):
    check_range(ALL_TASKS, 4, 92)  # story's last 4 of the paper's
    check_range(ALL_TASKS, 254, 96, "extended")
    check_range(["news_highlights", "rfc_summary"], 64, 0)  # not core tasks: they keep what they have
    assert build_prompts(["news_highlights"], 8).height == 7
    with pytest.raises(SpecError, match=r"^prompts\.pool: unknown value 'big'; allowed: paper, extended$"):
        build_prompts(ALL_TASKS, 1, pool="big")
    # A sweep's held-out prompts past the tuning runs' pool take the extended one (mmw.sweep.units.held_out).
    assert range_pool(ALL_TASKS, 64, 32) == "paper" and range_pool(ALL_TASKS, 5, 92) == "extended"
    assert range_pool(["book_report"], 5, 92) == "paper" and range_pool([], 5, 92) == "extended"
    assert range_pool(ALL_TASKS, 5, 92, "extended") == "extended"


def test_book_report_prompts_name_each_book_and_its_author(full):
    books = full.filter(task="book_report")["prompt"].to_list()
    rows = [list(csv.DictReader((DATA_DIR / f).open(newline="", encoding="utf-8")))
            for f in ("books.csv", "books_extra.csv")]
    assert [len(r) for r in rows] == [100, 250]
    assert books == [f"Write a book report about {r['title']}, written by {r['author']}." for r in rows[0] + rows[1]]
    assert len({b.split(", written by ")[0].lower() for b in books}) == 350  # 350 distinct titles


def test_story_prompts_cover_every_tone_topic_pair_once(full):
    stories = full.filter(task="story")["prompt"].to_list()
    tones, topics = read_column("tones.csv", "tone"), read_column("topics.csv", "topic")
    extra = read_column("topics_extra.csv", "topic")
    assert len(tones) == 6 and "none" in tones and len(topics) == 16 and len(extra) == 43
    pairs = []
    for prompt in stories:
        match = re.fullmatch(r"Write a (?:(\w+) )?story about (.+)\.", prompt)
        assert match, prompt
        pairs.append((match.group(1) or "none", match.group(2)))
    # The paper's 96 first, in its order; then every tone with each added topic.
    assert pairs == list(itertools.product(tones, topics)) + list(itertools.product(tones, extra))
    assert "Write a none story" not in " ".join(stories)


def test_fake_news_prompts_are_ordered_pairs_of_distinct_leaders_in_a_location(full):
    news = full.filter(task="fake_news")["prompt"].to_list()
    leaders, places = set(read_column("leaders.csv", "leader")), set(read_column("locations.csv", "location"))
    added = set(read_column("locations_extra.csv", "location"))
    assert len(leaders) == 8 and len(places) == 4 and len(added) == 3 and not places & added
    seen = []
    for prompt in news:
        match = re.fullmatch(r"Write a news article about (.+)'s visit to (.+) in (.+)\.", prompt)
        assert match, prompt
        visitor, host, place = match.groups()
        assert visitor in leaders and host in leaders and visitor != host and place in places | added
        seen.append((visitor, host, place))
    assert len(set(seen)) == 350  # of 56 pairs x 7 places = 392
    paper, extra = seen[:100], seen[100:]
    # The paper's cap of 100 (of 224) uses its places only, everyone on both sides, every place, and both
    # directions of some pair; the 250 added keep everyone on both sides and reach every place.
    assert {p for _, _, p in paper} == places
    for part, where in ((paper, places), (extra, places | added)):
        assert {v for v, _, _ in part} == leaders and {h for _, h, _ in part} == leaders
        assert {p for _, _, p in part} == where
    pairs = {(v, h) for v, h, _ in paper}
    assert any((h, v) in pairs for v, h in pairs)


def test_prompt_ids_are_stable_indices_within_the_task(full):
    for task in ALL_TASKS:
        ids = full.filter(task=task)["prompt_id"].to_list()
        assert ids == [f"{task}-{i:03d}" for i in range(len(ids))]


def test_task_order_follows_the_request(full):
    reordered = build_prompts(["fake_news", "book_report"], None)
    assert reordered["task"].unique(maintain_order=True).to_list() == ["fake_news", "book_report"]
    assert set(reordered["prompt_id"]) <= set(full["prompt_id"])


def test_subset_is_deterministic_nested_spread_and_keeps_full_ids(full):
    small, large = build_prompts(ALL_TASKS, 5), build_prompts(ALL_TASKS, 20)
    assert small.equals(build_prompts(ALL_TASKS, 5))
    assert dict(small.group_by("task").len().iter_rows()) == dict.fromkeys(ALL_TASKS, 5)
    assert set(small["prompt_id"]) <= set(large["prompt_id"])  # a smaller run is a subset of a larger one
    by_id = dict(zip(full["prompt_id"], full["prompt"], strict=True))
    assert all(by_id[pid] == prompt for pid, prompt in zip(large["prompt_id"], large["prompt"], strict=True))
    for task in ALL_TASKS:
        indices = [int(pid.split("-")[1]) for pid in large.filter(task=task)["prompt_id"]]
        assert indices == sorted(indices)
        assert max(indices) - min(indices) > 48  # spread over the task, not its first block
    story_tones = {re.match(r"Write an? (\w+)", p).group(1) for p in large.filter(task="story")["prompt"]}
    assert len(story_tones) >= 4  # 20 stories reach most of the 6 tones (the "story" word marks tone none)


def test_per_task_up_to_the_task_size_keeps_everything():
    assert build_prompts(["story"], 96).height == 96
    assert build_prompts(["story"], 354, pool="extended").height == 354


# Ranges (per_task, offset) and the sha256 (first 12 hex digits) of their [(prompt_id, prompt), ...] as JSON,
# computed before the task pools were extended (mmw/tasks.py as of 78ff905): every range inside the paper's pool
# (per_task + offset <= 100, 96 for story) must keep its prompt ids and texts, so that committed tuning and
# confirmation ranges (and the default run's data/prompts.parquet) keep their prompts.
PINNED_RANGES = [(1, 0), (2, 0), (4, 0), (5, 0), (8, 0), (9, 0), (20, 0), (32, 0), (64, 0), (16, 1), (4, 4), (5, 4),
                 (8, 8), (64, 32), (32, 64), (53, 17), (79, 17), (95, 1), (50, 46), (1, 95), (96, 0), (99, 1),
                 (100, 0), (4, 96)]
PINNED = {
    ("book_report", 100): "56ada31890e7 fb1476262413 8f50f3c425db b5a044e205f5 372a64b75c2a 7535f85bc6c9 "
    "2b01b9cc1d21 fcf15f68b897 51cd1d572308 d8b4d0229127 27538bc8e7e1 2996c73cdc65 150411649f67 6a2b1c42ddc3 "
    "3da98d733cc1 72a24e41d61d 2f083c0f757c 0d08868463b8 4ed94ef74ea0 5d59280db286 11926cb95303 3be88ec88589 "
    "3e9435099981 93197343c244",
    ("story", 96): "7b9632968d0a a28e2631397a aacd8c082f2b cf1a82b2eab9 3577925d1753 66ed87c80661 8ba99d108094 "
    "24ee254d73f7 013c666971ac 71b38252ee18 303559bb2ecb 7e4d1d10b210 aeb7a2e321b4 a541f942c9d9 99ab263ddfd0 "
    "c8cf0dd461b6 60fdc7a35f15 d0b9c664d1e4 24d73d19c0d8 8301e634d86c 95121486871e",
    ("fake_news", 100): "5e31f5add7a6 189d4ab1504a b8bab7123b55 69024e7549dc 1d10c58f8f9a eac7ed4abe74 "
    "cf073bd6e9ab c13e51ebb70c eeb0ea9cfdb8 cd5180f78d67 6955d6ba556a 2e86af564da2 19ab86f1b504 a02359dad865 "
    "0063d9355eac be07f55aec43 41dac69e1d80 c8dca487af6e 85f67a3c6aa1 cfa5d0599a4c 9946e302fc7c 78ced080756b "
    "619d576ca398 047261c1c8fa",
    ("book_report_fr", 100): "812120df9a5b 12694b914332 df4e299a6cfd 2beb73cbbfcb 0a5dda3a0943 d7dca2fdd696 "
    "622d0237e5ad b252109734cd 8268c3ae0b3a 214741a51241 1d03b1aa58eb 549c9025da44 cf7a18c633ac 7aefda817dfe "
    "2f81aec62cec d78582d353b4 dfaa96187483 8bd1cfff18f1 c85faa2ee3f9 390ab70480e7 daadaec93669 cbd9e42f0cdc "
    "2179e77ccc22 95cc5d8912e9",
}


def range_digest(frame: pl.DataFrame) -> str:
    rows = list(zip(frame["prompt_id"].to_list(), frame["prompt"].to_list(), strict=True))
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:12]


@pytest.mark.parametrize("pool", ["paper", "extended"])
@pytest.mark.parametrize(("task", "paper"), list(PINNED))
def test_ranges_inside_the_papers_pool_keep_their_prompts(task, paper, pool):
    ranges = [(per_task, offset) for per_task, offset in PINNED_RANGES if per_task + offset <= paper]
    got = [range_digest(build_prompts([task], per_task, offset=offset, pool=pool)) for per_task, offset in ranges]
    assert dict(zip(ranges, got, strict=True)) == dict(zip(ranges, PINNED[task, paper].split(), strict=True))


def test_the_extension_follows_the_papers_prompts_and_ranges_stay_disjoint(full):
    from mmw.tasks import subset_indices, subset_order

    for task, paper in PAPER.items():
        size = POOL[task]
        # The order: the paper's permutation unchanged, then the added prompts.
        order = subset_order(size, paper)
        assert order[:paper] == subset_order(paper) and sorted(order[paper:]) == list(range(paper, size))
        assert subset_indices(size, paper, 0, paper) == list(range(paper))
        # Tuning, first confirmation and later rounds (as the sweeps lay them out) are disjoint; past the paper's
        # pool they take only added prompts, and together they cover the task.
        tuning, first = build_prompts([task], 32), build_prompts([task], 64, offset=32)
        later = build_prompts([task], size - 96, offset=96, pool="extended")
        assert later.height == size - 96 >= 250
        sets = [set(frame["prompt_id"]) for frame in (tuning, first, later)]
        assert all(a.isdisjoint(b) for a, b in itertools.combinations(sets, 2))
        assert set.union(*sets) == set(full.filter(task=task)["prompt_id"])
        beyond = build_prompts([task], 200, offset=paper, pool="extended")["prompt_id"].str.slice(-3).cast(int)
        assert beyond.min() >= paper and beyond.len() == 200


@pytest.mark.parametrize(
    ("tasks", "per_task", "message"),
    [
        (["x"], None, "prompts.tasks: unknown task 'x'; allowed: book_report, story, fake_news"),
        (["story", "story"], None, "prompts.tasks: duplicate task"),
        ([], None, "prompts.tasks: expected a non-empty list"),
        ("story", None, "prompts.tasks: expected a non-empty list"),
        (["story"], 0, "prompts.per_task: must be an integer >= 1"),
        (["story"], 2.5, "prompts.per_task: must be an integer >= 1"),
    ],
)
def test_bad_input_names_the_parameter(tasks, per_task, message):
    with pytest.raises(SpecError) as info:
        build_prompts(tasks, per_task)
    assert str(info.value).startswith(message)


def word_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    """A tiny real tokenizer (word level) for rendering tests without a model download."""
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "<|im_end|>": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>")
    tokenizer.chat_template = chat_template
    return tokenizer


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_render_chat_wraps_each_prompt_as_a_user_turn_ending_with_the_assistant_header():
    prompts = ["Write a story about a cat.", "Write a book report about Emma, written by Jane Austen."]
    chats = render_chat(word_tokenizer(CHATML), prompts)
    assert chats == [f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n" for p in prompts]


def test_render_chat_without_template_is_a_clear_error():
    with pytest.raises(SpecError, match="model.name: the tokenizer has no chat template"):
        render_chat(word_tokenizer(None), ["Write a story about a cat."])


@pytest.mark.heavy
def test_render_chat_with_the_embedded_model_tokenizer():
    from mmw.engines.models import load_model

    tokenizer, _ = load_model()
    prompt = build_prompts(["story"], 1)["prompt"][0]
    (chat,) = render_chat(tokenizer, [prompt])
    assert f"<|im_start|>user\n{prompt}<|im_end|>" in chat
    assert chat.endswith("<|im_start|>assistant\n")


# --- validation tasks (docs/VALIDATION.md) -----------------------------------------------------------------------

VALIDATION_FROM_DATA = ["rfc_summary", "legal_research", "book_report_fr", "humaneval", "news_highlights",
                        "multiple_choice"]


def test_validation_task_sizes_are_the_papers_or_the_shipped_samples():
    full = build_prompts(VALIDATION_FROM_DATA, None)
    counts = dict(full.group_by("task").len().iter_rows())
    assert counts == {"rfc_summary": 50, "legal_research": 50, "book_report_fr": 100, "humaneval": 164,
                      "news_highlights": 7, "multiple_choice": 16}
    assert full["prompt"].n_unique() == full.height


def test_every_task_names_its_quality_measure():
    from mmw.tasks import ALL_TASKS, MEASURES

    assert set(MEASURES) == set(ALL_TASKS)
    assert MEASURES["humaneval"] == "pass@1"
    assert MEASURES["multiple_choice"] == MEASURES["mmlu"] == "accuracy"
    assert {MEASURES[t] for t in ("rfc_summary", "legal_research", "book_report_fr", "paraphrase", "translate_fr",
                                  "news_highlights", "cnn_dailymail", "book_report")} == {"judge"}


def test_v1_prompts_follow_the_papers_wording():
    rfcs = build_prompts(["rfc_summary"], None)["prompt"].to_list()
    rows = list(csv.DictReader((DATA_DIR / "rfcs.csv").open(encoding="utf-8")))
    assert len({r["number"] for r in rows}) == 50 and all(re.fullmatch(r"RFC \d+", r["number"]) for r in rows)
    assert rfcs[0].startswith(f"Write a detailed explanation and description of {rows[0]['number']}: "
                              f"{rows[0]['title']}.")
    legal = build_prompts(["legal_research"], None)["prompt"].to_list()
    topics = read_column("legal_topics.csv", "topic")
    assert len(set(topics)) == 50
    for prompt, topic in zip(legal, topics, strict=True):
        assert prompt.startswith(f"Conduct legal research on {topic}.")
        assert prompt.endswith(f"make your forecast about how {topic} will be regulated in the future.")


def test_v2_is_the_core_book_list_in_french():
    french = build_prompts(["book_report_fr"], None)["prompt"].to_list()
    english = build_prompts(["book_report"], None)["prompt"].to_list()[:100]  # the paper's books only
    for fr, en in zip(french, english, strict=True):
        title, author = re.fullmatch(r"Write a book report about (.+), written by (.+)\.", en).groups()
        assert fr == f"Écris un résumé détaillé de {title}, écrit par {author}."
    ids = build_prompts(["book_report_fr"], 5)["prompt_id"].str.slice(-3).to_list()
    assert ids == build_prompts(["book_report"], 5)["prompt_id"].str.slice(-3).to_list()  # same books


def test_v3_prompts_rewrite_the_pipelines_own_book_reports(tmp_path):
    from mmw.tasks import read_low_entropy_inputs

    inputs = tmp_path / "inputs.parquet"
    pl.DataFrame({"source_id": ["book_report-004", "book_report-017"],
                  "text": ["A first report.", "A second report."]}).write_parquet(inputs)
    prompts = build_prompts(["paraphrase", "translate_fr", "story"], None, low_entropy_inputs=inputs)
    v3 = prompts.filter(pl.col("task") != "story")
    assert v3["prompt_id"].to_list() == ["paraphrase-004", "paraphrase-017", "translate_fr-004", "translate_fr-017"]
    assert all("A first report." in p for p in v3.filter(pl.col("prompt_id").str.ends_with("004"))["prompt"])
    assert "French" in v3["prompt"][2] and "Paraphrase" in v3["prompt"][0]
    assert build_prompts(["paraphrase"], 1, low_entropy_inputs=inputs).height == 1
    with pytest.raises(SpecError, match="missing.parquet: missing input file"):  # in a pipeline: + the stage
        read_low_entropy_inputs(tmp_path / "missing.parquet")
    with pytest.raises(SpecError, match="missing.parquet"):
        build_prompts(["translate_fr"], None, low_entropy_inputs=tmp_path / "missing.parquet")


def test_v4_humaneval_comes_from_the_package_and_references_match_prompt_ids():
    from mmw.tasks import humaneval_problems, task_references

    problems = humaneval_problems()
    assert len(problems) == 164 and problems[7].task_id == "HumanEval/7"
    prompts = build_prompts(["humaneval"], 4)
    refs = task_references(prompts["prompt_id"].to_list())
    for prompt_id, prompt in zip(prompts["prompt_id"], prompts["prompt"], strict=True):
        problem = refs[prompt_id].problem
        assert problem.task_id == f"HumanEval/{int(prompt_id[-3:])}"
        assert problem.prompt in prompt and "def check(" in problem.test


def test_v5_and_v6_samples_are_one_shot_with_the_papers_prompt():
    news = build_prompts(["news_highlights"], None)["prompt"].to_list()
    assert all(p.startswith("Extract a 3 sentence highlight from the following article.") for p in news)
    assert all(p.count("* Article:") == 2 and p.endswith("* Highlights:") for p in news)
    questions = build_prompts(["multiple_choice"], None)
    assert all(p.endswith("Answer:") and "Answer: [B]" in p for p in questions["prompt"])  # the example's answer
    from mmw.tasks import task_references

    refs = task_references(questions["prompt_id"].to_list())
    rows = [r for r in csv.DictReader((DATA_DIR / "multiple_choice.csv").open(encoding="utf-8"))
            if r["role"] == "task"]
    assert [refs[pid].answer for pid in questions["prompt_id"]] == [r["answer"] for r in rows]


@pytest.mark.parametrize(("task", "file"), [("mmlu", "external/mmlu"), ("cnn_dailymail", "cnn_dailymail_test.csv")])
def test_a_task_whose_data_is_missing_names_the_file_and_how_to_get_it(task, file, tmp_path):
    with pytest.raises(SpecError) as info:
        build_prompts([task], 2, data_dir=tmp_path)
    message = str(info.value)
    assert message.startswith("prompts.tasks:") and file in message and "Get " in message


def test_user_supplied_mmlu_and_cnn_dailymail_files_are_read(tmp_path):
    from mmw.tasks import task_references

    mmlu = tmp_path / "external" / "mmlu"
    mmlu.mkdir(parents=True)
    (mmlu / "astronomy_test.csv").write_text('"Closest star?",Sun,Sirius,Vega,Rigel,A\n'
                                             '"Red planet?",Venus,Mars,Earth,Moon,B\n"Ringed?",Mars,Saturn,Io,Sun,B\n')
    prompts = build_prompts(["mmlu"], None, data_dir=tmp_path)
    assert prompts.height == 2 and "Question: Closest star?" in prompts["prompt"][0]  # the example
    assert "Question: Red planet?" in prompts["prompt"][0]
    assert [r.answer for r in task_references(prompts["prompt_id"].to_list(), tmp_path).values()] == ["B", "B"]
    pl.DataFrame({"id": ["a", "b"], "article": ["Example article.", "Task article."],
                  "highlights": ["Example highlights.", "unused"]}).write_csv(tmp_path / "external" /
                                                                              "cnn_dailymail_test.csv")
    (news,) = build_prompts(["cnn_dailymail"], None, data_dir=tmp_path)["prompt"].to_list()
    assert "* Article: Task article." in news and "* Highlights: Example highlights." in news


def test_offset_gives_disjoint_prompt_ranges() -> None:
    tasks = ["book_report", "story", "fake_news"]
    first, second = build_prompts(tasks, 4), build_prompts(tasks, 5, offset=4)
    assert set(first["prompt_id"]).isdisjoint(second["prompt_id"])
    assert set(build_prompts(tasks, 9)["prompt_id"]) == set(first["prompt_id"]) | set(second["prompt_id"])
    assert second.group_by("task").len()["len"].to_list() == [5, 5, 5]
    with pytest.raises(SpecError, match=r"^prompts\.offset: must be an integer >= 0"):
        build_prompts(tasks, 4, offset=-1)
