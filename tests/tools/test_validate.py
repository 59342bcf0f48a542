"""ternary.tools.validate without vLLM: which reference a checkpoint gets (transformers' own bitnet
layers for int8 activations), and the verdict's rules."""

from __future__ import annotations

import pytest
import torch

from ternary.tools import validate as v
from ternary.formats import testing as T

pytest.importorskip("transformers")


def test_no_results_is_a_failure():
    assert not v.Report("m", "float32", "ternary", []).ok
    r = v.PromptResult("p", [1, 2], [1, 2], 0.0, 0.0, [0.0, 0.0])
    assert v.Report("m", "float32", "ternary", [r]).ok
    assert not v.Report("m", "float32", "ternary",
                        [v.PromptResult("p", [1, 2], [1, 3], 0.0, 0.0)]).ok


def test_kl_limit_depends_on_the_activation_mode():
    assert v.kl_limit("float32", "none") == v.KL_LIMITS["float32"]
    assert v.kl_limit("float32", "int8_per_token") == v.KL_LIMITS_A8["float32"]
    assert v.kl_limit("bfloat16", "int8_per_token") == v.KL_LIMITS_A8["bfloat16"]


def _linear_types(model):
    return {type(model.get_submodule(n)).__name__
            for n in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")}


@pytest.mark.parametrize("linear_class,want", [("bitlinear", "BitLinear"),
                                               ("autobitlinear", "AutoBitLinear")])
def test_bitnet_reference_is_transformers_from_pretrained(tmp_path, linear_class, want):
    pytest.importorskip("accelerate")
    d = T.write_bitnet(tmp_path / "b", linear_class=linear_class)
    ref = v.reference_model(d, torch.float32)
    assert _linear_types(ref) == {want}
    assert v.reference_kind(T.edit_config(d)).startswith("transformers bitnet")
    # transformers' own model computes with int8 activations: not the dense twin's outputs
    x = torch.tensor([[1, 5, 9, 13, 2, 7]])
    twin = v.reference_model(T.write_canonical(tmp_path / "c"), torch.float32)
    assert _linear_types(twin) == {"Linear"}
    assert v.run_reference(ref, x).logits.shape == v.run_reference(twin, x).logits.shape


def test_canonical_int8_reference_quantizes_through_auto_bit_linear(tmp_path):
    pytest.importorskip("transformers.integrations.bitnet")
    a8 = v.reference_model(T.write_canonical(tmp_path / "a8", activation="int8_per_token"),
                           torch.float32)
    a16 = v.reference_model(T.write_canonical(tmp_path / "a16"), torch.float32)
    assert _linear_types(a8) == {"AutoBitLinear"} and _linear_types(a16) == {"Linear"}
    # same weights (one seed), different activations: outputs differ, but only by rounding
    x = torch.tensor([[1, 5, 9, 13, 2, 7]])
    la8, la16 = v.run_reference(a8, x).logits, v.run_reference(a16, x).logits
    assert not torch.equal(la8, la16)
    assert torch.allclose(la8, la16, atol=0.5)
