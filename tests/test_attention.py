"""mmw.engines.attention: grouped-query SDPA under a padding mask (the GPU generation speed-up) is the same
attention, is switched on only for CUDA models, and is always switched back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations import sdpa_attention

from mmw.engines.attention import grouped_query_prompts, grouped_query_sdpa

CUDA_LIKE = SimpleNamespace(device=torch.device("cuda"))  # the context only reads ``model.device``


def tiny_gqa_model() -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=97, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding, as batched generation makes it
    mask[1, :2] = 0
    return ids, mask


def test_the_switch_is_on_only_inside_the_block_and_only_for_cuda_models() -> None:
    original = sdpa_attention.use_gqa_in_sdpa
    key = torch.zeros(1, 2, 4, 16)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert original(mask, key, key) is False  # transformers' rule: no GQA kernel when there is a mask
    with grouped_query_sdpa(SimpleNamespace(device=torch.device("cpu"))):
        assert sdpa_attention.use_gqa_in_sdpa is original
    with grouped_query_sdpa(CUDA_LIKE):
        assert sdpa_attention.use_gqa_in_sdpa(mask, key, key) is True
        assert sdpa_attention.use_gqa_in_sdpa(mask, torch.zeros(1, 2, 4, 512), torch.zeros(1, 2, 4, 512)) is False
    assert sdpa_attention.use_gqa_in_sdpa is original
    with pytest.raises(RuntimeError), grouped_query_sdpa(CUDA_LIKE):
        raise RuntimeError("a failed generate")
    assert sdpa_attention.use_gqa_in_sdpa is original


def test_grouped_query_attention_under_a_mask_gives_the_same_logits() -> None:
    model = tiny_gqa_model()
    ids, mask = padded_batch()
    calls: list[bool] = []
    original = sdpa_attention.use_gqa_in_sdpa


    with torch.inference_mode():
        repeated = model(input_ids=ids, attention_mask=mask).logits
        with grouped_query_sdpa(CUDA_LIKE):
            switched = sdpa_attention.use_gqa_in_sdpa
            sdpa_attention.use_gqa_in_sdpa = lambda *a: calls.append(switched(*a)) or switched(*a)
            grouped = model(input_ids=ids, attention_mask=mask).logits
    assert sdpa_attention.use_gqa_in_sdpa is original
    assert calls and all(calls), "the masked forward pass did not take the grouped-query path"
    valid = mask.bool()
    torch.testing.assert_close(grouped[valid], repeated[valid], rtol=1e-5, atol=1e-5)


def test_a_decoding_step_takes_the_folded_path_and_gives_the_same_logits() -> None:
    """One query per row (a decoding step over a cache) goes to ``decode_attention``: each group's query heads
    folded into its queries, the same attention as transformers' repeated K/V; prompt forwards do not."""
    from transformers import DynamicCache
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from mmw.engines import attention

    model = tiny_gqa_model()
    ids, mask = padded_batch()
    calls: list[tuple[int, ...]] = []
    fold = attention.decode_attention

    def counting(module, query, *args):
        calls.append(tuple(query.shape))
        return fold(module, query, *args)

    def prompt_then_step() -> torch.Tensor:
        cache = DynamicCache(config=model.config)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        step_mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
        return model(input_ids=torch.tensor([[5], [7], [11]]), attention_mask=step_mask,
                     position_ids=positions[:, -1:] + 1, past_key_values=cache, use_cache=True).logits

    def decode(switched: bool) -> torch.Tensor:
        if not switched:
            return prompt_then_step()
        with grouped_query_sdpa(CUDA_LIKE):
            assert getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], "mmw_decode_path", False)
            return prompt_then_step()

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    attention.decode_attention = counting
    try:
        with torch.inference_mode():
            reference = decode(switched=False)
            folded = decode(switched=True)
    finally:
        attention.decode_attention = fold
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original, "the attention function was not switched back"
    # 2 layers x the decoding step only (the prompt's forward keeps its path); 8 query heads, 1 query
    assert calls == [(3, 8, 1, 8)] * 2
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)
    assert not torch.equal(reference[0], reference[1])  # the rows are distinct: the comparison can fail


