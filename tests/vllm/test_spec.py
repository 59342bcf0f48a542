"""quantization_config parsing, module skipping and the per-shard load adapters: no vLLM."""

from __future__ import annotations

import pytest
import torch

from ternary import ops
from ternary.formats import bitnet
from ternary.vllm import loading
from ternary.vllm.spec import (
    QuantSpec,
    TernaryConfigError,
    claims_bitnet,
    is_skipped,
    module_matches,
    parse,
)


def test_parse_canonical_defaults():
    s = parse({"quant_method": "ternary", "version": 1})
    assert (s.format, s.scale, s.group_size, s.kernel_group_size) == ("ternary", "channel", None, 0)


def test_parse_group_and_bitnet():
    s = parse({"quant_method": "ternary", "scale": "group", "group_size": 64,
               "modules_to_not_convert": ["lm_head"]})
    assert s.kernel_group_size == 64 and s.modules_to_not_convert == ("lm_head",)
    b = parse({"quant_method": "bitnet", "linear_class": "autobitlinear"})
    assert (b.format, b.scale, b.bitnet_linear_class) == ("bitnet", "tensor", "autobitlinear")


@pytest.mark.parametrize("cfg, words", [
    ({"quant_method": "gptq"}, "quant_method='gptq'"),
    ({"quant_method": "ternary", "version": 2}, "version is 2"),
    ({"quant_method": "ternary", "scale": "row"}, "scale is 'row'"),
    ({"quant_method": "ternary", "scale": "group"}, "group_size is None"),
    ({"quant_method": "ternary", "scale": "group", "group_size": 0}, "group_size is 0"),
    ({"quant_method": "ternary", "scale": "group", "group_size": True}, "group_size is True"),
    ({"quant_method": "ternary", "scale": "channel", "group_size": 32}, "group_size is 32"),
    ({"quant_method": "bitnet", "quantization_mode": "always"}, "quantization_mode is 'always'"),
    ({"quant_method": "bitnet", "linear_class": "dense"}, "linear_class is 'dense'"),
    ({"quant_method": "ternary", "modules_to_not_convert": "lm_head"},
     "modules_to_not_convert is 'lm_head'; expected a list of names"),
    ({"quant_method": "bitnet", "modules_to_not_convert": [3]}, "modules_to_not_convert is [3]"),
])
def test_parse_refusals(cfg, words):
    with pytest.raises(TernaryConfigError, match="quantization_config") as e:
        parse(cfg)
    assert words in str(e.value)


def test_claims_bitnet_for_llama_and_bitnet_models_only():
    assert claims_bitnet({"quant_method": "bitnet"}, "llama")
    assert claims_bitnet({"quant_method": "bitnet"}, "bitnet")  # BitNetForCausalLM
    assert claims_bitnet({"quant_method": "bitnet"}, None)
    assert not claims_bitnet({"quant_method": "ternary"}, "llama")
    with pytest.raises(TernaryConfigError, match=r"model_type='falcon'.*\['llama', 'bitnet'\]"):
        claims_bitnet({"quant_method": "bitnet"}, "falcon")


@pytest.mark.parametrize("cfg,activation,online", [
    ({"quant_method": "ternary"}, "none", False),
    ({"quant_method": "ternary", "activation": "none"}, "none", False),
    ({"quant_method": "ternary", "activation": "int8_per_token"}, "int8_per_token", False),
    ({"quant_method": "bitnet"}, "int8_per_token", False),
    ({"quant_method": "bitnet", "linear_class": "autobitlinear"}, "int8_per_token", False),
    ({"quant_method": "bitnet", "linear_class": "autobitlinear",
      "quantization_mode": "online"}, "int8_per_token", True),
    # BitLinear reads packed weights whatever quantization_mode says (transformers)
    ({"quant_method": "bitnet", "quantization_mode": "online"}, "int8_per_token", False),
])
def test_parse_activation_and_online(cfg, activation, online, monkeypatch):
    monkeypatch.delenv("TERNARY_ACTIVATION_OVERRIDE", raising=False)
    s = parse(cfg)
    assert (s.activation, s.online) == (activation, online)


