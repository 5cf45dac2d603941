"""Secondary quality measures: repetition (hand-counted), pass@1 of HumanEval programs in the sandbox, multiple-
choice parsing, perplexity/feature batching against an unbatched forward pass, MAUVE on known distributions,
the report's aggregation, and the ``quality:`` params' errors."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from mmw.errors import SpecError
from mmw.quality.repetition import repeated_share, repetition, words
from mmw.quality.task_measures import (
    extract_code,
    humaneval_program,
    humaneval_tests,
    parse_choice,
    run_humaneval,
    score_choice,
)
from mmw.sandbox import SandboxLimits
from mmw.tasks import humaneval_file, humaneval_problems

LIMITS = SandboxLimits(timeout_s=5.0, memory_mb=512)


# --- repetition ------------------------------------------------------------------------------------------------

def test_repetition_counts_repeated_ngrams_by_hand():
    # "the cat saw the cat ." -> words: the cat saw the cat .  (6 words)
    shares = repetition("The cat saw the cat.")
    assert words("The cat saw the cat.") == ["the", "cat", "saw", "the", "cat", "."]
    assert shares[1] == pytest.approx(1 - 4 / 6)   # distinct: the cat saw .
    assert shares[2] == pytest.approx(1 - 4 / 5)   # (the cat) twice among 5 bigrams
    assert shares[3] == pytest.approx(0.0)         # 4 trigrams, all distinct
    assert shares[4] == pytest.approx(0.0)


def test_repetition_is_zero_for_distinct_words_and_tends_to_one_for_a_loop():
    assert repetition("one two three four five")[1] == 0.0
    loop = repetition("I am here. " * 50)
    assert all(loop[n] > 0.95 for n in (1, 2, 3, 4))
    assert repeated_share(["a", "b"], 3) is None  # too short for a trigram


# --- HumanEval in the sandbox ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def problems_with_solutions():
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as fh:
        solutions = [json.loads(line)["canonical_solution"] for line in fh]
    return list(zip(humaneval_problems(), solutions, strict=True))


def test_extract_code_prefers_the_fenced_block_that_defines_the_function():
    response = "Here:\n```python\nimport math\n```\nand\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(response, "add") == "def add(a, b):\n    return a + b\n"
    assert extract_code("```\nx = 1\n```", "add") == "x = 1\n"
    assert extract_code("    return a + b\n", "add") == "    return a + b\n"  # bare body
    assert "def add" in extract_code("```python\ndef add(a, b):\n    return a + b", "add")  # cut-off fence


@pytest.mark.parametrize("index", [0, 2, 10, 53, 163])
def test_canonical_solutions_pass_as_a_chat_reply_and_as_a_bare_body(problems_with_solutions, index):
    problem, solution = problems_with_solutions[index]
    as_reply = f"Sure! Here is the function:\n```python\n{problem.prompt}{solution}```\nHope it helps."
    assert run_humaneval(problem, as_reply, LIMITS).score == 1.0
    assert run_humaneval(problem, solution, LIMITS).score == 1.0


def test_wrong_hanging_or_early_exiting_solutions_fail(problems_with_solutions):
    problem, _ = problems_with_solutions[0]
    name = problem.entry_point
    wrong = run_humaneval(problem, f"```python\ndef {name}(*args):\n    return None\n```", LIMITS)
    assert wrong.score == 0.0 and wrong.status == "failed"
    hang = run_humaneval(problem, f"```python\ndef {name}(*args):\n    while True:\n        pass\n```",
                         SandboxLimits(timeout_s=1.5))
    assert hang.score == 0.0 and hang.status in ("timeout", "failed")
    # exit(0) before the tests: the program's process ends, the harness's check() does not complete.
    early = run_humaneval(problem, f"```python\nimport sys\nsys.exit(0)\ndef {name}(*args):\n    pass\n```", LIMITS)
    assert early.score == 0.0
    garbage = run_humaneval(problem, "I cannot write code, sorry.", LIMITS)
    assert garbage.score == 0.0


def test_program_layout_keeps_helpers_of_the_prompt(problems_with_solutions):
    # HumanEval/10's prompt defines is_palindrome, which make_palindrome's solution calls; the tests stay out of
    # the program (the sandbox's harness runs them) but keep the prompt's helpers.
    problem, solution = problems_with_solutions[10]
    program = humaneval_program(problem, f"```python\ndef {problem.entry_point}(string):\n{solution}```")
    assert program.index("def is_palindrome") < program.index(f"def {problem.entry_point}(string):\n")
    assert "def check" not in program
    tests = humaneval_tests(problem)
    assert "def is_palindrome" in tests and "def check" in tests


# --- multiple choice -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("response", "letter"), [
    ("[C]", "C"), ("The answer is [B] because...", "B"), ("(D) Pacific Ocean", "D"), ("Answer: A", "A"),
    ("The answer is C.", "C"), ("B. Newton", "B"), ("b", None), ("I think it is the Pacific.", None),
    ("A lot of people think [D]", "D"),
])
def test_parse_choice(response, letter):
    assert parse_choice(response) == letter


def test_parse_choice_falls_back_to_the_one_option_named_in_full():
    oceans = ("Atlantic Ocean", "Indian Ocean", "Arctic Ocean", "Pacific Ocean")
    assert parse_choice("The largest ocean on Earth is the Pacific Ocean.", oceans) == "D"
    assert parse_choice("The largest is the Pacific Ring of Fire.", oceans) is None  # no option in full
    assert parse_choice("Either the Indian Ocean or the Pacific Ocean.", oceans) is None  # ambiguous
    assert parse_choice("[A] not the Pacific Ocean", oceans) == "A"  # an explicit letter wins


def test_score_choice_counts_unparsed_as_wrong():
    assert score_choice("B", "[B]").score == 1.0
    assert score_choice("B", "[C]").status == "wrong"
    assert score_choice("B", "no idea") .status == "unparsed"


# --- perplexity and features -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<|im_end|>", "<|im_start|>", "user", "assistant", "the", "cat",
                                         "sat", "on", "mat", "a", "dog", "ran", "write", "story", "."])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>",
                                        pad_token="<unk>")
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    return tokenizer, LlamaForCausalLM(config).eval()


def _reference_perplexity(tokenizer, model, prompt: str, text: str) -> float:
    """Unbatched, unpadded: exp(mean NLL of the reply's tokens given the chat prompt)."""
    head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([head_ids + reply_ids])
    with torch.no_grad():
        logits = model(ids).logits[0]
    logprobs = torch.log_softmax(logits, dim=-1)
    nll = [-logprobs[len(head_ids) + i - 1, tok].item() for i, tok in enumerate(reply_ids)]
    return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("pad_multiple", [None, 16])  # 16: CUDA's widened, longest-first batches, on the CPU
def test_batched_perplexity_matches_an_unbatched_forward_pass(tiny_model, pad_multiple):
    from mmw.quality.scoring import score_texts

    tokenizer, model = tiny_model
    prompts = ["write a story", "write a story .", "write"]
    texts = ["the cat sat on the mat .", "a dog ran", "the dog sat on a mat the cat ran ."]
    scores = score_texts(tokenizer, model, prompts, texts, max_tokens=64, batch_size=2, pad_multiple=pad_multiple)
    expected = [_reference_perplexity(tokenizer, model, p, t) for p, t in zip(prompts, texts, strict=True)]
    assert scores.perplexity == pytest.approx(expected, rel=1e-4)
    assert scores.features.shape == (3, 32) and np.isfinite(scores.features).all()
    if pad_multiple:  # CUDA's queued loop, here on the CPU: the same numbers
        queued = score_texts(tokenizer, model, prompts + ["write"], texts + [""], max_tokens=64, batch_size=2,
                             pad_multiple=pad_multiple, queued=True)
        assert queued.perplexity[:3] == pytest.approx(scores.perplexity, rel=1e-6) and np.isnan(queued.perplexity[3])
        assert np.allclose(queued.features[:3], scores.features, rtol=1e-5, atol=1e-6)
        assert not queued.features[3].any()
    truncated = score_texts(tokenizer, model, prompts[:1], texts[:1], max_tokens=3, batch_size=1)
    assert truncated.perplexity[0] == pytest.approx(_reference_perplexity(tokenizer, model, prompts[0], "the cat sat"),
                                                    rel=1e-4)
    empty = score_texts(tokenizer, model, ["write"], [""], max_tokens=8, batch_size=1)
    assert np.isnan(empty.perplexity[0])


# --- MAUVE -----------------------------------------------------------------------------------------------------

def test_mauve_is_high_for_one_distribution_and_low_for_two():
    from mmw.quality.mauve import mauve_score

    rng = np.random.default_rng(1)
    same = mauve_score(rng.normal(size=(60, 16)), rng.normal(size=(60, 16)), num_buckets=4)
    apart = mauve_score(rng.normal(size=(60, 16)), rng.normal(loc=3.0, size=(60, 16)), num_buckets=4)
    assert same.value > 0.8 > 0.2 > apart.value
    assert same.n_baseline == same.n_watermarked == 60 and same.wall_s >= 0


# --- report and params -----------------------------------------------------------------------------------------

def test_quality_report_groups_by_task_with_hand_computed_values():
    from mmw.reporting.quality import SCORE_SCHEMA, quality_report
    from mmw.reporting.summary import quality_markdown

    rows = [  # prompt_id, task, source, measure, task_score, status, perplexity, rep1..rep4
        ("humaneval-000", "humaneval", "baseline", "pass@1", 1.0, "passed", 2.0, 0.1, 0.0, 0.0, 0.0),
        ("humaneval-001", "humaneval", "baseline", "pass@1", 0.0, "failed", 4.0, 0.3, 0.2, 0.0, 0.0),
        ("humaneval-000", "humaneval", "watermarked", "pass@1", 0.0, "timeout", 3.0, 0.5, 0.4, 0.2, 0.1),
        ("humaneval-001", "humaneval", "watermarked", "pass@1", 0.0, "failed", 9.0, 0.7, 0.6, 0.4, 0.3),
        ("story-000", "story", "baseline", "judge", None, None, 10.0, 0.2, None, None, None),
        ("story-000", "story", "watermarked", "judge", None, None, float("nan"), 0.4, None, None, None),
    ]
    table = pl.DataFrame(rows, schema=SCORE_SCHEMA, orient="row")
    report = quality_report(table, {}, {"scorer": "s", "metrics": ["task"]})
    code, story, everything = report["groups"]["humaneval"], report["groups"]["story"], report["groups"]["all"]
    assert code["measure"] == "pass@1" and code["task_score_baseline"] == 0.5 and code["task_score_watermarked"] == 0
    assert code["task_score_delta"] == -0.5
    assert code["perplexity_baseline"] == 3.0 and code["perplexity_watermarked"] == 6.0  # medians
    assert code["repetition_1_watermarked"] == pytest.approx(0.6)
    assert story["measure"] == "judge" and story["task_score_baseline"] is None
    assert story["perplexity_watermarked"] is None and story["repetition_2_baseline"] is None
    assert everything["n_baseline"] == 3 and everything["perplexity_baseline"] == 4.0
    json.dumps(report, allow_nan=False)  # numbers or null only
    assert "| humaneval | pass@1 | 50.0% → 0.0% |" in quality_markdown(report)


@pytest.mark.parametrize(("section", "message"), [
    ({"metrics": ["mauve", "mauve"]}, "quality.metrics: duplicate metric"),
    ({"mauve_buckets": 1}, "quality.mauve_buckets: expected auto or an integer >= 2"),
    ({"sandbox_timeout_s": 0}, "quality.sandbox_timeout_s: 0 is out of range"),
    ({"scorer": "./no/such/model"}, "quality.scorer: path './no/such/model' does not exist"),
    ({"batch": 3}, "quality.batch: unknown key"),
])
def test_bad_quality_params_name_the_key(section, message):
    from mmw.params import parse_params
    from mmw.quality.params import QualityParams

    with pytest.raises(SpecError) as info:
        parse_params({"seed": 0, "quality": section}, ("quality",), models={"quality": QualityParams})
    assert str(info.value).startswith(message)


def test_an_unknown_measure_fails_the_board_and_the_stage_before_any_work(tmp_path, monkeypatch):
    """Measure names are the registry's: the key stage's board check and the quality stage both refuse one it
    lacks, in one line naming the key and the allowed names, before reading a text."""
    import yaml

    from mmw.board import check_board
    from mmw.quality.registry import QUALITY_METRICS
    from mmw.stages import quality

    board = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    board["quality"]["metrics"] = ["mauve", "bleu"]
    with pytest.raises(SpecError) as info:
        check_board(board)
    assert str(info.value) == f"quality.metrics: unknown metric 'bleu'; allowed: {', '.join(QUALITY_METRICS)}"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"seed": 0, "quality": {"metrics": ["bleu"]}}))
    monkeypatch.chdir(tmp_path)  # no generations here: the refusal must come first
    with pytest.raises(SpecError, match="quality.metrics: unknown metric 'bleu'"):
        quality.run(tmp_path / "params.yaml")