@pytest.mark.parametrize("additive", [False, True])
def test_the_folded_decoding_attention_is_grouped_query_attention(additive: bool) -> None:
    """Query head h reads K/V head h // (H / H_kv) under the row's mask, as SDPA's own GQA does, for either mask
    form."""
    from mmw.engines import attention

    gen = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(shape, generator=gen) for shape in [(3, 8, 1, 16), (3, 2, 10, 16),
                                                                         (3, 2, 10, 16)])
    keep = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    keep[0, ..., :4] = False  # a left-padded row
    keep[2, ..., 7:] = False  # cache positions not written yet
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min) if additive else keep
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=keep,
                                                                enable_gqa=True).transpose(1, 2)
    folded, _ = attention.decode_attention(None, query, key, value, mask, None)
    torch.testing.assert_close(folded, expected, rtol=1e-5, atol=1e-5)


def test_flex_decoding_under_the_written_blocks_is_grouped_query_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``decode_blocks`` (a static cache's mask and the count of blocks to read) a decoding step is
    ``flex_attention``'s, and it equals SDPA's GQA under the same mask; positions past the listed blocks are never
    attendable (the caller's invariant), so listing more blocks changes nothing."""
    from mmw.engines import attention

    monkeypatch.setattr(attention, "FLEX_BLOCK", 4)
    gen = torch.Generator().manual_seed(5)
    query, key, value = (torch.randn(shape, generator=gen) for shape in [(3, 8, 1, 16), (3, 2, 14, 16),
                                                                         (3, 2, 14, 16)])
    keep = torch.zeros(3, 14, dtype=torch.bool)
    keep[:, :9] = True  # 9 positions written: blocks 0-2 of 4 hold them
    keep[0, :3] = False  # a left-padded row
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=keep[:, None, None],
                                                                enable_gqa=True).transpose(1, 2)
    for listed in (3, 4):
        blocks = attention.decode_blocks(keep, torch.full((3, 1, 1), listed, dtype=torch.int32))
        window = attention.DecodeWindow(blocks=blocks)
        out, _ = attention.decode_attention(None, query, key, value, keep[:, None, None], None, window)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # a cache of another length is not the loop's: the folded memory-efficient path takes it
    short = attention.decode_attention(None, query, key[:, :, :12], value[:, :, :12], keep[:, None, None, :12],
                                       None, window)[0]
    torch.testing.assert_close(short, expected, rtol=1e-5, atol=1e-5)


def test_the_decoding_attention_switch_takes_a_known_value_or_says_which() -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with grouped_query_sdpa(CUDA_LIKE, "sdpa"):  # SDPA's own kernel for decoding: only the GQA switch
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original
        assert sdpa_attention.use_gqa_in_sdpa(torch.ones(1, 1, 1, 4, dtype=torch.bool), torch.zeros(1, 2, 4, 16),
                                              torch.zeros(1, 2, 4, 16)) is True
    with grouped_query_sdpa(CUDA_LIKE, "efficient"):
        assert getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], "mmw_decode_path", False)
    with pytest.raises(ValueError, match="engine.decode_attention: expected one of flex, efficient, sdpa, got 'cudnn'"):
        with grouped_query_sdpa(CUDA_LIKE, "cudnn"):
            pass
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is original
    assert sdpa_attention.use_gqa_in_sdpa(torch.ones(1, 1, 1, 4, dtype=torch.bool), torch.zeros(1, 2, 4, 16),
                                          torch.zeros(1, 2, 4, 16)) is False  # transformers' own rule again


