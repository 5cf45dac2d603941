"""LLM-as-a-judge quality ratings with the paper's rating prompt (appendix "Rating prompt"), in process.

Two ratings per text, both on 0..100:
  greedy    the judge writes a short reply (greedy decoding) and the first number in it is the grade; a reply
            without a usable number is None (the reference code turned it into 0, which drags means down).
  expected  the assistant turn is prefilled with "Grade: " so the next tokens are the grade; the rating is the
            expectation of the grade under the judge's next-token distribution (G-Eval style), None when the
            judge puts negligible probability on numbers. Much less coarse than one sampled number.

How the expected value is computed for any tokenizer: each grade 0..100 is tokenized after the prefill, which
gives a token path per grade (one token for tokenizers with whole-number tokens, digit by digit for SmolLM2,
Qwen, ...). The paths form a trie; its inner nodes (e.g. "1".."9" and "10" for digit tokenizers) are appended to the
context as extra tokens under a tree attention mask, so one forward pass per batch gives every distribution needed.
The rating prompt's fixed head (the system turn, up to where the rated prompt begins) is the same for every
judgement: its keys and values are computed once per judge and shared by every row of every batch, so a batch's
forward covers only each row's own tokens.
P(grade) = product of the path's token probabilities x P(the number stops there), where "stops" means the next
token does not start with a digit; it is evaluated at inner nodes ("1" vs "10"..."19", "10" vs "100") and taken
as 1 at leaves (a longer number would be out of range anyway).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from jinja2 import TemplateError
from scipy import stats
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from mmw.engines.attention import (
    ROUNDED_WIDTH,
    attention_at_mask_widths,
    causal_split_attention,
    grouped_query_prompts,
    grouped_query_sdpa,
    rounded_width,
)
from mmw.engines.generate import neutral_generation_config, neutral_model_defaults
from mmw.errors import SpecError
from mmw.inductor import inductor_options
from mmw.judge.last_layer import last_layer, last_layer_pruned

RATING_SYSTEM = (
    "You are given a prompt and a response, and you provide a grade out of 100 measuring the quality of the "
    "response, in terms of accuracy, level of details, and typographical, grammatical and lexical correctness. "
    "Remove points as soon as one of the criteria is missed."
)
RATING_USER = "Prompt: {prompt}\nResponse: {response}"
GRADE_PREFILL = "Grade:"
MAX_GRADE = 100
MODES = ("greedy", "expected")

# A number, optionally "out of N" / "/N" (then rescaled to 100). Signs and decimals are kept so "-5" and "105"
# are seen as the out-of-range numbers they are instead of being misread as 5 and 10.
_NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)(?:\s*(?:/|out of)\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)


def parse_grade(reply: str) -> float | None:
    """First number of ``reply`` as a grade in [0, 100]; ``x/10``-style grades are rescaled. None when the first
    number is missing or out of range (never 0: "no grade" is not "worst grade")."""
    match = _NUMBER.search(reply)
    if match is None:
        return None
    value = float(match.group(1))
    if match.group(2) is not None:
        scale = float(match.group(2))
        if scale <= 0 or not 0 <= value <= scale:
            return None
        value = value * MAX_GRADE / scale
    return value if 0 <= value <= MAX_GRADE else None


def rating_messages(prompt: str, response: str) -> list[dict[str, str]]:
    """The paper's rating prompt as chat messages (its <<SYS>> block becomes the system turn)."""
    return [
        {"role": "system", "content": RATING_SYSTEM},
        {"role": "user", "content": RATING_USER.format(prompt=prompt, response=response)},
    ]


@dataclass(frozen=True)
class GradeTrie:
    """Token paths of the grades after the prefill. ``paths[g]``: token ids of grade ``g`` (g = 0..100);
    ``inner``: proper path prefixes that need their own next-token distribution (the root () excluded)."""

    prefill: str
    paths: tuple[tuple[int, ...], ...]
    inner: tuple[tuple[int, ...], ...]


def grade_trie(tokenizer: PreTrainedTokenizerBase) -> GradeTrie:
    """Find how this tokenizer writes "Grade: 0".."Grade: 100" and build the trie of grade token paths.

    Byte-level BPEs that split digits (SmolLM2, Qwen, Llama 3) make the space its own token, so the prefill is
    "Grade: "; GPT-2-style vocabularies glue the space to the number (" 85"), so the prefill is "Grade:".
    """
    for prefill, separator in ((GRADE_PREFILL + " ", ""), (GRADE_PREFILL, " ")):
        head = tokenizer.encode(prefill, add_special_tokens=False)
        paths = []
        for grade in range(MAX_GRADE + 1):
            ids = tokenizer.encode(prefill + separator + str(grade), add_special_tokens=False)
            if ids[: len(head)] != head or len(ids) == len(head):
                break
            paths.append(tuple(ids[len(head):]))
        else:
            if len(set(paths)) == len(paths):
                prefixes = {path[:k] for path in paths for k in range(1, len(path))}
                # A grade path that is also a prefix of another ("1" of "10") needs its stop probability.
                inner = prefixes | {path for path in paths if any(len(o) > len(path) and o[: len(path)] == path
                                                                  for o in paths)}
                return GradeTrie(prefill, tuple(paths), tuple(sorted(inner, key=lambda p: (len(p), p))))
    raise SpecError("rate.judge", "cannot find how the judge's tokenizer writes grades 0..100 after 'Grade:'")


