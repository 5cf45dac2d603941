"""The fused gated-MLP up-projection (``mmw.engines.gated_mlp``): its op's arithmetic and registration, where the
judge uses it, and that a model's MLP computes its own function through it. The Triton kernel itself runs on Hopper
GPUs only: ``bench/gpu_gated_mlp.py`` checks it against cuBLAS there (and, under Triton's interpreter, on a CPU)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

from mmw.engines import gated_mlp
from mmw.errors import SpecError
from mmw.judge.judge import CompiledLayers


def _mlp(hidden: int = 64, inner: int = 96, **config) -> LlamaMLP:
    torch.manual_seed(0)
    return LlamaMLP(LlamaConfig(hidden_size=hidden, intermediate_size=inner, **config)).eval()


@pytest.mark.parametrize("shape", [(7, 64), (2, 5, 64), (1, 1, 64), (0, 64)])
def test_forward_through_the_op_is_the_modules_own(shape: tuple[int, ...]) -> None:
    mlp = _mlp()
    x = torch.randn(shape)
    with torch.no_grad():
        got, want = gated_mlp.forward(mlp, x), mlp(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_op_rounds_each_product_then_works_in_float32() -> None:
    torch.manual_seed(1)
    x, w_gate, w_up = torch.randn(9, 32, dtype=torch.bfloat16), *torch.randn(2, 48, 32, dtype=torch.bfloat16)
    gate, up = (x @ w_gate.T).float(), (x @ w_up.T).float()  # bf16 products, as cuBLAS returns them
    want = (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)
    got = torch.ops.mmw.gated_up(x, w_gate, w_up)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    # not the eager module's arithmetic, which rounds SiLU's output to bf16 before the product
    eager = torch.nn.functional.silu(x @ w_gate.T) * (x @ w_up.T)
    assert not torch.equal(got, eager)


def test_the_op_is_registered_for_the_compiler() -> None:
    x, w_gate, w_up = torch.randn(6, 16), torch.randn(24, 16), torch.randn(24, 16)
    torch.library.opcheck(gated_mlp.gated_up, (x, w_gate, w_up),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("change", ["bias", "activation", "cpu"])
def test_usable_only_where_the_kernel_computes_the_modules_function(change: str) -> None:
    mlp = _mlp(mlp_bias=change == "bias", hidden_act="gelu" if change == "activation" else "silu")
    assert not gated_mlp.usable(mlp)  # the CPU case: every module here is on the CPU


def test_the_judge_keeps_its_mlps_unless_asked_and_refuses_where_unusable() -> None:
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128)).eval()
    assert CompiledLayers(model).gated_classes == set()
    with pytest.raises(SpecError, match="engine.judge_gated_mlp"):
        CompiledLayers(model, gated=True)


def test_a_compiled_forward_traces_the_op_once_for_every_row_count() -> None:
    mlp = _mlp()
    counts = torch._dynamo.testing.CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: gated_mlp.forward(mlp, x), backend=counts, dynamic=True)
    with torch.no_grad():
        for rows in (3, 11, 40):
            x = torch.randn(2, rows, 64)
            torch.testing.assert_close(compiled(x), mlp(x), rtol=1e-5, atol=1e-6)
    assert counts.frame_count == 1  # symbolic rows: the op's fake implementation serves every width
    torch._dynamo.reset()