def test_every_registered_measure_is_one_class_with_columns_and_summary():
    """The registry's contract: each name loads exactly its class, whose columns are in the scores schema and whose
    summary columns name numbers its groups produce."""
    from mmw.quality.registry import QUALITY_METRICS, metric_class
    from mmw.reporting.quality import SCORE_SCHEMA, group_quality

    rows = pl.DataFrame({"prompt_id": ["a", "a"], "task": ["story", "story"], "source": ["baseline", "watermarked"],
                         "measure": ["judge", "judge"]}).with_columns(
        *(pl.lit(None, dtype=dtype).alias(name) for name, dtype in list(SCORE_SCHEMA.items())[4:]))
    numbers = group_quality(rows, "judge")
    for name in QUALITY_METRICS:
        metric = metric_class(name)
        assert metric.name == name and set(metric.columns) <= set(SCORE_SCHEMA)
        for column in metric.summary_columns:
            assert {f"{column.key}_baseline", f"{column.key}_watermarked"} <= set(numbers), (name, column)


def test_quality_and_low_entropy_sections_default_when_absent():
    from mmw.params import parse_params
    from mmw.quality.params import LowEntropyParams, QualityParams

    params = parse_params({"seed": 0}, ("quality", "low_entropy"),
                          models={"quality": QualityParams, "low_entropy": LowEntropyParams})
    assert params.quality.metrics == ["task", "repetition", "perplexity", "mauve"]
    assert params.low_entropy.temperature == 1.0


