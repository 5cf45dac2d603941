"""mmw.engines.graph_decode: our decode loop over the static cache computes what transformers' ``generate`` does.

On the CPU the loop's step runs eagerly (the code a CUDA graph records on a GPU); with the static cache enabled on
the CPU for both sides, the tokens and the recorded entropies must be identical to ``generate``'s, for plain
sampling, a window scheme and the tournament (whose step keeps a seed history), on left-padded batches whose
rows end at different steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmw.watermark import prf
from mmw.engines import generate as engine
from mmw.engines.generate import generate_batch
from mmw.params import EngineParams
from mmw.watermark.processor import WatermarkProcessor
from mmw.watermark.scheme import SchemeSpec
from test_ahead import _board as board_file
from test_engine import tiny, tiny_chats, tiny_model  # noqa: F401 - fixtures

KEY = prf.key_from_string("graph decode tests")
SPECS = {
    "plain": None,
    "c4": {"sampler": "distribution_shift", "randomness": "window", "window": 1, "delta": 2.0, "score": "sum"},
    "tournament": {"sampler": "tournament", "randomness": "window", "window": 2, "score": "sum"},
    "c1-masked": {"sampler": "exponential", "randomness": "window", "window": 1, "score": "sum",
                  "mask_repeated": True},
}


def run(tokenizer, model, chats, spec, static: bool, monkeypatch, max_new_tokens=24):
    monkeypatch.setattr(engine, "CACHE_DEVICES", ("cpu", "cuda"))
    settings = EngineParams(static_decode=static)  # params engine.static_decode
    encoded = tokenizer(chats, add_special_tokens=False)["input_ids"]
    seeds = [engine.row_seed(7, f"r{i}") for i in range(len(chats))]
    processor = WatermarkProcessor(SchemeSpec.from_params(spec) if spec else None, KEY, model.config.vocab_size,
                                   seeds, 1.0, compiled=False)
    assert engine.use_static_decode(model, processor, max(map(len, encoded)), settings) == static
    return generate_batch(model, tokenizer, encoded, processor, max_new_tokens, settings)


@pytest.mark.parametrize("name", list(SPECS))
def test_static_decode_matches_generate(tiny, monkeypatch, name):
    tokenizer, model = tiny
    chats, _ = tiny_chats(6)
    chats = [c + " the" * 3 for c in chats]  # every prompt at least as long as the window
    reference = run(tokenizer, model, chats, SPECS[name], False, monkeypatch)
    ours = run(tokenizer, model, chats, SPECS[name], True, monkeypatch)
    assert ours["tokens"] == reference["tokens"]
    assert ours["text"] == reference["text"]
    np.testing.assert_array_equal(np.array(ours["mean_entropy"], dtype=float),
                                  np.array(reference["mean_entropy"], dtype=float))
    np.testing.assert_array_equal(np.array(ours["mean_spike_entropy"], dtype=float),
                                  np.array(reference["mean_spike_entropy"], dtype=float))


def test_rows_that_end_early_are_cut_like_generate(tiny, monkeypatch):
    """A row whose EOS comes first keeps only its tokens before EOS; the loop's stop check runs every
    STOP_CHECK_EVERY steps, so steps after the last row's end add nothing."""
    tokenizer, model = tiny
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():  # make EOS likely, so rows end at different steps
        model.lm_head.weight[eos] += 0.35 * model.lm_head.weight.norm(dim=1).mean()
    chats, _ = tiny_chats(8)
    chats = [c + " the" * 3 for c in chats]
    reference = run(tokenizer, model, chats, None, False, monkeypatch, max_new_tokens=40)
    ours = run(tokenizer, model, chats, None, True, monkeypatch, max_new_tokens=40)
    lengths = [len(t) for t in reference["tokens"]]
    assert min(lengths) < 40  # some row ended
    assert ours["tokens"] == reference["tokens"]
    np.testing.assert_array_equal(np.array(ours["mean_entropy"], dtype=float),
                                  np.array(reference["mean_entropy"], dtype=float))


def test_short_prompts_fall_back_to_generate(tiny, monkeypatch):
    tokenizer, model = tiny
    monkeypatch.setattr(engine, "CACHE_DEVICES", ("cpu", "cuda"))
    spec = SchemeSpec.from_params(SPECS["tournament"])
    processor = WatermarkProcessor(spec, KEY, model.config.vocab_size, [1], 1.0, compiled=False)
    assert not engine.use_static_decode(model, processor, 1)
    assert engine.use_static_decode(model, processor, 2)


