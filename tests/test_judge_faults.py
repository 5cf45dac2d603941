"""Faults of an OpenAI-compatible server (the judge's, and the paraphrase attack's): a small real HTTP server on 127.0.0.1 answers each chat request
with the next fault of its schedule (garbage bytes, a truncated body, a non-JSON page, another schema, empty
content, a reply slower than the timeout). Each must end as a missing rating (never 0) after a bounded number of
requests, leave nothing in the judgement cache, and let the ``rate`` stage finish; a well-formed reply after the
fault is used and cached. Also: ``python -m mmw.attacks.llm_server`` refuses a non-loopback host without a key."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest
import yaml

pytest.importorskip("openai")

from mmw.judge.backends import CachedRater, JudgementCache, ServerBackend  # noqa: E402

MODEL = "fault-judge"
TIMEOUT_S = 1.0
RETRIES = 2
FAULTS = ("garbage", "truncated", "non-json", "wrong-schema", "empty-content", "no-choices", "slow")


def _completion(content: object, logprobs: object = None) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
                         "message": {"role": "assistant", "content": content}}]}


def _top(tokens: dict[str, float]) -> dict:
    return {"content": [{"token": next(iter(tokens)), "logprob": 0.0, "bytes": None,
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in tokens.items()]}]}


class FaultServer:
    """``schedule``: faults for the coming chat requests, in order; ``ok`` once it is used up. ``ok`` replies
    "Grade: 85" (greedy) or puts all mass on the token "85" (a prefilled logprobs request)."""

    def __init__(self) -> None:
        self.schedule: list[str] = []
        self.chat_requests = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, body: bytes, content_type: str = "application/json", length: int | None = None):
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()

            def do_GET(self) -> None:
                self._send(json.dumps({"object": "list", "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}]}).encode())

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.chat_requests += 1
                    fault = server.schedule.pop(0) if server.schedule else "ok"
                prefilled = request["messages"][-1]["role"] == "assistant"
                good = _completion("8" if prefilled else "Grade: 85", _top({"85": 0.0}) if prefilled else None)
                if fault == "ok":
                    self._send(json.dumps(good).encode())
                elif fault == "garbage":
                    self._send(b"\x8f\x00\xffgarbage{{[")
                elif fault == "truncated":
                    body = json.dumps(good).encode()
                    self._send(body[: len(body) // 2], length=len(body))
                    self.close_connection = True
                elif fault == "non-json":
                    self._send(b"<html><body>502 Bad Gateway</body></html>", "text/html")
                elif fault == "wrong-schema":
                    self._send(json.dumps({"result": {"grade": 85}, "choices": [{"message": {"content": 85}}],
                                           "object": "chat.completion"}).encode())
                elif fault == "empty-content":
                    self._send(json.dumps(_completion("", _top({}) if prefilled else None)).encode())
                elif fault == "no-choices":
                    self._send(json.dumps({**good, "choices": []}).encode())
                elif fault == "slow":
                    time.sleep(TIMEOUT_S * 2.5)
                    self._send(json.dumps(good).encode())
                else:
                    raise AssertionError(fault)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FaultServer]:
    made = FaultServer()
    yield made
    made.close()


def _backend(server: FaultServer, want_expected: bool = False) -> ServerBackend:
    backend = ServerBackend(server.base_url, MODEL, "MMW_TEST_NO_KEY", TIMEOUT_S, RETRIES, 1, 8)
    backend.probe(want_expected)
    return backend


@pytest.mark.parametrize("mode", ["greedy", "expected"])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_persistent_fault_is_a_missing_rating_after_bounded_tries_and_is_not_cached(fault, mode, server,
                                                                                     tmp_path):
    backend = _backend(server, want_expected=mode == "expected")
    cache = JudgementCache(tmp_path)
    server.schedule = [fault] * 100
    server.chat_requests = 0
    rater = CachedRater(backend, cache)
    ratings = rater.rate(["Write a story."], ["Once upon a time."], [mode])[mode]
    assert ratings == [None] and rater.stats.failed == 1 and rater.stats.computed == 0
    assert 1 <= server.chat_requests <= RETRIES + 1  # bounded: one try and at most RETRIES more
    assert not list(tmp_path.rglob("*.json"))  # nothing cached: the next run asks again
    server.schedule = []  # the server recovers: the same judgement is now made and cached
    again = CachedRater(backend, cache)
    assert again.rate(["Write a story."], ["Once upon a time."], [mode])[mode] == [85.0]
    assert again.stats.computed == 1 and len(list(tmp_path.rglob("*.json"))) == 1


@pytest.mark.parametrize("fault", FAULTS)
def test_a_transient_fault_is_retried_and_the_good_reply_used(fault, server, tmp_path):
    backend = _backend(server)
    server.schedule = [fault]
    rater = CachedRater(backend, JudgementCache(tmp_path))
    assert rater.rate(["p"], ["t"], ["greedy"])["greedy"] == [85.0]
    assert rater.stats.failed == 0


def test_a_reply_without_a_grade_is_a_cached_none_not_a_failure(server, tmp_path):
    """Well formed, but the judge wrote no number: None (never 0), cached, because asking again answers the same."""
    backend = _backend(server)
    server.schedule = []
    original = server.httpd.RequestHandlerClass.do_POST

    def no_number(handler) -> None:
        handler.rfile.read(int(handler.headers["Content-Length"]))
        handler._send(json.dumps(_completion("I cannot rate this text.")).encode())

    server.httpd.RequestHandlerClass.do_POST = no_number
    try:
        rater = CachedRater(backend, JudgementCache(tmp_path))
        assert rater.rate(["p"], ["t"], ["greedy"])["greedy"] == [None]
    finally:
        server.httpd.RequestHandlerClass.do_POST = original
    assert rater.stats.failed == 0 and rater.stats.computed == 1 and len(list(tmp_path.rglob("*.json"))) == 1


@pytest.mark.parametrize("fault", ["garbage", "non-json", "wrong-schema"])
def test_a_malformed_model_list_is_a_one_line_error_before_rating(fault, server):
    from mmw.errors import SpecError

    server.httpd.RequestHandlerClass.do_GET = lambda handler: handler._send(
        {"garbage": b"\x8f{{", "non-json": b"<html></html>", "wrong-schema": b'{"data": "x"}'}[fault],
        "text/html" if fault == "non-json" else "application/json")
    backend = ServerBackend(server.base_url, MODEL, "MMW_TEST_NO_KEY", TIMEOUT_S, RETRIES, 1, 8)
    with pytest.raises(SpecError, match=r"^rate\.base_url: the judge server at .* cannot be used \(Malformed"):
        backend.probe(want_expected=False)


def test_the_rate_stage_finishes_with_every_fault_injected(server, tmp_path, monkeypatch):
    """One text per fault (each fault lasting past the retries) and some good ones: the stage exits normally,
    the faulted texts are missing (null, not 0) and counted, the rest rated; a rerun fills only the missing."""
    from mmw.stages import rate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MMW_JUDGE_CACHE", str(tmp_path / "cache"))
    n_good = 3
    texts = [f"text {i}" for i in range(len(FAULTS) + n_good)]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"seed": 0, "rate": {
        "judge": MODEL, "device": "cpu", "dtype": "float32", "batch_size": 2, "backend": "openai",
        "base_url": server.base_url, "mode": "greedy", "max_retries": RETRIES, "timeout_s": TIMEOUT_S,
        "concurrency": 1, "max_new_tokens": 8}}))
    (tmp_path / "data" / "generations").mkdir(parents=True)
    pl.DataFrame({"prompt_id": [f"p{i}" for i in range(len(texts))], "task": ["story"] * len(texts),
                  "prompt": ["Write a story."] * len(texts), "text": texts}
                 ).write_parquet(tmp_path / "data" / "generations" / "baseline.parquet")
    # concurrency 1: requests arrive in text order; each fault repeats for all tries of its text.
    server.schedule = [f for f in FAULTS for _ in range(RETRIES + 1)]
    rate.run("baseline", Path("params.yaml"))
    table = pl.read_parquet("data/ratings/baseline.parquet").sort("prompt_id")
    report = json.loads(Path("reports/judge.json").read_text())
    ratings = dict(zip(table["prompt_id"], table["rating"], strict=True))
    assert sorted(v for v in ratings.values() if v is not None) == [85.0] * n_good
    assert sum(v is None for v in ratings.values()) == len(FAULTS) and 0.0 not in ratings.values()
    assert report["missing"] == len(FAULTS), report
    server.chat_requests = 0
    rate.run("baseline", Path("params.yaml"))  # the server has recovered: only the missing are asked again
    table = pl.read_parquet("data/ratings/baseline.parquet")
    assert table["rating"].to_list() == [85.0] * len(texts)
    timing = json.loads(Path("reports/timings/rate_baseline.json").read_text())
    # (the judge's discrimination check also rates shuffled texts; a shuffle equal to its original shares its key)
    assert timing["judgements_failed"] == 0 and 0 < timing["judgements_made"] <= len(FAULTS), timing
    assert server.chat_requests == timing["judgements_made"]


# --------------------------------------------------------------------------------------------- paraphrase
@pytest.mark.parametrize("fault", FAULTS)
def test_the_paraphrase_attack_records_a_faulty_reply_as_a_failed_outcome(fault, server):
    """The paraphrase attack's endpoint: a persistent fault is a failed outcome naming the problem (the stage
    records it and goes on), never an exception; after the server recovers the reply is used."""
    from mmw.attacks import build_attack

    attack = build_attack({"name": "paraphrase", "backend": "openai", "base_url": server.base_url, "model": MODEL,
                           "max_retries": RETRIES, "timeout_s": TIMEOUT_S, "concurrency": 1}, "attacks[0]")
    server.schedule = [fault] * (RETRIES + 1)
    server.chat_requests = 0
    [outcome] = attack.apply_batch(["A short text to rewrite."], [0])
    assert not outcome.ok and outcome.text is None and "AttackError" in outcome.error
    assert 1 <= server.chat_requests <= RETRIES + 1
    server.schedule = []
    [outcome] = attack.apply_batch(["A short text to rewrite."], [0])
    assert outcome.ok and outcome.text == "Grade: 85"


# --------------------------------------------------------------------------------------------- the local server
@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::", "example.org"])
def test_the_local_server_refuses_a_public_host_without_a_key(host, monkeypatch):
    monkeypatch.delenv("MMW_LLM_SERVER_API_KEY", raising=False)
    done = subprocess.run([sys.executable, "-m", "mmw.attacks.llm_server", "--host", host, "--port", "0"],
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("host:") and "MMW_LLM_SERVER_API_KEY" in lines[0] and "127.0.0.1" in lines[0]
