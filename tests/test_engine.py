"""The transformers engine and model loading.

Fast tests run a tiny randomly initialised Llama (real transformers code, 2 layers) with a word-level tokenizer;
heavy tests run the embedded SmolLM2-135M. Until the watermark core's processor is used here, the token chooser
is ``SeededSampler``: multinomial sampling with a uniform drawn per (row seed, step), so a row's tokens depend on
its seed and its logits only, never on the batch it shares.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from mmw.engines.generate import generate, generate_table, row_seed
from mmw.engines.models import compile_workers_up, load_model
from mmw.errors import SpecError
from mmw.inductor import inductor_options

WORDS = "the a cat dog sat ran on under mat tree red big small and then quickly slowly it was very".split()
SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]


class SeededSampler:
    """Chooses each row's token by inverse-CDF sampling of softmax(scores) with a per-(row seed, step) uniform;
    records entropy and spike entropy (z = 1) per step, like the watermark processor does."""

    def __init__(self, row_seeds: list[int]):
        self.seeds = row_seeds
        self.step = 0
        self.entropy: list[np.ndarray] = []
        self.spike: list[np.ndarray] = []
        self.scores: list[torch.Tensor] = []
        self.choices: list[list[int]] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.scores.append(scores.clone())
        probs = torch.softmax(scores.double(), -1)
        uniforms = torch.tensor(
            [np.random.Generator(np.random.Philox(key=s, counter=self.step)).random() for s in self.seeds],
            dtype=torch.float64,
        )
        cdf = probs.cumsum(-1)
        choice = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None]).clamp(max=scores.shape[1] - 1)
        self.entropy.append((-(probs * probs.clamp_min(1e-300).log()).sum(-1)).numpy())
        self.spike.append((probs / (1 + probs)).sum(-1).numpy())
        self.choices.append(choice[:, 0].tolist())
        self.step += 1
        return self.force(scores, choice)

    @staticmethod
    def force(scores: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, choice.to(scores.device), 0.0)

    def _mean(self, record: list[np.ndarray], lengths) -> np.ndarray:
        steps = np.stack(record, 1)
        return np.array([steps[i, :n].mean() if n else np.nan for i, n in enumerate(lengths)])

    def mean_entropy(self, lengths) -> np.ndarray:
        return self._mean(self.entropy, lengths)

    def mean_spike_entropy(self, lengths) -> np.ndarray:
        return self._mean(self.spike, lengths)


@pytest.fixture
def tiny(tiny_model):
    """The tiny model, run on one thread: a 32-wide model gains nothing from two, and on a busy machine the
    second OpenMP thread's spin-waits make each tiny matmul ~30x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_model
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model():
    """(tokenizer, model): word-level tokenizer + 2-layer random Llama; EOS is <|im_end|>, pad is <pad>."""
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=vocab["<|im_end|>"],
        pad_token_id=vocab["<pad>"], bos_token_id=None,
        initializer_range=0.3,  # peaky attention, so a wrong position or padding mask changes the tokens
    )
    model = LlamaForCausalLM(config).eval()
    return tokenizer, model


def tiny_chats(n: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(1)
    chats = [" ".join(["<|im_start|>", *rng.choice(WORDS, size=int(rng.integers(2, 12)))]) for _ in range(n)]
    return chats, [f"story-{i:03d}" for i in range(n)]


def test_same_seed_same_tokens_and_other_seed_other_tokens(tiny):
    tokenizer, model = tiny
    chats, ids = tiny_chats(5)
    first = generate(model, tokenizer, chats, SeededSampler, 12, 2, prompt_ids=ids, seed=7, progress=False)
    again = generate(model, tokenizer, chats, SeededSampler, 12, 2, prompt_ids=ids, seed=7, progress=False)
    other = generate(model, tokenizer, chats, SeededSampler, 12, 2, prompt_ids=ids, seed=8, progress=False)
    assert first.equals(again)
    assert first["tokens"].to_list() != other["tokens"].to_list()
    assert first["prompt_id"].to_list() == ids  # input order, though batches ran longest-first


def test_left_padded_batches_give_the_tokens_of_single_row_runs(tiny):
    tokenizer, model = tiny
    chats, ids = tiny_chats(6)  # prompt lengths 2..11 words, so most rows are padded in a batch of 6
    batched = generate(model, tokenizer, chats, SeededSampler, 16, 6, prompt_ids=ids, progress=False)
    single = generate(model, tokenizer, chats, SeededSampler, 16, 1, prompt_ids=ids, progress=False)
    assert batched["tokens"].to_list() == single["tokens"].to_list()
    np.testing.assert_allclose(batched["mean_entropy"].to_numpy(), single["mean_entropy"].to_numpy(), rtol=1e-5)


def test_the_preallocated_cache_gives_the_tokens_of_the_growing_cache(tiny, monkeypatch):
    """The static KV cache used on CUDA (same shapes every step) is the same attention as transformers' growing
    cache: forced onto the CPU, a left-padded batch generates the same tokens and entropies with either."""
    import mmw.engines.generate as engine

    tokenizer, model = tiny
    chats, ids = tiny_chats(6)
    monkeypatch.setattr(engine, "CACHE_IMPLEMENTATION", None)
    growing = generate(model, tokenizer, chats, SeededSampler, 16, 6, prompt_ids=ids, progress=False)
    monkeypatch.setattr(engine, "CACHE_IMPLEMENTATION", "static")
    monkeypatch.setattr(engine, "CACHE_DEVICES", ("cpu",))
    static = generate(model, tokenizer, chats, SeededSampler, 16, 6, prompt_ids=ids, progress=False)
    assert static["tokens"].to_list() == growing["tokens"].to_list()
    np.testing.assert_allclose(static["mean_entropy"].to_numpy(), growing["mean_entropy"].to_numpy(), rtol=1e-5)


class StopAt(SeededSampler):
    """Samples like SeededSampler but emits EOS at a chosen step per row seed (never before it)."""

    eos_id: int
    stops: dict[int, int]

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.eos_id] = float("-inf")
        step = self.step
        chosen = super().__call__(input_ids, scores)
        for row, seed in enumerate(self.seeds):
            if self.stops.get(seed) == step:
                chosen[row] = float("-inf")
                chosen[row, self.eos_id] = 0.0
        return chosen