def digit_start_mask(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) bool: tokens whose text starts with a digit, i.e. that would extend a number."""
    ids = [[token_id] for token_id in range(min(vocab_size, len(tokenizer)))]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    # A fast tokenizer's Rust decoder, all ids in one call: one ``decode`` call per id of a 128k vocabulary took
    # 3.4 s per judge load on a 2-core VM (transformers' argument handling, not the decoding). transformers'
    # decode may also clean up spaces before punctuation, which never changes whether a text starts with a digit.
    texts = backend.decode_batch(ids, skip_special_tokens=False) if backend is not None \
        else [tokenizer.decode(token) for token in ids]
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[: len(texts)] = torch.tensor([bool(text) and text[0].isdigit() for text in texts], dtype=torch.bool)
    return mask


#: The arithmetic of the in-process judge's ``expected`` mode: bumped whenever a change moves its ratings (if
#: only in the last bits, as computing the rating prompt's head once for all rows did), so judgements cached by
#: another arithmetic are not mixed with new ones (``mmw.judge.backends.TransformersBackend.cache_id``).
ARITHMETIC = 2

#: Stands for the rated prompt where the judge looks for the start of the rating prompt's fixed head.
_PLACEHOLDER = "\uE000prompt\uE000"

#: On CUDA a greedy batch's width is padded up to a multiple of this many tokens: torch's cuDNN attention builds an
#: execution plan for every new sequence length (~0.4 s a batch of 16 texts of ~700 tokens on an H100,
#: bench/RESULTS.md "GPU judge"), so batches of nearby lengths should share a shape. Pad positions are masked, so
#: the ratings are the same; on a CPU extra positions are only extra work, so nothing is padded there. The
#: expected mode's forward rounds only its attention's widths instead (``Judge.round_attention``).
CUDA_PAD_MULTIPLE = 128

#: Texts whose token counts a judge remembers (a full-scale rate stage plans ~1,200 rows).
TOKEN_COUNTS_KEPT = 65536


def compile_judge_default(device: torch.device) -> bool:
    """Compile the judge's decoder layers on CUDA (a CPU forward is dominated by its matmuls, and compiling would cost
    a C++ toolchain and seconds per process for little); params ``engine.compile_judge: false`` passes
    ``compiled=False`` instead."""
    return device.type == "cuda"


class SharedHeadCache(DynamicCache):
    """The rating prompt's head as a key/value cache for ``n_rows`` rows, read by every layer of one forward.

    The head's keys and values are stacked over layers and indexed by the layer's number as a tensor index: a
    compiled decoder layer then traces that number as a symbolic input, so the 32 layers of a Llama share one
    compiled graph (``DynamicCache`` looks its layers up in a Python list, which fixes the number in each layer's
    graph: one compilation per layer). Nothing is appended: the cache serves one forward."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, n_rows: int) -> None:
        """``keys``, ``values``: (layers, 1, kv_heads, head_len, head_dim)."""
        super().__init__(ddp_cache_data=[(k.expand(n_rows, -1, -1, -1), v.expand(n_rows, -1, -1, -1))
                                         for k, v in zip(keys, values, strict=True)])
        self.head_keys, self.head_values = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int | torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, kv_heads, head_len + new, head_dim) keys and values: the head's, then this forward's.
        ``layer_idx``: an int, or a 0-dim integer tensor (:meth:`CompiledLayers.active`; read by ``index_select``,
        where plain indexing would read its value back to the host)."""
        rows = key_states.shape[0]
        if isinstance(layer_idx, torch.Tensor):
            head_keys, head_values = (stacked.index_select(0, layer_idx.reshape(1))[0]
                                      for stacked in (self.head_keys, self.head_values))
        else:
            head_keys, head_values = self.head_keys[layer_idx], self.head_values[layer_idx]
        return (torch.cat([head_keys.expand(rows, -1, -1, -1), key_states], -2),
                torch.cat([head_values.expand(rows, -1, -1, -1), value_states], -2))


def layer_numbers(layers: Sequence[torch.nn.Module]) -> dict[torch.nn.Module, int] | None:
    """``{attention module: its layer number}`` where the layers' int attributes (of every submodule) differ in
    ``self_attn.layer_idx`` alone, so one graph traced with that number as an input serves every layer; None
    otherwise (then :class:`CompiledLayers` traces every int attribute as symbolic)."""
    attentions = [getattr(layer, "self_attn", None) for layer in layers]
    if not attentions or any(not isinstance(getattr(a, "layer_idx", None), int) for a in attentions):
        return None

    def ints(layer: torch.nn.Module) -> dict[tuple[str, str], int]:
        return {(path, name): value for path, module in layer.named_modules() for name, value in vars(module).items()
                if type(value) is int and (path, name) != ("self_attn", "layer_idx")}

    first = ints(layers[0])
    if any(ints(layer) != first for layer in layers[1:]):
        return None
    return {attention: attention.layer_idx for attention in attentions}


class CompiledLayers:
    """The model's decoder layers compiled once (``torch.compile``, dynamic shapes: batches of every width share
    the compiled code), switched on only inside :meth:`active`, so other uses of the model (the greedy mode's
    ``generate``, another role sharing the weights) run as they always did.

    Why compile: the eager forward of an 8B model runs its norms, rotary embedding and activations as separate
    kernels between the matmuls (bench/results/judge_forward.md: the judge's forward at 1.8x its matmul floor,
    1.23x faster compiled). Why layers, not the model: every layer runs the same code, so one compilation serves
    them all (a whole-model compile took ~2 min per shape)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.layers = list(getattr(getattr(model, "model", None), "layers", None) or [])
        self.calls: list = []
        for layer in self.layers:
            # pointwise settings by rule: the layers compile beside a decode (mmw.inductor)
            layer.compile(dynamic=True, options=inductor_options(time_pointwise=False))
            self.calls.append(getattr(layer, "_compiled_call_impl", None))
            layer._compiled_call_impl = None  # off until active()
        if not self.layers or any(call is None for call in self.calls):
            warnings.warn("the judge's decoder layers could not be compiled with this torch/transformers; "
                          "it runs eagerly", stacklevel=2)
            self.calls = []
        # Inside active() each attention's layer number is a 0-dim tensor: SharedHeadCache indexes the head's keys
        # and values by it. As an int attribute of the module Dynamo would fix it in each layer's graph (a
        # compilation per layer); allow_unspec_int_on_nn_module makes it symbolic, but with it every int attribute
        # of every module (the head size too) and every size derived from it, which made tracing the layer ~2.5x
        # slower on a CPU (the judge's set-up, bench/RESULTS.md). A tensor attribute is a graph input like the
        # weights, so the layers share one graph and the other ints stay constants. Where the layers differ in
        # another int (layer_numbers None) every int is made symbolic, as before. The tensors are made once: a
        # copy from host memory in every batch would wait for the device's queue (as in Judge).
        numbers = layer_numbers(self.layers)
        # Floats (the norms' epsilon, the attention's scale) as constants from the start: traced as symbols (the
        # default of recent torch), Dynamo specialized them at the end and restarted its analysis, paying the trace
        # twice in every process's set-up (the same graph, the same bits).
        self._dynamo = {"allow_unspec_int_on_nn_module": numbers is None}
        if hasattr(torch._dynamo.config, "specialize_float"):
            self._dynamo["specialize_float"] = True
        self._numbered = None if numbers is None else [
            (attention, number, torch.tensor(number, device=next(attention.parameters()).device))
            for attention, number in numbers.items()]

    @property
    def usable(self) -> bool:
        return bool(self.calls)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The compiled layers in place for the block (the layer number traced as an input, not a constant)."""
        for layer, call in zip(self.layers, self.calls, strict=False):
            layer._compiled_call_impl = call
        numbered = self._numbered
        try:
            # No duck sizing: two widths that happen to be equal in one batch (the attention's query and key
            # widths, rounded) must not be traced as one symbol, or another batch recompiles the layers.
            # The layer numbers as tensors and the floats as constants: see __init__.
            with torch._dynamo.config.patch(**self._dynamo), \
                    torch.fx.experimental._config.patch(use_duck_shape=False):
                for attention, _, number in numbered or ():
                    attention.layer_idx = number
                yield
        finally:
            for attention, number, _ in numbered or ():
                attention.layer_idx = number
            for layer in self.layers:
                layer._compiled_call_impl = None


class Judge:
    """Rates (prompt, response) pairs with a causal LM (``tokenizer`` must pad on the left, as
    ``mmw.engines.models.load_model`` sets up)."""

    #: The expected mode's forward on CUDA lets SDPA read each K/V head for its group of query heads under the
    #: tree mask (``mmw.engines.attention.grouped_query_prompts``) instead of copying K/V to every query head.
    grouped_query: bool = True

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        model: PreTrainedModel,
        batch_size: int = 4,
        max_new_tokens: int = 16,
        min_mass: float = 0.01,
        progress: bool = False,
        compiled: bool | None = None,
        round_attention: bool | None = None,
        split_attention: bool | None = None,
        prune_last_layer: bool = True,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise SpecError("rate.judge", "the judge's tokenizer has no chat template; use an instruction model")
        self.tokenizer = tokenizer
        self.model = model
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.min_mass = min_mass
        self.progress = progress
        self.pad_multiple = CUDA_PAD_MULTIPLE if model.device.type == "cuda" and CUDA_PAD_MULTIPLE else None
        # ``round_attention`` (None: on CUDA): the expected mode's forward pads its rows to the batch's longest
        # only and widens just its SDPA attention to rounded widths (``mmw.engines.attention.
        # attention_at_mask_widths``), so the matrix products skip the rounding's pad positions while cuDNN still
        # sees few shapes.
        self.round_attention = model.device.type == "cuda" if round_attention is None else round_attention
        # ``split_attention`` (None: on CUDA): the expected mode's forward pads its rows on the right and runs the
        # rows' own tokens under a causal kernel, the extra positions (each row's last token, the trie's nodes)
        # apart under their mask (``mmw.engines.attention.causal_split_attention``); otherwise one dense tree mask.
        self.split_attention = model.device.type == "cuda" if split_attention is None else split_attention
        # ``prune_last_layer``: under the causal split, the last decoder layer runs its queries, output projection
        # and MLP at the kept positions only (``mmw.judge.last_layer``) where its class is one that module reproduces.
        self.prune_last_layer = prune_last_layer and last_layer(model) is not None
        attention = getattr(model.config, "_attn_implementation", "eager")
        if attention not in ("sdpa", "eager"):
            raise SpecError("rate.judge", f"attention implementation {attention!r} cannot take the judge's tree mask",
                            ["sdpa", "eager"])
        self.trie = grade_trie(tokenizer)
        # Inner trie nodes as extra tokens: each node's last token, its depth below the context, and which node
        # tokens it may attend to (its ancestors and itself).
        # On the model's device once: a copy from host memory in every forward would wait for the device to finish
        # its queue (a pageable copy synchronizes), and so would indexing with a boolean mask.
        inner, device = self.trie.inner, model.device
        self._tree_tokens = torch.tensor([node[-1] for node in inner], dtype=torch.long, device=device)
        self._tree_depth = torch.tensor([len(node) for node in inner], dtype=torch.long, device=device)
        self._tree_ancestors = torch.tensor(
            [[len(other) <= len(node) and node[: len(other)] == other for other in inner] for node in inner],
            dtype=torch.bool, device=device,
        ).reshape(len(inner), len(inner))
        # The causal split's extra tokens (:meth:`_split_node_logits`): the root (the row's last token), then the
        # inner nodes; each sees the root and its own ancestors.
        self._extra_ancestors = torch.ones(1 + len(inner), 1 + len(inner), dtype=torch.bool, device=device)
        self._extra_ancestors[0, 1:] = False
        self._extra_ancestors[1:, 1:] = self._tree_ancestors
        vocab_size = model.get_output_embeddings().weight.shape[0]
        self.digit_start = digit_start_mask(tokenizer, vocab_size).to(device)
        self._digit_ids = self.digit_start.nonzero().flatten()
        self._head: tuple[int, ...] | None = None
        self._head_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self._token_counts: dict[str, int] = {}
        # ``compiled`` None: compile on CUDA (``compile_judge_default``); the expected mode's forward only.
        want = compile_judge_default(model.device) if compiled is None else compiled
        #: Why the layers run eagerly although compiling them was asked for (None: compiled, or not asked for).
        self.compile_error: str | None = None
        self._compiled = CompiledLayers(model) if want else None
        if self._compiled is not None and not self._compiled.usable:
            self._compiled = None
        if self._compiled is not None:
            try:  # compile now, on two rows (a dimension of size 1 would be fixed in the graph), not in a batch
                self.node_logits([self.tokenizer.encode(self._chat("?", text) + self.trie.prefill,
                                                        add_special_tokens=False) for text in ("a", "a b c d")])
            except Exception as err:  # a compiler bug must not cost a run: the eager forward is the same function
                self.compile_error = f"{type(err).__name__}: {str(err)[:1000]}"
                warnings.warn(f"compiling the judge failed ({self.compile_error}); it runs eagerly", stacklevel=2)
                self._compiled = None

    @property
    def arithmetic(self) -> str:
        """What the expected mode's numbers depend on beyond the model and the texts: :data:`ARITHMETIC`, whether
        the forward is compiled (fused kernels round differently in the last bits) and whether, on CUDA, attention
        reads K/V heads by query-head group (another cuDNN kernel: other last bits) and rounds the attention's
        widths instead of the rows' (other matrix shapes: other last bits), or splits it causally
        (:attr:`split_attention`: other kernels, other last bits), and whether the causal split runs the last layer
        at the kept positions only (:attr:`prune_last_layer`: other matrix shapes, other last bits)."""
        parts = [str(ARITHMETIC)] + ["compiled"] * (self._compiled is not None) \
            + ["gqa"] * (self.grouped_query and self.model.device.type == "cuda") \
            + [f"w{ROUNDED_WIDTH}"] * (self.round_attention and not self._splits) \
            + [f"causal{ROUNDED_WIDTH}"] * self._splits + ["last"] * (self._splits and self.prune_last_layer)
        return "+".join(parts)

    @property
    def _splits(self) -> bool:
        """Whether the expected mode's forward runs the causal split (``split_attention`` with SDPA attention)."""
        return self.split_attention and getattr(self.model.config, "_attn_implementation", None) == "sdpa"

    def _chat(self, prompt: str, response: str) -> str:
        messages = rating_messages(prompt, response)
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError:
            # Some templates (older Mistral, Gemma 2) refuse a system turn: put the instructions in the user turn.
            merged = [{"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}]
            return self.tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)

    def _batches(
        self, prompts: Sequence[str], texts: Sequence[str], prefill: str, desc: str
    ) -> Iterator[tuple[list[int], list[list[int]]]]:
        """Batches of (row indices, token ids of each row's rating prompt), rows grouped by length; a progress bar
        when asked."""
        if len(prompts) != len(texts):
            raise ValueError(f"prompts and texts differ in length ({len(prompts)} vs {len(texts)})")
        if not texts:
            return
        chats = [self._chat(p, t) + prefill for p, t in zip(prompts, texts, strict=True)]
        encoded = self.tokenizer(chats, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        order = sorted(range(len(chats)), key=lambda i: -len(encoded[i]))
        with tqdm(total=len(order), desc=desc, unit="text", disable=not self.progress) as bar:
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                yield rows, [encoded[i] for i in rows]
                bar.update(len(rows))

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """The number of tokens of each text under the judge's tokenizer (what its row adds to a rating prompt).
        Remembered: a rate stage asks for a text's count when it plans all its batches and again per batch."""
        missing = [text for text in dict.fromkeys(texts) if text not in self._token_counts]
        if missing:
            if len(self._token_counts) + len(missing) > TOKEN_COUNTS_KEPT:
                self._token_counts.clear()
            encoded = self.tokenizer(missing, add_special_tokens=False, return_attention_mask=False)["input_ids"]
            self._token_counts.update(zip(missing, map(len, encoded), strict=True))
        return [self._token_counts[text] for text in texts]

    def _pad(self, sequences: Sequence[Sequence[int]], multiple: int | None, side: str = "left"
             ) -> dict[str, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` of ``sequences`` padded on ``side`` to one width (the longest, rounded
        up to ``multiple`` when given), on the model's device."""
        batch = self.tokenizer.pad({"input_ids": list(sequences)}, padding=True, padding_side=side,
                                   return_tensors="pt", pad_to_multiple_of=multiple)
        if self.model.device.type != "cuda":
            return {k: v.to(self.model.device) for k, v in batch.items()}
        # from page-locked memory without waiting: a plain copy would first wait for the batch before this one
        return {k: v.pin_memory().to(self.model.device, non_blocking=True) for k, v in batch.items()}

    def replies(self, prompts: Sequence[str], texts: Sequence[str]) -> list[str]:
        """The judge's greedy replies to the rating prompt (at most ``max_new_tokens`` tokens each)."""
        out: list[str] = [""] * len(texts)
        config = neutral_generation_config(self.tokenizer, self.model, self.max_new_tokens)
        for rows, sequences in self._batches(prompts, texts, prefill="", desc="judge greedy"):
            batch = self._pad(sequences, self.pad_multiple)
            # grouped_query_sdpa: on CUDA, decoding steps on the attention that repeats bit for bit (and GQA under
            # the padding mask); a no-op elsewhere
            with torch.inference_mode(), neutral_model_defaults(self.model), grouped_query_sdpa(self.model):
                generated = self.model.generate(**batch, generation_config=config)
            decoded = self.tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
            for row, reply in zip(rows, decoded, strict=True):
                out[row] = reply
        return out

    def rate_greedy(self, prompts: Sequence[str], texts: Sequence[str]) -> list[float | None]:
        """Grade parsed from each greedy reply (None when the reply has no grade in 0..100)."""
        return [parse_grade(reply) for reply in self.replies(prompts, texts)]

    def grade_distribution(self, prompts: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """(n_texts, 101) probabilities of writing grade 0..100 after the prefill (rows sum to <= 1)."""
        return next(self.grade_distributions([(prompts, texts)]))

    def grade_distributions(self, groups: Iterable[tuple[Sequence[str], Sequence[str]]]) -> Iterator[np.ndarray]:
        """:meth:`grade_distribution` of each (prompts, texts) group, in order, the same numbers. On CUDA nothing
        waits for the device until a group's successor is queued behind it: each batch's numbers are copied back
        as soon as they are computed (ordered on the stream, a copy issued later would wait for the successor
        too), and ``groups`` is read one ahead, so the host tokenizes and pads a group while the device computes
        the one before (on one H200 that host work had left the device idle ~25 ms between batches of 16)."""
        pending: tuple[int, list] | None = None
        for prompts, texts in groups:
            queued = [(rows, *self._copied_back(self._batch_grade_distribution(sequences)))
                      for rows, sequences in self._batches(prompts, texts, prefill=self.trie.prefill,
                                                           desc="judge expected")]
            if pending is not None:
                yield self._collect(*pending)
            pending = (len(texts), queued)
        if pending is not None:
            yield self._collect(*pending)

    @staticmethod
    def _copied_back(distribution: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """``distribution`` on its way to host memory, and the event that says it has arrived (None off CUDA)."""
        if not distribution.is_cuda:
            return distribution, None
        host = distribution.to("cpu", non_blocking=True)  # page-locked: the copy is queued, nothing waits
        arrived = torch.cuda.Event()
        arrived.record()
        return host, arrived

    @staticmethod
    def _collect(n_texts: int, queued: list) -> np.ndarray:
        probs = np.zeros((n_texts, MAX_GRADE + 1))
        for rows, distribution, arrived in queued:
            if arrived is not None:
                arrived.synchronize()
            probs[rows] = distribution.numpy()
        return probs

    @property
    def head(self) -> tuple[int, ...]:
        """Token ids a rating prompt begins with whatever it rates: the chat up to where the rated prompt starts,
        less its last token (which may merge with what follows). :meth:`node_logits` checks each row."""
        if self._head is None:
            chat = self._chat(_PLACEHOLDER, _PLACEHOLDER)
            start = chat.find(_PLACEHOLDER)  # -1 where the template rewrites the prompt: no head then
            self._head = tuple(self.tokenizer.encode(chat[:start], add_special_tokens=False)[:-1]) if start > 0 else ()
        return self._head

    def _head_cache(self, n_rows: int) -> SharedHeadCache:
        """A key/value cache holding the head for ``n_rows`` rows (the head's forward runs once per judge)."""
        if self._head_kv is None:
            ids = torch.tensor([self.head], device=self.model.device)
            cache = self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
            self._head_kv = (torch.stack([layer.keys for layer in cache.layers]),
                             torch.stack([layer.values for layer in cache.layers]))
            for tensor in self._head_kv:  # fixed shapes: a compiled graph must not tie them to a batch's size
                torch._dynamo.mark_static(tensor)
        return SharedHeadCache(*self._head_kv, n_rows)

    @torch.inference_mode()
    def node_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """(batch, 1 + n_inner, vocab) next-token logits after each rating prompt and after each inner trie node.

        The trie's inner nodes ride along behind each row as extra tokens (one per node: its last token) under a
        tree attention mask: a node token sees its row and its own ancestors only, at the position it would have
        written right after the row. When every row begins with the judge's :attr:`head`, the head comes from a
        shared key/value cache and only the rest of each row (left-padded) is computed.
        """
        if self._compiled is not None and len(sequences) == 1:
            # A batch of one row (a group's remainder) would recompile the layers (~5 s on a GPU): Dynamo fixes a
            # dimension of size 1 in its graph. The row twice, the copy's logits dropped, runs the shared graph.
            return self.node_logits([sequences[0], sequences[0]])[:1]
        head = len(self.head) if all(len(s) > len(self.head) and tuple(s[:len(self.head)]) == self.head
                                     for s in sequences) else 0
        if self._splits and max(map(len, sequences)) > head + 1:
            return self._split_node_logits(sequences, head)
        batch = self._pad([s[head:] for s in sequences], None if self.round_attention else self.pad_multiple)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        n_rows, context_len = ids.shape
        device = ids.device
        tree_tokens = self._tree_tokens
        n_tree = tree_tokens.shape[0]
        context_positions = head + (mask.cumsum(-1) - 1).clamp(min=0)
        positions = torch.cat([context_positions, context_positions[:, -1:] + self._tree_depth], 1)
        key_ok = torch.cat([torch.ones(n_rows, head, dtype=torch.bool, device=device), mask.bool(),
                            torch.ones(n_rows, n_tree, dtype=torch.bool, device=device)], 1)
        wide = self.round_attention and getattr(self.model.config, "_attn_implementation", None) == "sdpa"
        attention = [grouped_query_prompts(self.model)] * self.grouped_query + [attention_at_mask_widths(self.model,
                                                                                                        wide)]
        return self._forward(attention, torch.cat([ids, tree_tokens.expand(n_rows, n_tree)], 1),
                             self._dense_mask(key_ok, head, context_len, wide), positions, head)

    def _forward(self, attention: Sequence[contextlib.AbstractContextManager], ids: torch.Tensor,
                 mask: torch.Tensor, positions: torch.Tensor, head: int) -> torch.Tensor:
        """The forward both layouts of :meth:`node_logits` end in: ``ids`` after the shared head's cache (when
        ``head``), under the compiled layers and the layout's ``attention`` switches; logits of the last
        1 + n_inner positions."""
        cache = self._head_cache(ids.shape[0]) if head else None  # the head's own forward runs eagerly, once
        with contextlib.ExitStack() as stack:
            if self._compiled is not None:
                stack.enter_context(self._compiled.active())
            for switch in attention:
                stack.enter_context(switch)
            return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                              use_cache=bool(head), logits_to_keep=1 + self._tree_tokens.shape[0]).logits

    def _split_node_logits(self, sequences: Sequence[Sequence[int]], head: int) -> torch.Tensor:
        """:meth:`node_logits` under ``causal_split_attention``: each row (less the shared head) is laid out as its
        context (its tokens but the last, padded on the right to the batch's longest; the last may stay in its
        place, unseen), then X = 1 + n_inner extra tokens: its last token (the trie's root) and the inner nodes. The
        context runs under a causal mask (its pads come after every real token); the extra tokens see the head,
        their row's real context, the root and their own ancestors (the mask this method builds), at the positions
        they have in :meth:`node_logits`."""
        # each row padded on the right; its last token stays in place too, where no kept query sees it (the causal
        # queries after it are pads, the extra ones' mask stops before it)
        batch = self._pad([s[head:] for s in sequences], None, side="right")
        ids, lengths = batch["input_ids"], batch["attention_mask"].sum(-1) - 1  # lengths: each row's context
        n_rows, width = ids.shape[0], ids.shape[1] - 1
        device = ids.device
        extra = self._extra_ancestors.shape[0]
        root = head + lengths[:, None]  # the root's position: right after the row's context
        positions = torch.cat([head + torch.arange(width, device=device).expand(n_rows, width), root,
                               root + self._tree_depth], 1)
        keys = rounded_width(head + width + extra)
        # (row, extra query, key) over keys [head | context | root, nodes | widening]
        allowed = torch.zeros(n_rows, extra, keys, dtype=torch.bool, device=device)
        allowed[:, :, :head] = True
        allowed[:, :, head:head + width] = (torch.arange(width, device=device) < lengths[:, None])[:, None, :]
        allowed[:, :, head + width:head + width + extra] = self._extra_ancestors
        additive = torch.zeros(n_rows, 1, extra, keys, dtype=self.model.dtype, device=device)
        additive.masked_fill_(~allowed[:, None], torch.finfo(self.model.dtype).min)
        roots = ids.gather(1, lengths[:, None])
        return self._forward([causal_split_attention(self.model),
                              last_layer_pruned(self.model, extra, self.prune_last_layer)],
                             torch.cat([ids[:, :width], roots, self._tree_tokens.expand(n_rows, extra - 1)], 1),
                             additive, positions, head)

    def _dense_mask(self, key_ok: torch.Tensor, head: int, context_len: int, wide: bool = False) -> torch.Tensor:
        """The tree mask as an additive float mask (batch, 1, query, key), understood by the sdpa and eager
        attention implementations. ``key_ok`` (batch, key): False at padding; keys are [head | context | tree].
        ``wide``: query and key widths rounded up (``mmw.engines.attention.rounded_width``) for
        ``attention_at_mask_widths``; the extra keys are hidden, the extra queries see the row (their outputs
        are dropped)."""
        device = key_ok.device
        n_tree = self._tree_tokens.shape[0]
        length = context_len + n_tree
        rows, cols = (rounded_width(length), rounded_width(head + length)) if wide else (length, head + length)
        # (query, key) over keys [head | context | tree nodes | widening]
        allowed = torch.zeros(rows, cols, dtype=torch.bool, device=device)
        allowed[length:] = True
        key_ok = torch.nn.functional.pad(key_ok, (0, cols - head - length), value=False)
        allowed[:, :head] = True
        causal = torch.ones(context_len, context_len, dtype=torch.bool, device=device).tril()
        allowed[:context_len, head:head + context_len] = causal
        allowed[context_len:length, head:head + context_len] = True
        allowed[context_len:length, head + context_len:head + length] = self._tree_ancestors
        allowed = allowed[None, None] & key_ok[:, None, None, :]  # (batch, 1, query, key)
        additive = torch.zeros(allowed.shape, dtype=self.model.dtype, device=device)
        additive.masked_fill_(~allowed, torch.finfo(self.model.dtype).min)
        return additive

    @torch.inference_mode()
    def grades_from_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(batch, 101) grade probabilities from :meth:`node_logits`' (batch, 1 + n_inner, vocab) logits.

        P(grade) = product of its path's token probabilities x P(the number stops there) at inner nodes.
        """
        logprobs = torch.log_softmax(logits.float(), -1)  # context end, then the inner nodes
        node_logprobs = {node: logprobs[:, i] for i, node in enumerate(((), *self.trie.inner))}
        stop = {node: torch.log1p(-lp.exp().index_select(-1, self._digit_ids).sum(-1).clamp(max=1 - 1e-7))
                for node, lp in node_logprobs.items() if node}
        grade_logprob = torch.stack([
            sum(node_logprobs[path[:k]][:, path[k]] for k in range(len(path))) + stop.get(path, 0.0)
            for path in self.trie.paths
        ], dim=-1)
        return grade_logprob.exp()

    def _batch_grade_distribution(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """(batch, 101) grade probabilities for one batch of rating prompts (token ids), in one forward pass."""
        return self.grades_from_logits(self.node_logits(sequences))

    def rate_expected(self, prompts: Sequence[str], texts: Sequence[str]) -> list[float | None]:
        """Expected grade under the judge's distribution over 0..100 (None when that mass is < ``min_mass``)."""
        return self.expected_ratings(self.grade_distribution(prompts, texts))

    def expected_ratings(self, probs: np.ndarray) -> list[float | None]:
        """Expected grades of (n, 101) grade probabilities (None where their mass is < ``min_mass``)."""
        mass = probs.sum(-1)
        expected = probs @ np.arange(MAX_GRADE + 1) / np.where(mass > 0, mass, 1.0)
        return [float(e) if m >= self.min_mass else None for e, m in zip(expected, mass, strict=True)]

    def rate(self, prompts: Sequence[str], texts: Sequence[str], modes: Sequence[str] = MODES) -> dict[str, list]:
        """``{mode: ratings}`` for each requested mode (``greedy``, ``expected``)."""
        for mode in modes:
            if mode not in MODES:
                raise SpecError("rate.mode", f"unknown mode {mode!r}", MODES)
        methods = {"greedy": self.rate_greedy, "expected": self.rate_expected}
        return {mode: methods[mode](prompts, texts) for mode in modes}


def shuffle_words(text: str, rng: np.random.Generator) -> str:
    """The words of ``text`` in a random order: same vocabulary and length, no coherence."""
    words = text.split()
    return " ".join(words[i] for i in rng.permutation(len(words)))


def paired_discrimination(original: Sequence[float | None], shuffled: Sequence[float | None], alpha: float) -> dict:
    """Ratings of texts vs the same texts broken: n_pairs (both rated), n_failed, means, the one-sided paired
    Wilcoxon signed-rank p-value (original > shuffled) and ``discriminates`` (p < alpha)."""
    pairs = [(a, b) for a, b in zip(original, shuffled, strict=True) if a is not None and b is not None]
    result: dict = {
        "n_pairs": len(pairs),
        "n_failed": sum(a is None or b is None for a, b in zip(original, shuffled, strict=True)),
        "mean_original": float(np.mean([a for a, _ in pairs])) if pairs else None,
        "mean_shuffled": float(np.mean([b for _, b in pairs])) if pairs else None,
        "pvalue": 1.0,
    }
    differences = [a - b for a, b in pairs]
    if any(d != 0 for d in differences):
        # One-sided: a useful judge rates the coherent text higher than its word salad.
        result["pvalue"] = float(stats.wilcoxon(differences, alternative="greater").pvalue)
    result["discriminates"] = result["pvalue"] < alpha
    return result


class Rater(Protocol):
    """Anything that rates like :meth:`Judge.rate` (a Judge, or ``mmw.judge.backends.CachedRater``)."""

    def rate(self, prompts: Sequence[str], texts: Sequence[str], modes: Sequence[str] = MODES) -> dict[str, list]:
        """``{mode: ratings}``."""


def judge_discrimination(
    judge: Rater, prompts: Sequence[str], texts: Sequence[str], seed: int, alpha: float = 0.05,
    modes: Sequence[str] = MODES,
) -> dict:
    """Can the judge tell texts from the same texts word-shuffled? Per mode (of ``modes``): mean ratings of both,
    a one-sided paired Wilcoxon signed-rank p-value, ``discriminates`` (p < alpha). ``best_mode``: the
    discriminating mode with the smaller p-value (None when none discriminates). ``original_ratings``:
    ``judge.rate(prompts, texts, modes)``.
    """
    rng = np.random.default_rng(seed)
    shuffled = [shuffle_words(t, rng) for t in texts]
    original_ratings = judge.rate(prompts, texts, modes)
    shuffled_ratings = judge.rate(prompts, shuffled, modes)
    report: dict = {mode: paired_discrimination(original_ratings[mode], shuffled_ratings[mode], alpha)
                    for mode in modes}
    candidates = [mode for mode in modes if report[mode]["discriminates"]]
    report["best_mode"] = min(candidates, key=lambda m: (report[m]["pvalue"], m != "expected"), default=None)
    report["n_texts"] = len(texts)
    report["original_ratings"] = original_ratings  # the texts' own ratings, so callers need not rate them again
    return report