# --- the stage -------------------------------------------------------------------------------------------------

def _write_stage_inputs(root, metrics, **quality):
    """Generations where the baseline solves HumanEval/0 and answers [D], and the watermarked texts do not."""
    import yaml

    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as fh:
        first = json.loads(fh.readline())
    rows = {
        "baseline": [f"```python\n{first['prompt']}{first['canonical_solution']}```", "[D]"],
        "watermarked": ["```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```",
                        "the the the the the the"],
    }
    for source, texts in rows.items():
        path = root / "data" / "generations" / f"{source}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pl.DataFrame({"prompt_id": ["humaneval-000", "multiple_choice-001"], "task": ["humaneval", "multiple_choice"],
                      "prompt": ["Complete the function.", "Which is the largest ocean?"],
                      "text": texts}).write_parquet(path)
    (root / "params.yaml").write_text(yaml.safe_dump({"seed": 0, "quality": {
        "metrics": metrics, "sandbox_timeout_s": 2, "batch_size": 2, "max_tokens": 64, **quality}}))


def test_quality_stage_scores_code_and_answers_and_survives_a_hanging_program(tmp_path, monkeypatch):
    from mmw.stages import quality

    _write_stage_inputs(tmp_path, ["task", "repetition"])
    monkeypatch.chdir(tmp_path)
    quality.run(tmp_path / "params.yaml")
    scores = pl.read_parquet(tmp_path / "data/quality/scores.parquet").sort("source", "prompt_id")
    assert scores["task_score"].to_list() == [1.0, 1.0, 0.0, 0.0]
    assert scores["task_status"].to_list() == ["passed", "correct", "timeout", "unparsed"]
    assert scores["perplexity"].null_count() == 4  # not requested: no model loaded
    report = json.loads((tmp_path / "reports/quality.json").read_text())
    assert report["groups"]["humaneval"]["task_score_delta"] == -1.0
    assert report["groups"]["multiple_choice"]["repetition_1_watermarked"] == pytest.approx(5 / 6)
    assert report["mauve"] is None and report["sandbox"].startswith("bubblewrap:")  # how the code was isolated
    timing = json.loads((tmp_path / "reports/timings/quality.json").read_text())
    assert "scoring_s" not in timing and "load_s" not in timing  # no measure needed the scorer