def test_the_decoding_attention_reads_only_written_positions_and_gives_the_same_tokens(tiny, monkeypatch):
    """With the GPU's decoding attention (folded query heads, forced on here), each step reads the cache only up
    to its bucket's bound (``key_limit``): the bound covers every written position, and the tokens are those of
    reading the whole pre-allocated cache (every position past the bound is masked anyway)."""
    from types import SimpleNamespace

    from mmw.engines import attention, graph_decode
    from mmw.engines.attention import grouped_query_sdpa

    tokenizer, model = tiny
    chats, _ = tiny_chats(6)
    chats = [c + " the" * 3 for c in chats]
    limits: list[tuple[int, int]] = []
    fold = attention.decode_attention

    def recording(module, query, key, value, mask, scaling, window=None):
        limit = window.key_limit if window is not None else None
        if limit is not None:
            limits.append((limit, int(mask[..., limit:].sum()) if mask.dtype == torch.bool else 0))
        return fold(module, query, key, value, mask, scaling, window)

    monkeypatch.setattr(attention, "decode_attention", recording)

    def tokens(bucket: int | None) -> list[list[int]]:
        monkeypatch.setattr(graph_decode, "KEY_BUCKET", bucket)
        with grouped_query_sdpa(SimpleNamespace(device=torch.device("cuda"))):  # the CUDA path, on this CPU
            return run(tokenizer, model, chats, SPECS["c4"], True, monkeypatch, max_new_tokens=40)["tokens"]

    whole = tokens(None)
    limits.clear()
    bounded = tokens(8)
    assert bounded == whole
    assert not hasattr(attention, "KEY_LIMIT")  # the bound is the batch's window, not a module global
    assert len({limit for limit, _ in limits}) >= 2  # more than one bucket was used
    assert all(attended == 0 for _, attended in limits), "a position past the bound was attendable"