def test_prompt_forwards_read_kv_heads_by_group_under_a_mask_with_one_function_object() -> None:
    """The judge's compiled forward enters this context once per batch: every entry must install the same function
    (a new one would fail the compiled layer's guard and recompile it), decoding is left alone, and on leaving
    transformers' own rule is back. On a CPU nothing changes."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    mask, key = torch.ones(1, 1, 1, 4, dtype=torch.bool), torch.zeros(1, 2, 4, 16)
    original, sdpa = sdpa_attention.use_gqa_in_sdpa, ALL_ATTENTION_FUNCTIONS["sdpa"]
    installed = []
    for _ in range(2):
        with grouped_query_prompts(CUDA_LIKE):
            installed.append(sdpa_attention.use_gqa_in_sdpa)
            assert sdpa_attention.use_gqa_in_sdpa(mask, key, key) is True
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa
    assert installed[0] is installed[1] is not original
    assert sdpa_attention.use_gqa_in_sdpa is original and original(mask, key, key) is False
    with grouped_query_prompts(SimpleNamespace(device=torch.device("cpu"))):
        assert sdpa_attention.use_gqa_in_sdpa is original


def test_attention_at_mask_widths_gives_each_row_its_own_attention_at_few_kernel_shapes() -> None:
    """The judge's prompt forward on CUDA widens only its attention (cuDNN plans one kernel per width) to its mask's
    widths, each rounded up to the next multiple of ``ROUNDED_WIDTH`` (an exact multiple gets one more block, so a
    compiled layer never sees a width without padding): the kernel sees those widths, every real position's
    logits stay those of the forward at its own widths (a hidden pad key adds exp(min) = 0), and leaving the block
    restores transformers' function."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from mmw.engines.attention import ROUNDED_WIDTH, attention_at_mask_widths, rounded_width

    model = tiny_gqa_model()
    sdpa, kernel = ALL_ATTENTION_FUNCTIONS["sdpa"], torch.nn.functional.scaled_dot_product_attention
    minimum = torch.finfo(torch.float32).min
    for n, wide in ((12, ROUNDED_WIDTH), (ROUNDED_WIDTH, 2 * ROUNDED_WIDTH)):
        assert rounded_width(n) == wide
        ids = torch.randint(1, 97, (3, n), generator=torch.Generator().manual_seed(n))
        mask = torch.ones_like(ids)
        mask[0, :5], mask[1, :2] = 0, 0  # left padding, as the judge's batches have it
        allowed = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]
        additive = torch.zeros(allowed.shape).masked_fill_(~allowed, minimum)
        widened = torch.nn.functional.pad(additive, (0, wide - n), value=minimum)  # pad keys hidden
        widened = torch.nn.functional.pad(widened, (0, 0, 0, wide - n))  # pad queries see everything
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        shapes = []

        def spy(query, key, *args, **kwargs):
            shapes.append((query.shape[-2], key.shape[-2]))
            return kernel(query, key, *args, **kwargs)

        with torch.inference_mode():
            plain = model(input_ids=ids, attention_mask=additive, position_ids=positions).logits
            with attention_at_mask_widths(model), pytest.MonkeyPatch.context() as patch:
                patch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
                assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not sdpa
                rounded = model(input_ids=ids, attention_mask=widened, position_ids=positions).logits
            with attention_at_mask_widths(model, active=False):
                assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa
        assert shapes == [(wide, wide)] * model.config.num_hidden_layers
        assert rounded.shape == plain.shape
        real = mask.bool()
        torch.testing.assert_close(rounded[real], plain[real], rtol=1e-5, atol=1e-5)


def test_a_patch_of_transformers_internals_refuses_a_version_it_was_not_checked_against(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every change to transformers' internals goes through mmw.engines.transformers_patches, which names the versions
    it was checked against and raises, naming both, on another one: before it changes anything."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from mmw.engines import transformers_patches

    original_rule, original_sdpa = sdpa_attention.use_gqa_in_sdpa, ALL_ATTENTION_FUNCTIONS["sdpa"]
    with grouped_query_sdpa(CUDA_LIKE):  # the installed version is a checked one: the patches apply
        assert sdpa_attention.use_gqa_in_sdpa is not original_rule
    monkeypatch.setattr(transformers_patches, "installed_version", lambda: "4.99.0")
    for patched in (lambda: grouped_query_sdpa(CUDA_LIKE), lambda: grouped_query_prompts(CUDA_LIKE),
                    lambda: transformers_patches.sdpa_function_replaced(lambda f: f)):
        with pytest.raises(transformers_patches.TransformersVersionError,
                           match=r"checked against transformers 5\.17\.0, 5\.19\.0; installed: 4\.99\.0"):
            with patched():
                pass
        assert sdpa_attention.use_gqa_in_sdpa is original_rule and ALL_ATTENTION_FUNCTIONS["sdpa"] is original_sdpa
    with grouped_query_sdpa(SimpleNamespace(device=torch.device("cpu"))):  # a CPU path patches nothing: any version
        assert sdpa_attention.use_gqa_in_sdpa is original_rule


def test_no_module_outside_the_patch_module_touches_transformers_internals() -> None:
    """The private names the patches use appear in mmw only in mmw/engines/transformers_patches.py."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "mmw"
    private = ("_local_mapping", "use_gqa_in_sdpa =")
    offenders = [str(path.relative_to(root)) for path in root.rglob("*.py")
                 if path.name != "transformers_patches.py" and any(name in path.read_text() for name in private)]
    assert offenders == []
