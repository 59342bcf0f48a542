"""Every format decodes exactly as its layout defines it (checked against the float64
references), and converting to the canonical format changes no weight."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ternary.formats import Checkpoint, dequantize, iter_modules, quantize
from ternary.formats import testing as T
from ternary.formats.convert import convert
from ternary.formats.vendor_int8 import CODE_MAPS

# k/v_proj get N = 1 * 6 = 6 rows: bitnet's ceil(N/4) row blocks with a partial last block.
ODD_N = T.llama_config(head_dim=6, num_key_value_heads=1)


def _tensors(model_dir) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def _f32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).to(torch.float32)


@pytest.mark.parametrize("scale,group_size", [("channel", None), ("tensor", None), ("group", 8),
                                              ("group", 12)])
def test_canonical_matches_reference(ref, tmp_path, scale, group_size):
    # group 12 with K=32: a partial last group; max_shard_bytes forces an index + shards
    d = T.write_canonical(tmp_path / "m", scale=scale, group_size=group_size,
                          max_shard_bytes=4000)
    assert (d / "model.safetensors.index.json").exists()
    t = _tensors(d)
    for name in T.linear_names(T.llama_config())[:7]:
        want = ref.canonical(t[f"{name}.weight"].numpy(), t[f"{name}.weight_scale"].numpy(),
                             group_size)
        assert torch.equal(dequantize(d, name), _f32(want)), name


@pytest.mark.parametrize("linear_class", ["bitlinear", "autobitlinear", None])
def test_bitnet_matches_reference_and_survives_conversion(ref, tmp_path, linear_class):
    src = T.write_bitnet(tmp_path / "bitnet", config=ODD_N, linear_class=linear_class)
    dst = tmp_path / "canon"
    report = convert(src, dst, source_format="bitnet")
    assert report.scale == "tensor" and report.modules == 14
    t = _tensors(src)
    for name in T.linear_names(ODD_N)[:7]:
        n = 6 if name.endswith(("k_proj", "v_proj")) else None
        packed = t[f"{name}.weight"].numpy()
        scale = float(t[f"{name}.weight_scale"].float())
        want = _f32(ref.bitnet(packed, scale, n or packed.shape[0] * 4,
                               linear_class or "bitlinear"))
        assert torch.equal(dequantize(src, name), want), name
        assert torch.equal(dequantize(dst, name), want), name
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc == {"quant_method": "ternary", "version": 1, "scale": "tensor",
                  "group_size": None, "activation": "int8_per_token",
                  "modules_to_not_convert": ["lm_head"]}
    assert (dst / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()


def test_dense_convert_equals_quantize(ref, tmp_path):
    src = T.write_dense(tmp_path / "dense", dtype=torch.bfloat16, max_shard_bytes=6000)
    dst = tmp_path / "canon"
    report = convert(src, dst, max_shard_bytes=3000)
    assert report.source_format == "dense" and report.modules == 14 and len(report.shards) > 1
    out = _tensors(dst)
    for name in T.linear_names(T.llama_config()):
        w = dequantize(src, name)
        assert w.dtype == torch.float32
        codes, scale = quantize(w)
        assert torch.equal(dequantize(dst, name), codes.float() * scale[:, None]), name
    # everything that is not a linear layer is copied bit for bit
    src_t = _tensors(src)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                 "model.layers.1.input_layernorm.weight"):
        assert out[name].dtype == torch.bfloat16 and torch.equal(out[name], src_t[name])
    # the all-zero row of every down_proj stays exactly zero with a valid scale
    down = "model.layers.0.mlp.down_proj"
    assert torch.equal(out[f"{down}.weight_scale"][0], torch.tensor(1.0))
    assert not dequantize(dst, down)[0].any()


@pytest.mark.parametrize("code_map", list(CODE_MAPS))
def test_vendor_int8_detects_code_map_and_real_group_size(ref, tmp_path, code_map):
    # real groups of 16, scale columns stored per 8 and config.json claiming 32
    src = T.write_vendor_int8(tmp_path / "v", code_map=code_map, group_size=16,
                              stored_group_size=8, stated_group_size=32)
    ckpt = Checkpoint(src)
    assert ckpt.state["code_map"] == code_map
    assert ckpt.state["code_map_evidence"].startswith("detected")
    t = _tensors(src)
    for mod in ckpt:
        assert mod.group_size == 16
        assert "runs of 2 columns, so the real group size is 16" in mod.info["note"]
        want = ref.vendor_int8(t[f"{mod.name}.weight"].numpy(),
                               t[f"{mod.name}.weight_scale"].numpy(), CODE_MAPS[code_map], 8)
        assert torch.equal(mod.dense(), _f32(want)), mod.name
    dst = tmp_path / "canon"
    report = convert(src, dst)
    assert (report.scale, report.group_size) == ("group", 16)
    # how the group size was read reaches the report, as the code map does
    groups = [n for n in report.notes if n.startswith("scale of ")]
    assert sum(int(n.split()[2]) for n in groups) == 14, report.notes
    assert all("so the real group size is 16 (config.json states 32)" in n for n in groups)
    for name in T.linear_names(T.llama_config()):
        assert torch.equal(dequantize(dst, name), dequantize(src, name)), name


def test_vendor_int8_per_channel_scale_with_a_stated_group_size(ref, tmp_path):
    src = T.write_vendor_int8(tmp_path / "v", code_map="zero-pos-neg", stated_group_size=8)
    mods = list(Checkpoint(src))
    assert all(m.group_size == 0 and m.scale.shape == (m.n,) for m in mods)
    assert "config.json states group_size 8" in mods[0].info["note"]


def test_vendor_int8_repeated_columns_everywhere_are_a_channel_scale(ref, tmp_path):
    src = T.write_vendor_int8(tmp_path / "v", group_size=64, stored_group_size=8)
    mods = list(Checkpoint(src))
    # K=32 or 64 with real group 64: every stored column of a row is the same value
    assert all(m.group_size == 0 for m in mods)
    report = convert(src, tmp_path / "canon")
    assert report.scale == "channel"


def test_vendor_int8_overrides(ref, tmp_path):
    src = T.write_vendor_int8(tmp_path / "v", code_map="neg-zero-pos", zero_fraction=1 / 3,
                              group_size=8)
    name = "model.layers.0.mlp.up_proj"
    forced = dequantize(src, name, code_map="zero-pos-neg", group_size=8)
    t = _tensors(src)
    want = ref.vendor_int8(t[f"{name}.weight"].numpy(), t[f"{name}.weight_scale"].numpy(),
                           CODE_MAPS["zero-pos-neg"], 8)
    assert torch.equal(forced, _f32(want))


def test_iter_modules_yields_canonical_layout(ref, tmp_path):
    src = T.write_bitnet(tmp_path / "b", linear_class="autobitlinear", max_shard_bytes=3000)
    seen = 0
    for name, packed, scale, group_size in iter_modules(src):
        assert packed.dtype == torch.uint8 and scale.dtype == torch.float32
        assert scale.shape == (1,) and group_size == 0
        from ternary import ops

        assert torch.equal(ops.dequantize(packed, scale, 0), dequantize(src, name))
        seen += 1
    assert seen == 14


def test_not_convert_keeps_a_module_dense(ref, tmp_path):
    src = T.write_bitnet(tmp_path / "b")
    dst = tmp_path / "c"
    layer = "model.layers.1.mlp"
    report = convert(src, dst, not_convert=[layer])
    assert report.kept_dense == [f"{layer}.{p}" for p in ("down_proj", "gate_proj", "up_proj")]
    out = _tensors(dst)
    assert out[f"{layer}.up_proj.weight"].dtype == torch.float32
    assert f"{layer}.up_proj.weight_scale" not in out
    assert torch.equal(out[f"{layer}.up_proj.weight"], dequantize(src, f"{layer}.up_proj"))
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert layer in qc["modules_to_not_convert"]
    assert len(list(Checkpoint(dst))) == 11


def test_convert_leaves_weight_files_behind_at_any_depth(tmp_path):
    # Meta's repositories keep the original dense weights in original/ beside the tokenizer
    src = T.write_bitnet(tmp_path / "bitnet")
    (src / "original").mkdir()
    (src / "original" / "consolidated.00.pth").write_bytes(bytes(64))
    (src / "original" / "tokenizer.model").write_bytes(b"tok")
    (src / "original" / ".cache").mkdir()
    report = convert(src, tmp_path / "out")
    got = sorted(p.relative_to(tmp_path / "out").as_posix()
                 for p in (tmp_path / "out" / "original").rglob("*"))
    assert got == ["original/tokenizer.model"], got
    assert "original" in report.files_copied