def test_the_unsafe_sandbox_is_an_explicit_choice_recorded_in_the_report(tmp_path, monkeypatch):
    """Same verdicts under the opt-in mode, and quality.json says the code ran without OS isolation."""
    from mmw.stages import quality

    _write_stage_inputs(tmp_path, ["task"], sandbox="unsafe")
    monkeypatch.chdir(tmp_path)
    quality.run(tmp_path / "params.yaml")
    scores = pl.read_parquet(tmp_path / "data/quality/scores.parquet").sort("source", "prompt_id")
    assert scores["task_status"].to_list() == ["passed", "correct", "timeout", "unparsed"]
    report = json.loads((tmp_path / "reports/quality.json").read_text())
    assert report["sandbox"].startswith("UNSAFE (quality.sandbox: unsafe)")


@pytest.mark.heavy
def test_quality_stage_with_the_embedded_scorer(tmp_path, monkeypatch):
    """Perplexity and MAUVE with the real default scorer (SmolLM2): a degenerate reply is less likely than code."""
    from mmw.stages import quality

    _write_stage_inputs(tmp_path, ["perplexity", "mauve"])
    monkeypatch.chdir(tmp_path)
    quality.run(tmp_path / "params.yaml")
    report = json.loads((tmp_path / "reports/quality.json").read_text())
    scores = pl.read_parquet(tmp_path / "data/quality/scores.parquet")
    assert scores["perplexity"].is_finite().all() and scores["task_score"].null_count() == 4
    assert 0 < report["mauve"]["value"] <= 1
    assert "wall_s" not in report["mauve"]  # wall times are a log, never in a DVC output that aggregate reads
    # ... where the timing log says how the stage's time split: the scorer's load, its forward, each measure.
    timing = json.loads((tmp_path / "reports/timings/quality.json").read_text())
    assert 0 < timing["load_s"] and 0 < timing["scoring_s"]
    assert timing["load_s"] + timing["scoring_s"] + timing["perplexity_s"] + timing["mauve_s"] <= timing["wall_s"]
