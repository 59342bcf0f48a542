"""ternary.formats.modules: the one table of a Llama decoder layer's projection shapes,
against transformers' own Llama (so the table cannot drift from the model it describes), and
what the readers' check (expected_shape) and vLLM's merged layers take from it."""

from __future__ import annotations

import pytest
import torch

from ternary.formats import testing as T
from ternary.formats.modules import (
    LLAMA_PROJECTIONS,
    expected_shape,
    llama_widths,
    projection_shapes,
    vllm_layer_shapes,
)

# every width another value: hidden 32, q 4 * 6, kv 1 * 6, inter 64
GQA = T.llama_config(head_dim=6, num_key_value_heads=1)


def _widths(cfg: dict) -> dict[str, int]:
    return llama_widths(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                        cfg["num_key_value_heads"], cfg.get("head_dim"))


def test_the_table_is_transformers_llama_decoder_layer():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(**{k: v for k, v in GQA.items()
                                      if k not in ("architectures", "model_type", "torch_dtype")})
    with torch.device("meta"):
        layer = transformers.LlamaForCausalLM(cfg).model.layers[0]
    linears = {name: tuple(m.weight.shape) for name, m in layer.named_modules()
               if isinstance(m, torch.nn.Linear)}
    assert linears == projection_shapes(_widths(GQA))
    assert list(linears) == list(LLAMA_PROJECTIONS)


def test_expected_shape_takes_the_table_and_names_the_values_it_used():
    for module, shape in projection_shapes(_widths(GQA)).items():
        assert expected_shape(GQA, f"model.layers.1.{module}")[0] == shape, module
    assert expected_shape(GQA, "model.layers.0.self_attn.o_proj") == (
        (32, 24), "hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=6")
    assert expected_shape(GQA, "model.layers.0.mlp.down_proj") == (
        (32, 64), "hidden_size=32, intermediate_size=64")
    assert expected_shape(GQA, "model.layers.0.mlp.foo") is None


def test_widths_left_out_leave_out_the_projections_they_size():
    assert set(projection_shapes(llama_widths(32, None, 4))) == {
        m for m in LLAMA_PROJECTIONS if m.startswith("self_attn.")}
    assert set(projection_shapes(llama_widths(32, 64, None))) == {
        m for m in LLAMA_PROJECTIONS if m.startswith("mlp.")}
    # transformers' defaults: as many KV heads as heads, head_dim = hidden / heads
    assert llama_widths(32, 64, 4) == {"hidden": 32, "q": 32, "kv": 32, "inter": 64}


def test_vllm_layers_stack_the_fused_parts_along_n():
    assert vllm_layer_shapes(_widths(GQA)) == {
        "self_attn.qkv_proj": (36, 32), "self_attn.o_proj": (32, 24),
        "mlp.gate_up_proj": (128, 32), "mlp.down_proj": (32, 64)}
    assert list(vllm_layer_shapes(_widths(GQA))) == [
        "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]
