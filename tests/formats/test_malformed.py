"""Every malformed input raises FormatError naming the file, the tensor and the problem."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from ternary.formats import Checkpoint, FormatError, dequantize
from ternary.formats import testing as T
from ternary.formats.convert import convert
from ternary.formats.files import ShardWriter

Q = "model.layers.0.self_attn.q_proj"
UP = "model.layers.1.mlp.up_proj"
WRITERS = {"ternary": T.write_canonical, "bitnet": T.write_bitnet,
           "vendor-int8": T.write_vendor_int8}


def expect(model_dir, module, tensor, *fragments, file="model.safetensors", **kw):
    with pytest.raises(FormatError) as info:
        dequantize(model_dir, module, **kw)
    e = info.value
    assert isinstance(e, ValueError)
    assert e.tensor == tensor, str(e)
    assert e.file.endswith(file), str(e)
    for f in fragments:
        assert f in str(e), str(e)
    return e


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_code_3(tmp_path, fmt):
    d = WRITERS[fmt](tmp_path / "m")
    w = T.load_tensor(d, f"{UP}.weight")
    w.view(torch.uint8)[3, 1] = 3 if fmt == "vendor-int8" else 0xFF
    T.rewrite_tensors(d, {f"{UP}.weight": w})
    expect(d, UP, f"{UP}.weight", "codes are 3, which is invalid")


@pytest.mark.parametrize("fmt,value,word", [("ternary", float("nan"), "NaN"),
                                            ("bitnet", float("inf"), "inf"),
                                            ("vendor-int8", 0.0, "zero")])
def test_bad_scale_values(tmp_path, fmt, value, word):
    d = WRITERS[fmt](tmp_path / "m")
    s = T.load_tensor(d, f"{UP}.weight_scale")
    s.view(-1)[0] = value
    T.rewrite_tensors(d, {f"{UP}.weight_scale": s})
    expect(d, UP, f"{UP}.weight_scale", f"scale values are {word}", "must be finite and non-zero")


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_shape_contradicts_config(tmp_path, fmt):
    d = WRITERS[fmt](tmp_path / "m")
    T.edit_config(d, intermediate_size=72 if fmt != "bitnet" else 64, hidden_size=32)
    if fmt == "bitnet":  # N agrees with the packing, K does not
        T.edit_config(d, intermediate_size=64, hidden_size=32)
        w = T.load_tensor(d, f"{UP}.weight")
        T.rewrite_tensors(d, {f"{UP}.weight": torch.cat([w, w], dim=1)})
        expect(d, UP, f"{UP}.weight", "weight': K=64 contradicts config.json",
               "intermediate_size=64", "which gives K=32")
    else:
        expect(d, UP, f"{UP}.weight", "contradicts config.json", "[N=72, K=32]")


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_missing_scale(tmp_path, fmt):
    d = WRITERS[fmt](tmp_path / "m")
    T.rewrite_tensors(d, {f"{UP}.weight_scale": None})
    # named against the shard that holds the module's weight, where the scale belongs
    expect(d, UP, f"{UP}.weight_scale", "missing", f"must store {UP}.weight_scale")


@pytest.mark.parametrize("fmt,tensor,bad,want", [
    ("ternary", "weight", torch.int8, "U8"), ("ternary", "weight_scale", torch.float16, "F32"),
    ("bitnet", "weight", torch.int8, "U8"), ("bitnet", "weight_scale", torch.int32, "BF16"),
    ("vendor-int8", "weight", torch.uint8, "I8"),
    ("vendor-int8", "weight_scale", torch.bfloat16, "F32")])
def test_wrong_dtype(tmp_path, fmt, tensor, bad, want):
    d = WRITERS[fmt](tmp_path / "m")
    name = f"{UP}.{tensor}"
    T.rewrite_tensors(d, {name: T.load_tensor(d, name).to(bad)})
    if fmt == "vendor-int8" and tensor == "weight":
        # a uint8 weight with a scale reads as another format only with config.json saying so
        expect(d, UP, name, "wrong dtype U8", want)
    else:
        expect(d, UP, name, "wrong dtype", want)


@pytest.mark.parametrize("chop,words", [(100, "the tensors need"), (None, "header says")])
def test_truncated_file(tmp_path, chop, words):
    d = T.write_canonical(tmp_path / "m", max_shard_bytes=4000)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-chop] if chop else data[:20])
    with pytest.raises(FormatError, match="truncated safetensors file") as info:
        dequantize(d, Q)
    assert info.value.file == str(shard) and words in str(info.value)
    shard.write_bytes(data[:5])
    with pytest.raises(FormatError, match="shorter than the 8-byte header length"):
        Checkpoint(d)


def test_header_byte_count_wrong(tmp_path):
    d = T.write_canonical(tmp_path / "m")
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (d / "extra.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(FormatError, match=r"header gives 8 bytes for a F32 \[4\] tensor, which "
                       "needs 16"):
        Checkpoint(d)


def test_packing_n_inconsistent(tmp_path):
    # bitnet packs N along rows: config N=56 needs ceil(56/4) = 14 rows, the tensor has 16
    d = T.write_bitnet(tmp_path / "m")
    T.edit_config(d, intermediate_size=56)
    expect(d, UP, f"{UP}.weight", "gives N=56", "ceil(N/4)=14 byte rows, but the tensor has 16")


def test_packing_k_not_multiple_of_4_in_config(tmp_path):
    d = T.write_canonical(tmp_path / "m")
    T.edit_config(d, intermediate_size=62)
    expect(d, "model.layers.1.mlp.down_proj", "model.layers.1.mlp.down_proj.weight",
           "K=62, not a multiple of 4")


def test_packing_scale_disagrees_with_weight(tmp_path):
    d = T.write_canonical(tmp_path / "m", scale="group", group_size=8)
    T.rewrite_tensors(d, {f"{UP}.weight_scale": torch.ones(64, 5)})
    expect(d, UP, f"{UP}.weight_scale", "scale shape [64, 5] does not fit scale='group', "
           "group_size=8", "expected [64, 4]")


def test_convert_refuses_k_not_multiple_of_4(tmp_path):
    config = T.llama_config(intermediate_size=66)  # down_proj K = 66
    src = T.write_bitnet(tmp_path / "b", config=config)
    down = "model.layers.0.mlp.down_proj"
    with pytest.raises(FormatError, match="K=66 is not a multiple of 4") as info:
        convert(src, tmp_path / "c")
    # every such module named at once, with the option that keeps them all dense
    assert info.value.tensor == f"{down}.weight" and "and in 1 more module(s)" in str(info.value)
    assert info.value.record.hint == "keep them dense: --not-convert mlp.down_proj"
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c.*"))
    report = convert(src, tmp_path / "c", not_convert=["mlp.down_proj"])
    assert len(report.kept_dense) == 2
    assert torch.equal(dequantize(tmp_path / "c", down), dequantize(src, down))


def test_not_2d(tmp_path):
    for fmt in WRITERS:
        d = WRITERS[fmt](tmp_path / fmt)
        w = T.load_tensor(d, f"{UP}.weight")
        T.rewrite_tensors(d, {f"{UP}.weight": w.reshape(1, *w.shape)})
        expect(d, UP, f"{UP}.weight", "expected 2-D")


def test_bitnet_scale_not_single_value(tmp_path):
    d = T.write_bitnet(tmp_path / "m")
    T.rewrite_tensors(d, {f"{UP}.weight_scale": torch.ones(2, dtype=torch.bfloat16)})
    expect(d, UP, f"{UP}.weight_scale", "stores one value")


def test_vendor_scale_shape(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m")
    T.rewrite_tensors(d, {f"{UP}.weight_scale": torch.ones(65)})
    expect(d, UP, f"{UP}.weight_scale", "fits neither [N]=[64] nor [N, groups]")


def test_vendor_high_bits(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m")
    w = T.load_tensor(d, f"{UP}.weight")
    w[2, 3] = 0x41
    T.rewrite_tensors(d, {f"{UP}.weight": w})
    expect(d, UP, f"{UP}.weight", "bits above the low two set", "65")


def test_vendor_ambiguous_code_map_names_the_override(tmp_path):
    # all three codes equally frequent: either map fits
    d = T.write_vendor_int8(tmp_path / "m", zero_fraction=1 / 3)
    e = expect(d, UP, None, "cannot tell the vendor-int8 code map", "--code-map neg-zero-pos",
               "--code-map zero-pos-neg", file="config.json")
    assert "code counts 0:" in str(e)
    # stated in config.json: used, and reported as stated
    T.edit_config(d, quantization_config={"quant_method": "vendor-int8",
                                          "code_map": "zero-pos-neg"})
    assert Checkpoint(d).state["code_map_evidence"].startswith("stated by config.json")


def test_vendor_stated_code_map_contradicted(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m", code_map="neg-zero-pos",
                            stated_code_map="zero-pos-neg")
    expect(d, UP, None, "says 'zero-pos-neg' but the codes say 'neg-zero-pos'", file="config.json")
    assert dequantize(d, UP, code_map="neg-zero-pos").shape == (64, 32)


def test_vendor_unknown_code_map_override(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m")
    expect(d, UP, None, "code_map override is 'xyz'", file="config.json", code_map="xyz")


def test_vendor_ambiguous_group_size(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m", group_size=8)
    # 3 columns for K=32 fit group sizes 11..15: nothing in the data says which
    T.rewrite_tensors(d, {f"{UP}.weight_scale": torch.rand(64, 3) + 0.5})
    expect(d, UP, f"{UP}.weight_scale", "cannot tell the group size",
           "fits group sizes [11, 12, 13, 14, 15]", "--group-size")
    assert dequantize(d, UP, group_size=12).shape == (64, 32)
    expect(d, UP, f"{UP}.weight_scale", "group_size override 8 needs 4 scale columns",
           group_size=8)


@pytest.mark.parametrize("qc,words", [
    ({"quant_method": "gptq"}, "'gptq', which vllm-ternary does not read"),
    ({"quant_method": "ternary", "version": 2, "scale": "channel"}, "version is 2"),
    ({"quant_method": "ternary", "version": 1, "scale": "row"}, "scale is 'row'"),
    ({"quant_method": "ternary", "version": 1, "scale": "group"}, "group_size is None"),
    ({"quant_method": "ternary", "version": 1, "scale": "channel", "group_size": 32},
     "group_size is 32 with scale 'channel'"),
    ({"quant_method": "ternary", "version": 1, "scale": "channel", "activation": "int4"},
     "activation is 'int4'; expected one of ['none', 'int8_per_token']"),
])
def test_bad_canonical_config(tmp_path, qc, words):
    d = T.write_canonical(tmp_path / "m")
    T.edit_config(d, quantization_config=qc)
    expect(d, UP, None, words, file="config.json")


@pytest.mark.parametrize("qc,words", [
    ({"quant_method": "bitnet", "linear_class": "fancy"}, "linear_class is 'fancy'"),
    ({"quant_method": "bitnet", "quantization_mode": "sometimes"},
     "quantization_mode is 'sometimes'"),
    ({"quant_method": "bitnet", "use_rms_norm": True}, "use_rms_norm is true"),
    ({"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "online"},
     "stored packed"),
])
def test_bad_bitnet_config(tmp_path, qc, words):
    d = T.write_bitnet(tmp_path / "m")
    T.edit_config(d, quantization_config=qc)
    expect(d, UP, None, words, file="config.json")


def test_packed_without_quantization_config(tmp_path):
    d = T.write_bitnet(tmp_path / "m")
    T.edit_config(d, quantization_config=None)
    expect(d, UP, None, "packing (ternary along K or bitnet along N) is unknown",
           file="config.json")


def test_index_problems(tmp_path):
    d = T.write_canonical(tmp_path / "m", max_shard_bytes=4000)
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["ghost.weight"] = data["weight_map"][f"{UP}.weight"]
    index.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="listed in model.safetensors.index.json but absent"):
        Checkpoint(d)
    data["weight_map"]["ghost.weight"] = "model-00099-of-00099.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="maps to model-00099-of-00099.safetensors, which does "
                       "not exist"):
        Checkpoint(d)
    index.write_text("{}")
    with pytest.raises(FormatError, match="no readable weight_map"):
        Checkpoint(d)


def test_directory_problems(tmp_path):
    with pytest.raises(FormatError, match="not a directory"):
        Checkpoint(tmp_path / "nope")
    (tmp_path / "m").mkdir()
    with pytest.raises(FormatError, match="config.json: missing"):
        Checkpoint(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{")
    with pytest.raises(FormatError, match="not valid JSON"):
        Checkpoint(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(FormatError, match="no \\*.safetensors files"):
        Checkpoint(tmp_path / "m")


def test_tensor_in_two_shards(tmp_path):
    d = T.write_canonical(tmp_path / "m")
    T.write_model(tmp_path / "other", {}, {"model.norm.weight": torch.ones(2)})
    (tmp_path / "other" / "model.safetensors").rename(d / "zz.safetensors")
    with pytest.raises(FormatError, match="tensor also stored in model.safetensors"):
        Checkpoint(d)


def test_dense_problems(tmp_path):
    d = T.write_dense(tmp_path / "m")
    w = T.load_tensor(d, f"{UP}.weight")
    w[1, 1] = float("inf")
    T.rewrite_tensors(d, {f"{UP}.weight": w, f"{Q}.weight": torch.ones(32, 32, dtype=torch.int32)})
    expect(d, UP, f"{UP}.weight", "1 weight values are NaN/inf (first at [n, k] = [1, 1])")
    expect(d, Q, f"{Q}.weight", "wrong dtype I32")
    with pytest.raises(FormatError, match="NaN/inf"):
        convert(d, tmp_path / "c")


def test_not_a_module(tmp_path):
    d = T.write_bitnet(tmp_path / "m")
    with pytest.raises(FormatError, match="not a quantized module of this bitnet checkpoint"):
        dequantize(d, "model.norm")
    # a 2-D float weight kept unquantized (lm_head) reads as it is stored
    assert torch.equal(dequantize(d, "lm_head"), T.load_tensor(d, "lm_head.weight"))


def test_convert_refusals(tmp_path):
    src = T.write_bitnet(tmp_path / "b")
    with pytest.raises(FormatError, match="asked to read it as 'dense' but it is 'bitnet'"):
        convert(src, tmp_path / "c", source_format="dense")
    with pytest.raises(FormatError, match="destination exists and is not empty"):
        convert(src, src)
    canon = tmp_path / "c"
    convert(src, canon)
    with pytest.raises(FormatError, match="already in the canonical ternary format"):
        convert(canon, tmp_path / "d")
    with pytest.raises(FormatError, match="unknown format 'gguf'"):
        Checkpoint(src, format="gguf")


def test_shard_writer_refuses_duplicates(tmp_path):
    w = ShardWriter(tmp_path, 100)
    w.add("a", torch.ones(40))
    w.add("b", torch.ones(40))
    with pytest.raises(ValueError, match="tensor 'a' written twice"):
        w.add("a", torch.ones(1))


def test_canonical_config_defaults(tmp_path):
    # version and scale may be left out: they read as 1 and "channel" (as ternary.vllm.spec)
    d = T.write_canonical(tmp_path / "m")
    T.edit_config(d, quantization_config={"quant_method": "ternary"})
    assert dequantize(d, UP).shape == (64, 32)