def test_activation_override_and_refusals(monkeypatch):
    monkeypatch.setenv("TERNARY_ACTIVATION_OVERRIDE", "none")
    assert parse({"quant_method": "bitnet"}).activation == "none"
    monkeypatch.setenv("TERNARY_ACTIVATION_OVERRIDE", "int4")
    with pytest.raises(TernaryConfigError, match="TERNARY_ACTIVATION_OVERRIDE='int4'"):
        parse({"quant_method": "bitnet"})
    monkeypatch.delenv("TERNARY_ACTIVATION_OVERRIDE")
    with pytest.raises(TernaryConfigError, match=r"config.json quantization_config: "
                       r"quantization_config.activation is 'int4'; expected one of "
                       r"\['none', 'int8_per_token'\]"):
        parse({"quant_method": "ternary", "activation": "int4"})
    with pytest.raises(TernaryConfigError, match="use_rms_norm is true"):
        parse({"quant_method": "bitnet", "use_rms_norm": True})


def test_online_master_weight_is_quantized_like_weight_quant():
    g = torch.Generator().manual_seed(5)
    w = (torch.randn(12, 16, generator=g) * 0.02).to(torch.bfloat16)
    packed, scale = loading.online_to_canonical(w, 12, 16, "q_proj")
    codes, s = bitnet.weight_quant(w)
    assert torch.equal(packed, ops.pack(codes)) and torch.equal(scale, s.expand(12))
    with pytest.raises(TernaryConfigError, match=r"q_proj: .*online.*\[N, K\]=\[12, 16\] "
                       r"\(config.json\); got torch.uint8 \[3, 16\]"):
        loading.online_to_canonical(torch.zeros(3, 16, dtype=torch.uint8), 12, 16, "q_proj")


def test_module_matches_whole_names_only():
    assert module_matches("lm_head", "lm_head")
    assert module_matches("model.layers.3.self_attn.o_proj", "self_attn.o_proj")
    assert not module_matches("model.layers.3.self_attn.o_proj", "proj")
    assert not module_matches("model.layers.13.mlp.down_proj", "layers.1")


def test_is_skipped_fused_all_or_none():
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    p = "model.layers.0.self_attn.qkv_proj"
    assert not is_skipped(p, ("lm_head",), packed)
    assert is_skipped(p, ("q_proj", "k_proj", "v_proj"), packed)
    assert is_skipped("model.layers.0.mlp.down_proj", ("mlp.down_proj",), packed)
    with pytest.raises(TernaryConfigError, match=r"lists \['model.layers.0.self_attn.q_proj'\] but not"):
        is_skipped(p, ("q_proj",), packed)


def _codes(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)


def test_bitnet_to_canonical_matches_definition():
    from ternary.formats.bitnet import pack_rows

    codes = _codes(12, 16)
    packed = pack_rows(codes)  # [3, 16]
    # the docs/formats.md definition, element by element
    r = packed.shape[0]
    for n in range(12):
        i, row = divmod(n, r)
        assert torch.equal(((packed[row] >> (2 * i)) & 3).to(torch.int8) - 1, codes[n])
    assert torch.equal(ops.unpack(loading.bitnet_to_canonical(packed, 12, "w")), codes)


@pytest.mark.parametrize("packed, n, words", [
    (torch.zeros(3, 16, dtype=torch.int8), 12, "must be uint8"),
    (torch.zeros(3, 16, dtype=torch.uint8), 16, "3 byte rows but the model's layer has N=16"),
    (torch.zeros(3, 18, dtype=torch.uint8), 12, "K=18 inputs is not a multiple of 4"),
    (torch.full((3, 16), 0xFF, dtype=torch.uint8), 12, "invalid 2-bit code 3"),
])
def test_bitnet_to_canonical_refusals(packed, n, words):
    with pytest.raises(TernaryConfigError, match="layers.0.q_proj.weight") as e:
        loading.bitnet_to_canonical(packed, n, "layers.0.q_proj.weight")
    assert words in str(e.value)


