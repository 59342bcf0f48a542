"""The activation mode of a checkpoint (docs/formats.md): canonical quantization_config's
`activation`, bitnet's int8_per_token, and bitnet "online" master weights quantized exactly as
transformers' WeightQuant does."""

from __future__ import annotations

import json

import pytest
import torch

from ternary.formats import Checkpoint, FormatError, dequantize
from ternary.formats import bitnet
from ternary.formats import testing as T
from ternary.formats.convert import convert
from ternary.formats.inspection import inspect

UP = "model.layers.1.mlp.up_proj"


@pytest.mark.parametrize("activation", [None, "none", "int8_per_token"])
def test_canonical_activation_is_read(tmp_path, activation):
    d = T.write_canonical(tmp_path / "m", activation=activation or "none")
    if activation is None:  # absent means none
        qc = json.loads((d / "config.json").read_text())["quantization_config"]
        del qc["activation"]
        T.edit_config(d, quantization_config=qc)
    with Checkpoint(d) as ckpt:
        assert ckpt.activation == (activation or "none")
    assert inspect(d)["activation"] == (activation or "none")


def test_bitnet_is_int8_per_token_in_both_linear_classes(tmp_path):
    for cls in ("bitlinear", "autobitlinear", None):
        d = T.write_bitnet(tmp_path / str(cls), linear_class=cls)
        with Checkpoint(d) as ckpt:
            assert ckpt.activation == "int8_per_token"


def test_convert_keeps_int8_per_token_from_bitnet(tmp_path):
    src = T.write_bitnet(tmp_path / "b", linear_class="autobitlinear")
    report = convert(src, tmp_path / "c")
    qc = json.loads((tmp_path / "c" / "config.json").read_text())["quantization_config"]
    assert report.activation == qc["activation"] == "int8_per_token"
    with pytest.raises(FormatError, match="activation 'int8_per_token'.*would change"):
        convert(src, tmp_path / "c2", activation="none")


def test_convert_dense_activation_is_said(tmp_path):
    src = T.write_dense(tmp_path / "d")
    convert(src, tmp_path / "none")
    convert(src, tmp_path / "a8", activation="int8_per_token")
    for name, want in (("none", "none"), ("a8", "int8_per_token")):
        qc = json.loads((tmp_path / name / "config.json").read_text())["quantization_config"]
        assert qc["activation"] == want
    with pytest.raises(FormatError, match="activation 'int4' is not one of"):
        convert(src, tmp_path / "bad", activation="int4")


def _transformers_weight_quant():
    bitnet_tf = pytest.importorskip("transformers.integrations.bitnet")
    # transformers wraps it in torch.compile; eagerly it is the same float32 arithmetic
    fwd = bitnet_tf.WeightQuant.forward
    return getattr(fwd, "_torchdynamo_orig_callable", None) or getattr(fwd, "__wrapped__", fwd)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_online_master_weights_quantize_as_transformers_weight_quant(tmp_path, dtype):
    d = T.write_bitnet_online(tmp_path / "o", dtype=dtype)
    weight_quant = _transformers_weight_quant()
    with Checkpoint(d) as ckpt:
        assert ckpt.activation == "int8_per_token"
        names = ckpt.module_names()
        assert UP in names and not any("lm_head" in n or "norm" in n for n in names)
        for name in names:
            master = T.load_tensor(d, f"{name}.weight")
            with torch._dynamo.config.patch(disable=True):
                want = weight_quant(None, master.clone()).to(torch.float32)
            # transformers' .to(dtype) rounds the ternary weight to the master's dtype; the
            # checkpoint defines it in float32 (and at float32 the two are the same)
            got = ckpt.dequantize(name)
            assert torch.equal(got.to(dtype).to(torch.float32), want), name
            if dtype == torch.float32:
                assert torch.equal(got, want), name
    assert inspect(d)["ok"]


def test_online_converts_to_packed(tmp_path):
    d = T.write_bitnet_online(tmp_path / "o")
    convert(d, tmp_path / "c")
    qc = json.loads((tmp_path / "c" / "config.json").read_text())["quantization_config"]
    assert qc["activation"] == "int8_per_token" and qc["scale"] == "tensor"
    assert torch.equal(dequantize(tmp_path / "c", UP), dequantize(d, UP))


def test_weight_quant_reference_values():
    w = torch.tensor([[0.5, -0.25, 0.0, 2.0], [0.1, -1.0, 0.3, 0.0]])
    codes, s = bitnet.weight_quant(w)
    mean = w.abs().mean()  # 0.51875
    assert torch.equal(codes, torch.tensor([[1, 0, 0, 1], [0, -1, 1, 0]], dtype=torch.int8))
    assert s.item() == pytest.approx(float(mean), rel=1e-6)


def test_online_with_packed_weights_is_refused(tmp_path):
    d = T.write_bitnet(tmp_path / "b", linear_class="autobitlinear")
    T.edit_config(d, quantization_config={"quant_method": "bitnet",
                                          "linear_class": "autobitlinear",
                                          "quantization_mode": "online"})
    report = inspect(d)
    assert not report["ok"]
    assert any("stored packed" in p["problem"] for p in report["problems"])