def test_generation_stops_at_eos_and_excludes_it(tiny):
    tokenizer, model = tiny
    chats, ids = tiny_chats(3)
    seed = 3
    stops = {row_seed(seed, ids[0]): 0, row_seed(seed, ids[1]): 5}  # row 2 never stops

    def factory(seeds):
        processor = StopAt(seeds)
        processor.eos_id, processor.stops = tokenizer.eos_token_id, stops
        return processor

    out = generate(model, tokenizer, chats, factory, 9, 3, prompt_ids=ids, seed=seed, progress=False)
    assert out["n_tokens"].to_list() == [0, 5, 9]
    assert [len(t) for t in out["tokens"].to_list()] == [0, 5, 9]
    assert all(tokenizer.eos_token_id not in t for t in out["tokens"].to_list())
    assert out["text"][0] == "" and "<|im_end|>" not in "".join(out["text"].to_list())
    assert out["text"][1] == tokenizer.decode(out["tokens"][1].to_list())
    # A row without tokens has no entropy; the others average their own steps only.
    assert out["mean_entropy"][0] is None and out["mean_entropy"][1] > 0


def test_the_models_own_generation_defaults_do_not_touch_the_logits(tiny):
    tokenizer, model = tiny
    chats, ids = tiny_chats(1)
    suppressed = tokenizer.convert_tokens_to_ids("cat")
    saved = model.generation_config
    model.generation_config = saved.__class__(
        repetition_penalty=3.0, suppress_tokens=[suppressed], min_new_tokens=5, no_repeat_ngram_size=1,
        temperature=0.1, top_k=2, do_sample=True,
    )
    seen = []

    def factory(seeds):
        seen.append(SeededSampler(seeds))
        return seen[-1]

    try:
        out = generate(model, tokenizer, chats, factory, 6, 1, prompt_ids=ids, progress=False)
    finally:
        model.generation_config = saved
    input_ids = tokenizer(chats, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        raw = model(input_ids=input_ids).logits[:, -1]
    torch.testing.assert_close(seen[0].scores[0], raw, rtol=1e-5, atol=1e-5)
    assert model.generation_config is saved  # restored after the call
    # Greedy decoding took exactly the processor's choices, whatever the model's defaults would have done.
    assert out["tokens"][0].to_list() == [c[0] for c in seen[0].choices[: out["n_tokens"][0]]]


def test_interrupted_run_resumes_without_regenerating_finished_rows(tiny, tmp_path):
    tokenizer, model = tiny
    chats, ids = tiny_chats(7)
    prompts = pl.DataFrame({"prompt_id": ids, "task": "story", "prompt": [f"p{i}" for i in range(7)], "chat": chats})
    out = tmp_path / "gen" / "watermarked.parquet"
    requested: list[int] = []

    def counting(seeds):
        requested.extend(seeds)
        return SeededSampler(seeds)

    def crash_after_first_batch(rows_done):
        raise KeyboardInterrupt(f"simulated interruption after {rows_done} rows")

    with pytest.raises(KeyboardInterrupt):
        generate_table(model, tokenizer, prompts, out, counting, 10, 3, seed=1, progress=False,
                       on_batch_done=crash_after_first_batch)
    parts = out.with_name(out.name + ".parts")
    assert not out.exists() and len(list(parts.glob("*.parquet"))) == 1
    first_batch = set(requested)
    assert len(first_batch) == 3

    requested.clear()
    resumed = generate_table(model, tokenizer, prompts, out, counting, 10, 3, seed=1, progress=False)
    assert len(requested) == 4 and not first_batch & set(requested)  # only the 4 unfinished rows ran
    assert not parts.exists()
    assert pl.read_parquet(out).equals(resumed)
    assert resumed.columns == ["prompt_id", "task", "prompt", "text", "tokens", "n_tokens", "mean_entropy",
                               "mean_spike_entropy"]

    uninterrupted = generate_table(model, tokenizer, prompts, tmp_path / "fresh.parquet", SeededSampler, 10, 3,
                                   seed=1, progress=False)
    assert resumed.equals(uninterrupted)


def test_parts_of_a_run_with_other_settings_are_not_reused(tiny, tmp_path):
    tokenizer, model = tiny
    chats, ids = tiny_chats(4)
    parts = tmp_path / "parts"
    generate(model, tokenizer, chats, SeededSampler, 8, 2, prompt_ids=ids, parts_dir=parts, fingerprint="delta=1",
             progress=False)
    requested: list[int] = []

    def counting(seeds):
        requested.extend(seeds)
        return SeededSampler(seeds)

    generate(model, tokenizer, chats, counting, 8, 2, prompt_ids=ids, parts_dir=parts, fingerprint="delta=2",
             progress=False)
    assert len(requested) == 4
    requested.clear()
    generate(model, tokenizer, chats, counting, 8, 2, prompt_ids=ids, parts_dir=parts, fingerprint="delta=2",
             progress=False)
    assert requested == []


def test_bad_engine_arguments_name_the_parameter(tiny):
    tokenizer, model = tiny
    chats, ids = tiny_chats(2)
    with pytest.raises(ValueError, match="model.batch_size"):
        generate(model, tokenizer, chats, SeededSampler, 4, 0, prompt_ids=ids, progress=False)
    with pytest.raises(ValueError, match="prompt_ids"):
        generate(model, tokenizer, chats, SeededSampler, 4, 1, prompt_ids=ids[:1], progress=False)


class _Ready:
    """A stand-in for the future torch sets when the compile workers are asked for."""

    def __init__(self, events: list[str], error: Exception | None = None) -> None:
        self.events, self.error = events, error

    def done(self) -> bool:
        return False

    def result(self, timeout: float | None = None):
        self.events.append(f"wait {timeout:g}")
        if self.error is not None:
            raise self.error
        return "ready"


def _fake_workers(monkeypatch, events: list[str], error: Exception | None = None, off: bool = False) -> None:
    from torch._inductor import async_compile

    monkeypatch.setattr(async_compile.AsyncCompile, "_ready_future", None)

    def warm() -> None:
        events.append("start")
        if not off:  # TORCH_WARM_POOL=0 / one compile thread: torch returns without asking for workers
            async_compile.AsyncCompile._ready_future = _Ready(events, error)

    monkeypatch.setattr(async_compile, "maybe_warm_pool", warm)


def test_compile_workers_start_before_the_load_and_are_waited_for_after_it_on_cuda_only(monkeypatch):
    """On CUDA the workers start as the block (a model's load) begins and are waited for as it ends, so every kernel
    compiled afterwards compiles in a worker; on a CPU, or when not enabled, nothing starts and nothing waits."""
    events: list[str] = []
    _fake_workers(monkeypatch, events)
    with compile_workers_up("cpu"):
        events.append("load")
    with compile_workers_up("cuda:0", enabled=False):
        events.append("load")
    assert events == ["load", "load"]
    events.clear()
    with compile_workers_up("cuda:0"):
        events.append("load")
    assert events == ["start", "load", "wait 60"]


@pytest.mark.parametrize(("switches", "compiles"), [
    ({}, True),
    ({"compile_step": False}, True),  # the fused layers and flex attention in mmw's loop
    ({"compile_step": False, "fuse_layers": False}, True),  # flex attention alone
    ({"compile_step": False, "fuse_layers": False, "decode_attention": "efficient"}, False),
    ({"compile_step": False, "static_decode": False}, False),  # transformers' generate, the step eager
    ({"static_decode": False}, True),
])
def test_generation_waits_for_compile_workers_only_where_a_switch_compiles(switches, compiles):
    from mmw.params import EngineParams

    assert EngineParams(**switches).compiles_generation is compiles


def test_compile_workers_that_are_off_or_fail_leave_the_stage_going(monkeypatch, caplog):
    """Workers turned off are not waited for; workers that do not come up are logged, not raised; a load that fails
    propagates without a wait."""
    events: list[str] = []
    _fake_workers(monkeypatch, events, off=True)
    with compile_workers_up("cuda"):
        events.append("load")
    assert events == ["start", "load"]
    events.clear()
    _fake_workers(monkeypatch, events, error=TimeoutError("slow"))
    with caplog.at_level("WARNING", logger="mmw.engines.models"), compile_workers_up("cuda"):
        events.append("load")
    assert events == ["start", "load", "wait 60"]
    assert "compile workers did not come up (TimeoutError: slow)" in caplog.text
    events.clear()
    _fake_workers(monkeypatch, events)
    with pytest.raises(SpecError, match="model.name"), compile_workers_up("cuda"):
        raise SpecError("model.name", "no such model", "a model folder")
    assert events == ["start"]


def test_inductor_options_keep_the_mode_and_add_the_deterministic_mode():
    assert inductor_options() == {"deterministic": True}
    assert inductor_options("default") == {"deterministic": True}
    assert inductor_options("reduce-overhead") == {"triton.cudagraphs": True, "deterministic": True}
    assert inductor_options("max-autotune")["max_autotune"] is True
    assert inductor_options(time_pointwise=False) == {"deterministic": True, "triton.autotune_pointwise": False}


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on the CPU needs a C++ compiler")
def test_a_compile_with_mmws_options_generates_code_in_deterministic_mode_after_other_compiles(one_thread):
    """Inductor's deterministic mode (reduction settings by rule, not timed on the device, so fresh compiler caches
    compile one arithmetic) must reach the code generation of every graph mmw compiles, the second and later ones
    of a process included: a global setting can be written back by Dynamo after a traced frame, so mmw passes the
    mode with each compile. Read inside Inductor's compilation by a post-grad pass."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    seen: list[bool] = []

    class Probe(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            seen.append(torch._inductor.config.deterministic)

        def uuid(self) -> None:  # not cacheable: every call compiles
            return None

    x = torch.arange(8.0)
    torch._dynamo.reset()
    with torch._inductor.config.patch(deterministic=True):  # as TORCHINDUCTOR_DETERMINISTIC=1 sets it
        torch.compile(lambda t: t * 2)(x)  # some other compile first
        for scale in (3.0, 4.0):
            out = torch.compile(lambda t: t * scale + 1, dynamic=False,  # the judge's options: the same mode
                                options={**inductor_options(time_pointwise=scale == 4.0),
                                         "post_grad_custom_post_pass": Probe()})(x)
            assert torch.equal(out, x * scale + 1)
    assert seen == [True, True]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("/nonexistent/model-folder", "model.name: path '/nonexistent/model-folder' does not exist"),
        ("./missing.gguf", "model.name: GGUF file './missing.gguf' does not exist"),
        ("embedded:gpt-9", "model.name: unknown embedded model 'embedded:gpt-9'; allowed: embedded:smollm2-135m"),
    ],
)
def test_load_model_rejects_bad_specs_naming_model_name(spec, message):
    with pytest.raises(SpecError) as info:
        load_model(spec)
    assert str(info.value).startswith(message)


def test_load_model_rejects_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(SpecError, match="model.name: folder .* has no config.json"):
        load_model(str(tmp_path))


def test_load_model_reads_a_local_hf_folder(tiny, tmp_path):
    tokenizer, model = tiny
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    loaded_tokenizer, loaded = load_model(str(tmp_path), device="cpu")
    assert loaded_tokenizer.padding_side == "left" and loaded_tokenizer.pad_token == "<pad>"
    ids = torch.tensor([[4, 5, 6]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_load_tokenizer_gives_load_models_tokenizer_and_vocabulary_without_weights(tiny, tmp_path):
    from transformers import AutoTokenizer

    from mmw.engines.models import load_tokenizer, shared_loads
    from mmw.stages.common import generator_vocab_size

    tokenizer, model = tiny
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    full_tokenizer, full = load_model(str(tmp_path), device="cpu")
    light_tokenizer, config = load_tokenizer(str(tmp_path))
    auto = AutoTokenizer.from_pretrained(tmp_path)  # what both replace
    for loaded in (light_tokenizer, full_tokenizer):
        assert type(loaded) is type(auto) and loaded.padding_side == "left" and loaded.pad_token == auto.pad_token
        assert loaded("a b c")["input_ids"] == auto("a b c")["input_ids"]
    assert generator_vocab_size(light_tokenizer, config) == generator_vocab_size(full_tokenizer, full)
    with pytest.raises(SpecError, match="model.name"):
        load_tokenizer(str(tmp_path / "absent"))
    # In a warm process the tokenizing stages and the model's stage share one tokenizer (loaded once); outside it
    # every call loads its own.
    with shared_loads():
        first, _ = load_tokenizer(str(tmp_path))
        assert load_model(str(tmp_path), device="cpu")[0] is first
    assert load_model(str(tmp_path), device="cpu")[0] is not load_tokenizer(str(tmp_path))[0]


def test_the_light_tokenizer_path_is_taken_only_for_the_generic_fast_tokenizer(tiny, tmp_path):
    """A folder with the generic fast tokenizer and a top-level vocab_size is read without the Auto classes; a
    tokenizer with a class of its own, or a config without vocab_size, goes through AutoTokenizer/AutoConfig."""
    import json

    from mmw.engines.models import _light_tokenizer

    tokenizer, model = tiny
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    light = _light_tokenizer(str(tmp_path))
    assert light is not None and light[1].vocab_size == model.config.vocab_size
    assert light[0]("a b c")["input_ids"] == tokenizer("a b c")["input_ids"]
    for name, edit in (("tokenizer_config.json", {"tokenizer_class": "LlamaTokenizer"}),
                       ("config.json", {"vocab_size": None})):
        other = tmp_path / name.split(".")[0]
        shutil.copytree(tmp_path, other, ignore=shutil.ignore_patterns("*config*", "model*"))
        for kept in ("tokenizer_config.json", "config.json"):
            content = json.loads((tmp_path / kept).read_text())
            (other / kept).write_text(json.dumps({**content, **edit} if kept == name else content))
        assert _light_tokenizer(str(other)) is None
    assert _light_tokenizer(str(tmp_path / "absent")) is None


def test_the_light_tokenizer_builds_from_its_files_what_from_pretrained_builds(tiny, tmp_path):
    """The generic fast tokenizer is built from tokenizer.json and tokenizer_config.json directly (from_pretrained
    deep-copies every added token: seconds for a vocabulary widened by added tokens): the same backend, special
    tokens, settings, chat template, ids, decodes and padding; a folder with another file from_pretrained reads
    (or its added tokens listed in tokenizer_config.json) goes through from_pretrained."""
    import json

    from mmw.engines.models import _direct_tokenizer, _light_tokenizer

    tokenizer, model = tiny
    widened = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()),
                                      unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>",
                                      additional_special_tokens=["<|im_start|>"])
    widened.add_tokens([f"<x{i}>" for i in range(50)])
    widened.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")
    reference = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    light = _light_tokenizer(str(tmp_path))[0]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    direct = _direct_tokenizer(PreTrainedTokenizerFast, str(tmp_path), config)
    assert direct is not None and type(direct) is type(reference)
    assert direct.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()
    text = "<|im_start|>the cat <x3> sat<x49>on the mat <|im_end|> zebra"
    chat = [{"role": "system", "content": "rate"}, {"role": "user", "content": "the dog ran"}]
    for built in (direct, light):
        assert len(built) == len(reference) == len(WORDS) + len(SPECIALS) + 50
        for attribute in ("all_special_tokens", "all_special_ids", "pad_token", "pad_token_id", "eos_token_id",
                          "bos_token_id", "unk_token_id", "model_max_length", "truncation_side",
                          "clean_up_tokenization_spaces", "chat_template", "name_or_path"):
            assert getattr(built, attribute) == getattr(reference, attribute), attribute
        assert built.get_added_vocab() == reference.get_added_vocab()
        assert built(text)["input_ids"] == reference(text)["input_ids"]
        ids = reference(text)["input_ids"]
        assert built.decode(ids) == reference.decode(ids)
        assert built.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
        assert built.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
            reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        padded, expected = (t.pad({"input_ids": [[4, 5, 6], [7]]}, padding=True, padding_side="left",
                                  return_tensors="pt") for t in (built, reference))
        assert all(torch.equal(padded[key], expected[key]) for key in expected)
    # anything else from_pretrained would read: the long way
    (tmp_path / "special_tokens_map.json").write_text("{}")
    assert _direct_tokenizer(PreTrainedTokenizerFast, str(tmp_path), config) is None
    (tmp_path / "special_tokens_map.json").unlink()
    assert _direct_tokenizer(PreTrainedTokenizerFast, str(tmp_path), {**config, "added_tokens_decoder": {}}) is None
    assert _direct_tokenizer(PreTrainedTokenizerFast, str(tmp_path), {**config, "chat_template": "x"}) is None


@pytest.mark.heavy
def test_light_tokenizer_of_the_embedded_generator_is_load_models_without_torch(embedded):
    """The prompts and detect stages (and load_model) read the generator's tokenizer without
    AutoTokenizer/AutoConfig: same class, same ids, chat renderings and decodes as AutoTokenizer's on every default
    prompt, and torch stays unimported in that process."""
    import subprocess
    import sys

    from mmw.engines.models import load_tokenizer
    from mmw.tasks import build_prompts, render_chat

    from transformers import AutoTokenizer

    from mmw.engines.models import _padding_left, default_cache_dir, resolve_source

    _, model = embedded
    tokenizer = _padding_left(AutoTokenizer.from_pretrained(resolve_source("embedded:smollm2-135m",
                                                                           default_cache_dir())))
    light, config = load_tokenizer("embedded:smollm2-135m")
    assert type(light) is type(tokenizer) and config.vocab_size == model.config.vocab_size
    assert (light.padding_side, light.pad_token_id, light.eos_token_id, light.bos_token_id) == \
        (tokenizer.padding_side, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
    prompts = build_prompts(["book_report", "story", "fake_news"], 8)["prompt"].to_list()  # the default board
    chats = render_chat(tokenizer, prompts)
    assert render_chat(light, prompts) == chats
    ids = tokenizer(chats, add_special_tokens=False)["input_ids"]
    assert light(chats, add_special_tokens=False)["input_ids"] == ids
    assert light.batch_decode(ids, skip_special_tokens=True) == tokenizer.batch_decode(ids, skip_special_tokens=True)
    probe = ("import sys; from mmw.engines.models import load_tokenizer; load_tokenizer('embedded:smollm2-135m'); "
             "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_fast_dtype_is_bf16_only_where_the_cpu_multiplies_bf16_natively(tmp_path, monkeypatch):
    from mmw.engines import models

    with_bf16, without = tmp_path / "bf16", tmp_path / "plain"
    with_bf16.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    without.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bitalg\n")
    assert models.native_bf16_cpu(with_bf16) and not models.native_bf16_cpu(without)
    assert not models.native_bf16_cpu(tmp_path / "absent")
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(models, "native_bf16_cpu", lambda native=native: native)
        assert models.resolve_dtype("fast", torch.device("cpu")) == expected
        assert models.resolve_dtype("fast", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(SpecError, match="fast"):
        models.resolve_dtype("fastest", torch.device("cpu"))


def _part_packages(root, name: str, chunks: list[bytes]) -> None:
    """Real importable packages ``<name>{i}`` holding ``data/part{i:02d}.bin``, the way the model parts ship."""
    for i, chunk in enumerate(chunks, start=1):
        package = root / f"{name}{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)


@pytest.mark.parametrize("pinned_right", [True, False])
def test_a_model_in_parts_is_assembled_once_and_checked(tmp_path, monkeypatch, pinned_right):
    import hashlib
    import importlib

    from mmw.engines import models

    rng = np.random.default_rng(5)
    chunks = [rng.bytes(int(n)) for n in rng.integers(1, 3 << 20, 3)]
    _part_packages(tmp_path / "site", "mmwtestpart", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    pinned = hashlib.sha256(whole if pinned_right else whole[::-1]).hexdigest()
    monkeypatch.setitem(models.EMBEDDED_MODELS, "parts-test", models.EmbeddedModel(
        "mmw-test-part{i}", "mmwtestpart{i}", "assembled.gguf", "1", parts=3, sha256=pinned))
    cache = tmp_path / "cache"
    if not pinned_right:
        with pytest.raises(SpecError, match="model.name: the parts of embedded:parts-test assemble to sha256"):
            models.embedded_gguf_path("parts-test", cache)
        assert not any((cache / "gguf").iterdir())  # nothing half-written or unverified is left to be loaded
        return
    path = models.embedded_gguf_path("parts-test", cache)
    assert path.read_bytes() == whole
    stamp = path.stat().st_mtime_ns
    assert models.embedded_gguf_path("parts-test", cache) == path and path.stat().st_mtime_ns == stamp


def test_a_model_with_missing_parts_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib

    from mmw.engines import models

    _part_packages(tmp_path / "site", "mmwtestgap", [b"a", b"b"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setitem(models.EMBEDDED_MODELS, "gap-test", models.EmbeddedModel(
        "mmw-test-gap{i}", "mmwtestgap{i}", "gap.gguf", "1", parts=3, sha256="0" * 64))
    with pytest.raises(SpecError, match=r"model.name: embedded:gap-test is not installed \(1 package\(s\) missing\)"):
        models.embedded_files("gap-test")


@pytest.fixture(scope="module")
def embedded():
    return load_model("embedded:smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def direct_gguf():
    """transformers' own load of the embedded GGUF (dequantized to float32, ~20-30 s on 2 cores): the reference of
    both conversion tests, loaded once."""
    from mmw.engines.models import embedded_gguf_path

    gguf = embedded_gguf_path("smollm2-135m")
    return gguf, AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


@pytest.mark.heavy
def test_cached_hf_folder_equals_the_gguf_model(embedded, direct_gguf):
    tokenizer, model = embedded
    gguf, direct = direct_gguf
    direct_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "<|im_start|>user\nWrite a story about a lighthouse.<|im_end|>\n<|im_start|>assistant\n"
    ids = direct_tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"].equal(ids)
    with torch.inference_mode():
        assert model(input_ids=ids).logits.equal(direct(input_ids=ids).logits)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None


@pytest.mark.heavy
def test_conversion_into_an_empty_cache_keeps_every_weight(tmp_path, direct_gguf, monkeypatch):
    """The one-time GGUF -> HF folder conversion (built on the meta device, tensors assigned, not copied, the file
    parsed once for config, tokenizer and weights) stores exactly the dequantized weights: every tensor equal to
    transformers' own GGUF load, tied head included."""
    import gguf as gguf_py

    from mmw.engines.models import resolve_source

    parsed, parse = [], gguf_py.GGUFReader.__init__

    def counted_parse(self, *args, **kwargs):
        parsed.append(args)
        parse(self, *args, **kwargs)

    monkeypatch.setattr(gguf_py.GGUFReader, "__init__", counted_parse)
    reader_class = gguf_py.GGUFReader
    folder = Path(resolve_source("embedded:smollm2-135m", tmp_path))
    assert len(parsed) == 1 and gguf_py.GGUFReader is reader_class, parsed
    assert folder.parent == tmp_path / "models" and (folder / "config.json").is_file()
    _, direct = direct_gguf
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected, stored = direct.state_dict(), loaded.state_dict()
    assert expected.keys() == stored.keys()
    assert all(expected[name].equal(stored[name]) for name in expected)
    assert loaded.get_output_embeddings().weight.equal(direct.get_output_embeddings().weight)
    assert not hasattr(loaded.config, "quantization_config")
    ids = torch.tensor([[1, 504, 3058, 314, 253, 1345]])
    with torch.inference_mode():
        assert loaded(input_ids=ids).logits.equal(direct(input_ids=ids).logits)


def test_a_model_files_digest_is_remembered_until_the_file_changes(tmp_path):
    """The GGUF's sha256 names its converted folder; a stage reads it back from the cache instead of hashing the
    file again, and a rewritten file (new size or times) is hashed afresh."""
    import hashlib

    from mmw.engines.models import _file_digest

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    cache = tmp_path / "cache"
    first = _file_digest(model, cache)
    assert first == hashlib.sha256(model.read_bytes()).hexdigest()
    (stamp,) = (cache / "models" / ".digests").iterdir()
    # The stamp is what a second load reads: a forged digest under the same identity comes back unhashed.
    identity = stamp.read_text().rsplit(" ", 1)[0]
    stamp.write_text(f"{identity} {'0' * 64}\n")
    assert _file_digest(model, cache) == "0" * 64
    model.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 64)  # same size, new content and times
    os.utime(model, ns=(model.stat().st_mtime_ns + 10**9,) * 2)  # times a clock tick apart, even on a coarse clock
    assert _file_digest(model, cache) == hashlib.sha256(model.read_bytes()).hexdigest() != first
    stamp.write_text("garbage")
    assert _file_digest(model, cache) == hashlib.sha256(model.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def embedded_chats(embedded):
    from mmw.tasks import build_prompts, render_chat

    prompts = build_prompts(["book_report", "story", "fake_news"], 2)
    return render_chat(embedded[0], prompts["prompt"].to_list()), prompts["prompt_id"].to_list()


@pytest.mark.heavy
def test_embedded_model_generation_is_deterministic(embedded, embedded_chats):
    tokenizer, model = embedded
    chats, ids = embedded_chats
    first = generate(model, tokenizer, chats, SeededSampler, 24, 3, prompt_ids=ids, seed=5, progress=False)
    again = generate(model, tokenizer, chats, SeededSampler, 24, 3, prompt_ids=ids, seed=5, progress=False)
    assert first.equals(again)
    assert (first["n_tokens"] > 0).all() and first["text"].str.len_chars().min() > 20


@pytest.mark.heavy
def test_embedded_model_left_padding_matches_single_rows(embedded, embedded_chats):
    """Padded and unpadded rows run different matmul shapes, so logits differ by float rounding (~3e-5 here).
    What holds exactly enough to test: the next-token distributions agree to a total variation far below any
    real masking/position bug (which shifts them by >1e-2). Sampled tokens then agree unless a uniform falls
    within ~1e-6 of a CDF boundary (measured: one flip in ~600 sampled steps), so the token comparison is kept
    short."""
    tokenizer, model = embedded
    chats, ids = embedded_chats
    batched = generate(model, tokenizer, chats, SeededSampler, 16, 6, prompt_ids=ids, progress=False)
    encoded = tokenizer(chats, add_special_tokens=False)["input_ids"]
    full = [prompt + generated for prompt, generated in zip(encoded, batched["tokens"].to_list(), strict=True)]
    padded = tokenizer.pad({"input_ids": full}, padding=True, return_tensors="pt")
    assert (padded["attention_mask"] == 0).any()
    positions = (padded["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        batch_probs = torch.softmax(model(**padded, position_ids=positions).logits.double(), -1)
        for row, ids_row in enumerate(full):
            single_probs = torch.softmax(model(input_ids=torch.tensor([ids_row])).logits.double(), -1)[0]
            variation = (batch_probs[row, -len(ids_row):] - single_probs).abs().sum(-1)
            assert variation.max() < 1e-4
    for row in range(2):
        single = generate(model, tokenizer, [chats[row]], SeededSampler, 16, 1, prompt_ids=[ids[row]],
                          progress=False)
        assert single["tokens"][0].to_list() == batched["tokens"][row].to_list()


# ---------------------------------------------------------------------------------------------- the real processor
EXTRA_ROWS = 40  # output rows past the tokenizer, as models pad their embedding matrix (e.g. to a multiple of 64)


@pytest.fixture(scope="module")
def padded_vocab_model(tiny_model):
    """The tiny tokenizer with a random Llama whose output layer has EXTRA_ROWS more rows than the tokenizer has
    ids. Those rows get large weights, so any sampler that looks past the tokenizer picks them most of the time."""
    tokenizer, small = tiny_model
    torch.manual_seed(1)
    config = LlamaConfig(**{**small.config.to_dict(), "vocab_size": len(tokenizer) + EXTRA_ROWS})
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[len(tokenizer):] *= 20
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0  # logit 0: rows run long enough to carry a watermark
    return tokenizer, model


@pytest.mark.parametrize("params", [
    dict(sampler="exponential", randomness="window", window=1, score="sum"),
    dict(sampler="distribution_shift", randomness="window", window=2, delta=4.0, score="sum"),
    dict(sampler="binary", randomness="fixed", key_length=8, score="align"),
], ids=lambda p: p["sampler"])
def test_real_processor_in_hf_generate_with_left_padding_and_padded_vocab(padded_vocab_model, params):
    """The watermark processor inside transformers' generate: left-padded batches give each row the tokens of its
    single-row run, no id past the tokenizer is ever produced although the model favours them, and the
    generations carry the watermark (detected under the key, not under another key)."""
    from mmw.watermark.detector import Detector
    from mmw.watermark.prf import key_from_string
    from mmw.watermark.processor import WatermarkProcessor
    from mmw.watermark.scheme import SchemeSpec
    from mmw.stages.common import generator_vocab_size

    tokenizer, model = padded_vocab_model
    vocab = generator_vocab_size(tokenizer, model)
    assert vocab == len(tokenizer) < model.config.vocab_size
    spec = SchemeSpec.from_params({**params, "alpha": 0.05, **({"trials": 99} if params["score"] != "sum" else {})})
    key = key_from_string("engine-test-key-0123")

    def factory(seeds):
        return WatermarkProcessor(spec, key, vocab, seeds, 1.0)

    chats, ids = tiny_chats(6)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batched = generate(model, tokenizer, chats, factory, 24, 6, prompt_ids=ids, progress=False)
        single = generate(model, tokenizer, chats, factory, 24, 1, prompt_ids=ids, progress=False)
        plain = generate(model, tokenizer, chats, lambda s: WatermarkProcessor(None, None, model.config.vocab_size,
                                                                               s, 1.0), 24, 6, prompt_ids=ids,
                         progress=False)
    finally:
        torch.set_num_threads(threads)
    assert batched["tokens"].to_list() == single["tokens"].to_list()
    tokens = [np.array(t, dtype=np.int64) for t in batched["tokens"].to_list()]
    assert sum(len(t) for t in tokens) >= 6 * 12, [len(t) for t in tokens]
    assert max(int(t.max()) for t in tokens) < vocab
    # The same model sampled over all its rows does emit the padded ids: the bound above is the processor's doing.
    assert any(int(np.max(t, initial=0)) >= vocab for t in plain["tokens"].to_list())
    marked = Detector(spec, key, vocab).detect(tokens)
    other = Detector(spec, key_from_string("another-key-0123456"), vocab).detect(tokens)
    assert np.mean([r.detected for r in marked]) >= 0.5, [round(r.pvalue, 4) for r in marked]
    assert np.mean([r.pvalue for r in marked]) < np.mean([r.pvalue for r in other])