def test_per_channel_scale_expansions():
    tensor = QuantSpec("ternary", "tensor", None, ())
    assert torch.equal(loading.per_channel_scale(torch.tensor([2.0]), 3, tensor, "s"),
                       torch.full((3,), 2.0))
    bitlinear = QuantSpec("bitnet", "tensor", None, (), "bitlinear")
    auto = QuantSpec("bitnet", "tensor", None, (), "autobitlinear")
    s = torch.tensor([4.0], dtype=torch.bfloat16)
    assert torch.equal(loading.per_channel_scale(s, 2, bitlinear, "s"), torch.full((2,), 0.25))
    assert torch.equal(loading.per_channel_scale(s, 2, auto, "s"), torch.full((2,), 4.0))


@pytest.mark.parametrize("spec, scale, words", [
    (QuantSpec("ternary", "tensor", None, ()), torch.ones(3), "needs one value"),
    (QuantSpec("bitnet", "tensor", None, (), "bitlinear"), torch.zeros(1),
     "1 of 1 scale values are zero (first at index [0]: 0.0)"),
    # inf for bitlinear used to become a scale of 1 / inf = 0: rows of zeros
    (QuantSpec("bitnet", "tensor", None, (), "bitlinear"), torch.tensor([float("inf")]),
     "first at index [0]: inf"),
    (QuantSpec("ternary", "channel", None, ()), torch.tensor([1.0, float("nan"), 1.0]),
     "first at index [1]: nan"),
    (QuantSpec("ternary", "channel", None, ()), torch.ones(2), "needs float32 [N]=[3]"),
    (QuantSpec("ternary", "channel", None, ()), torch.ones(3, dtype=torch.bfloat16),
     "wrong dtype torch.bfloat16 [3] for a ternary scale; expected F32"),
    (QuantSpec("bitnet", "tensor", None, (), "bitlinear"), torch.ones(1, dtype=torch.int32),
     "expected BF16 or F16 or F32"),
    # a group scale must fit the layer's whole K: vLLM would otherwise cut or mis-slice it
    (QuantSpec("ternary", "group", 32, ()), torch.ones(3, 5),
     "needs float32 [N, ceil(K/group_size)]=[3, 4] for the layer's N=3, K=128; got [3, 5]"),
    (QuantSpec("ternary", "group", 32, ()), torch.ones(3, 8), "got [3, 8]"),
    (QuantSpec("ternary", "group", 32, ()), torch.ones(3), "got [3]"),
])
def test_per_channel_scale_refusals(spec, scale, words):
    with pytest.raises(TernaryConfigError, match="q_proj.weight_scale") as e:
        loading.per_channel_scale(scale, 3, spec, "q_proj.weight_scale", 128)
    assert words in str(e.value)


_WANT_W = ("the checkpoint weight is [8, 33] but the model's layer (config.json) is N=8, "
           "K=128, i.e. uint8 [N, K/4]=[8, 32]")


@pytest.mark.parametrize("shape, words", [
    ([8, 33], _WANT_W),
    ([16, 32], "is [16, 32]"), ([8], "is [8]")])
def test_checkpoint_weight_must_match_the_layer(shape, words):
    with pytest.raises(TernaryConfigError, match="o_proj.weight") as e:
        loading.check_weight(torch.zeros(shape, dtype=torch.uint8), 8, 128, "o_proj.weight")
    assert words in str(e.value)
    with pytest.raises(TernaryConfigError, match="must be uint8 .* modules_to_not_convert"):
        loading.check_weight(torch.zeros(8, 128), 8, 128, "o_proj.weight")


def test_bitnet_weight_k_must_match_the_layer():
    packed = bitnet.pack_rows(torch.zeros(8, 132, dtype=torch.int8))
    with pytest.raises(TernaryConfigError, match="bitnet weight has K=132 inputs but the "
                                                 "model's layer has K=128"):
        loading.bitnet_to_canonical(packed, 8, "down_proj.weight", 128)