def test_flex_decoding_reads_the_written_blocks_and_gives_the_same_tokens(tiny, monkeypatch):
    """With ``flex_attention`` as the decoding attention (the CUDA default; eager flex here), every step lists the
    cache blocks up to its fed token's position and no position past them is attendable, and the tokens are those
    of the folded memory-efficient attention over the whole cache."""
    from types import SimpleNamespace

    from mmw.engines import attention, graph_decode
    from mmw.engines.attention import grouped_query_sdpa

    monkeypatch.setattr(attention, "FLEX_BLOCK", 8)
    tokenizer, model = tiny
    chats, _ = tiny_chats(6)
    chats = [c + " the" * 3 for c in chats]
    steps: list[tuple[int, int, int]] = []
    flex = attention.flex_decode

    def recording(query, key, value, blocks, scaling):
        listed = blocks.kv_num_blocks
        assert int(listed.min()) == int(listed.max())  # one count for every row
        mask2d = blocks.mask_mod.__closure__[0].cell_contents  # the loop's own mask buffer
        written = int(mask2d.any(0).nonzero().max()) + 1  # the fed token's position + 1
        steps.append((int(listed[0, 0, 0]), written, int(mask2d[:, int(listed[0, 0, 0]) * 8:].sum())))
        return flex(query, key, value, blocks, scaling)

    monkeypatch.setattr(attention, "flex_decode", recording)

    def tokens(flex_path: bool) -> list[list[int]]:
        monkeypatch.setattr(graph_decode, "KEY_BUCKET", None)
        monkeypatch.setattr(graph_decode, "flex_default", lambda device, decode="flex": flex_path)
        with grouped_query_sdpa(SimpleNamespace(device=torch.device("cuda"))):  # the CUDA path, on this CPU
            return run(tokenizer, model, chats, SPECS["c4"], True, monkeypatch, max_new_tokens=40)["tokens"]

    whole = tokens(False)
    assert not steps
    flexed = tokens(True)
    assert flexed == whole
    assert not hasattr(attention, "DECODE_BLOCKS")  # the blocks are the batch's window, not a module global
    assert len({listed for listed, _, _ in steps}) >= 3  # the count grew over the generation
    assert all(listed == -(-written // 8) for listed, written, _ in steps), steps[:5]
    assert all(past == 0 for _, _, past in steps), "a position past the listed blocks was attendable"


# ------------------------------------------------------------------------------------- fused elementwise layers


def test_fused_layers_compute_the_same_forward_with_one_graph_for_every_layer_and_put_the_code_back(tiny):
    """mmw.engines.fused_layers (params engine.fuse_layers; CUDA by default, forced here on the CPU): inside the
    block the model's norms, gated MLP and rotary function run compiled by Inductor, the forward's logits equal the
    eager ones within float32 rounding, one graph a piece serves both layers (a graph per layer would mean a
    compile per layer on an 8B model's 32), and on exit transformers' own functions are back, bit for bit."""
    from torch._dynamo.utils import counters
    from transformers.models.llama import modeling_llama

    from mmw.engines.fused_layers import fusable, fused_layers

    tokenizer, model = tiny
    assert len(model.model.layers) >= 2
    originals = (modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward,
                 modeling_llama.apply_rotary_pos_emb)
    assert set(fusable(model)) == {(modeling_llama.LlamaRMSNorm, "forward"), (modeling_llama.LlamaMLP, "forward"),
                                   (modeling_llama, "apply_rotary_pos_emb")}
    ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(ids).logits
        graphs = counters["stats"]["unique_graphs"]
        with fused_layers(model) as replaced:
            assert len(replaced) == 3
            assert modeling_llama.LlamaRMSNorm.forward is not originals[0]
            fused = model(ids).logits
            assert counters["stats"]["unique_graphs"] - graphs == 3  # norm, MLP, rotary: not 3 per layer
        assert (modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaMLP.forward,
                modeling_llama.apply_rotary_pos_emb) == originals
        after = model(ids).logits
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5)
    assert not torch.equal(fused, torch.zeros_like(fused))
    assert torch.equal(after, eager)


def test_fused_decoding_compiles_the_steps_shape_only_and_runs_the_prefill_eagerly(tiny, monkeypatch):
    """With engine.fuse_layers on (forced on the CPU) a batch compiles the three fused pieces once, for its decoding
    step's shape: the prefill, which runs once a batch, runs transformers' own code (compiling it for the prompt's
    shape cost a process seconds on a GPU for a forward of a fraction of one)."""
    from torch._dynamo.utils import counters

    from mmw.engines import fused_layers as fusing

    tokenizer, model = tiny
    chats, _ = tiny_chats(3)
    monkeypatch.setattr(engine, "fuse_default", lambda device, on=True: on)
    torch._dynamo.reset()
    monkeypatch.setattr(fusing, "_COMPILED", {})
    graphs = counters["stats"]["unique_graphs"]
    fused = run(tokenizer, model, chats, SPECS["c4"], True, monkeypatch, max_new_tokens=6)
    assert counters["stats"]["unique_graphs"] - graphs == 3  # norm, MLP, rotary at [rows, 1]; none at the prompt's
    assert all(len(tokens) > 0 for tokens in fused["tokens"])


def test_fusing_is_cuda_only_and_a_compiler_failure_decodes_unfused_with_a_warning(tiny, monkeypatch):
    """On the CPU nothing is fused by default; where fusing is on and the compiled code fails (a compiler bug),
    the batch is decoded again with transformers' code: the same tokens as with engine.fuse_layers false, a warning
    naming the error, and transformers' functions back in place."""
    from transformers.models.llama import modeling_llama

    from mmw.engines import fused_layers as fusing

    assert fusing.fuse_default(torch.device("cuda")) and not fusing.fuse_default(torch.device("cuda"), False)
    assert not fusing.fuse_default(torch.device("cpu"))
    tokenizer, model = tiny
    chats, _ = tiny_chats(4)
    chats = [c + " the" * 3 for c in chats]
    plain = run(tokenizer, model, chats, SPECS["c4"], True, monkeypatch)

    def broken(self, hidden_states):
        raise torch._dynamo.exc.TorchDynamoException("inductor broke")

    original = modeling_llama.LlamaRMSNorm.forward
    monkeypatch.setattr(engine, "fuse_default", lambda device, on=True: on)
    monkeypatch.setitem(fusing._COMPILED, (modeling_llama.LlamaRMSNorm, "forward"), broken)
    with pytest.warns(UserWarning, match="compiling the layers' elementwise code failed.*inductor broke"):
        fallback = run(tokenizer, model, chats, SPECS["c4"], True, monkeypatch)
    assert fallback["tokens"] == plain["tokens"] and fallback["text"] == plain["text"]
    assert modeling_llama.LlamaRMSNorm.forward is original


def _board(tmp_path, **sections):
    """The repository's params.yaml with ``sections``' keys replaced, loaded as the generate stage loads it."""
    from mmw.params import load_params

    return load_params(board_file(tmp_path, **sections), ("seed", "model", "scheme", "key", "engine"),
                       models={"scheme": SchemeSpec})


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="torch.compile on the CPU needs a C++ compiler")
def test_the_watermark_step_compiled_ahead_is_the_one_the_decode_loop_then_calls(tiny, tmp_path, monkeypatch):
    """``stages.generate.compile_step`` (run beside the baseline's decode) compiles the watermarked stage's step for
    its first batch with the inputs the decode loop gives it: the loop's first call, on a processor of the stage's
    own, compiles nothing more (the CPU standing in for CUDA: the static cache, the graph flag and the step's
    compile switched on here)."""
    import polars as pl
    import torch._dynamo
    from torch._dynamo.utils import counters

    from mmw.engines import graph_decode
    from mmw.keys import resolve_key
    from mmw.stages import generate as stage
    from mmw.watermark import processor as step_module

    tokenizer, model = tiny
    monkeypatch.setattr(engine, "CACHE_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(graph_decode, "graph_default", lambda device, graph_decode=True: graph_decode)
    monkeypatch.setattr(step_module, "compile_default", lambda device: True)
    monkeypatch.setattr(stage, "load_model", lambda *args, **kwargs: (tokenizer, model))
    monkeypatch.chdir(tmp_path)
    chats, ids = tiny_chats(3)
    chats = [c + " the" * 3 for c in chats]
    (tmp_path / "data").mkdir()
    pl.DataFrame({"prompt_id": ids}).write_parquet(tmp_path / "data" / "prompts.parquet")
    params = _board(tmp_path, model={"batch_size": 8, "max_new_tokens": 4, "temperature": 1.0})
    torch._dynamo.reset()
    step_module.watermark_step.cache_clear()
    counters.clear()
    assert stage.compile_step(params)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    vocab_size = stage.generator_vocab_size(tokenizer, model)
    processor = stage.batch_processor(params.scheme, resolve_key(params.key), vocab_size, 1.0, params.engine,
                                      [engine.row_seed(7, i) for i in ids])
    batch = tokenizer.pad({"input_ids": tokenizer(chats, add_special_tokens=False)["input_ids"]}, padding=True,
                          padding_side="left", return_tensors="pt")
    with torch.inference_mode():  # the stage's first call of the step, as static_decode makes it
        processor.begin_static(3, 4, model.device, graph=True)
        decoder = graph_decode._Decoder(model, batch["input_ids"], batch["attention_mask"], processor, 4,
                                        [tokenizer.eos_token_id], tokenizer.pad_token_id)
        decoder.choose(decoder.prefill_scores())
    assert counters["stats"]["unique_graphs"] == graphs
    assert processor._step is step_module.watermark_step(params.scheme, resolve_key(params.key), vocab_size, 1.0,
                                                         True, "default", dynamic=False)


@pytest.mark.parametrize(("which", "sections", "scheduled"), [
    ("watermarked", {}, True),
    ("baseline", {}, False),  # plain sampling's step is compiled by the decode it runs in
    ("watermarked", {"engine": {"compile_step": False}}, False),
    ("watermarked", {"model": {"engine": "vllm"}}, False),
])
def test_the_watermarked_stage_schedules_its_step_where_it_compiles_one(tmp_path, monkeypatch, which, sections,
                                                                        scheduled):
    from mmw.engines import ahead
    from mmw.stages import generate as stage

    try:
        stage.schedule_ahead(which, board_file(tmp_path, **sections))
        assert bool(ahead.pending()) == scheduled
    finally:
        ahead.forget()


def test_off_cuda_the_step_job_compiles_nothing(tiny, tmp_path, monkeypatch):
    import polars as pl

    from mmw.stages import generate as stage

    tokenizer, model = tiny
    monkeypatch.setattr(stage, "load_model", lambda *args, **kwargs: (tokenizer, model))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    pl.DataFrame({"prompt_id": ["a", "b"]}).write_parquet(tmp_path / "data" / "prompts.parquet")
    assert stage.compile_step(_board(tmp_path)) is False
