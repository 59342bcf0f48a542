"""Malformed structure around the tensors (config.json, safetensors headers, the index,
override values): each raises FormatError naming the file and the problem, and `inspect`
reports it, never a Python error from deep inside a reader."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from ternary.formats import Checkpoint, FormatError, dequantize
from ternary.formats import testing as T
from ternary.formats.convert import convert
from ternary.formats.inspection import inspect

UP = "model.layers.1.mlp.up_proj"
K_PROJ = "model.layers.0.self_attn.k_proj"


def refused(model_dir, *fragments, file="config.json", tensor=None, **kw) -> FormatError:
    """Checkpoint(...) and inspect both name the problem; inspect does not raise."""
    with pytest.raises(FormatError) as info:
        Checkpoint(model_dir, **kw)
    e = info.value
    assert e.file.endswith(file) and e.tensor == tensor, str(e)
    for f in fragments:
        assert f in str(e), str(e)
    report = inspect(model_dir, **kw)
    assert not report["ok"] and report["problems"][0]["problem"] == e.problem
    return e


@pytest.mark.parametrize("config,words", [
    ([], "is a JSON list, not an object"),
    ({"quantization_config": "ternary"}, "quantization_config is 'ternary', not an object"),
    ({"text_config": 3}, "text_config is 3, not an object"),
])
def test_config_not_an_object(tmp_path, config, words):
    d = T.write_canonical(tmp_path / "m")
    (d / "config.json").write_text(json.dumps(config))
    refused(d, words, "fix")


@pytest.mark.parametrize("key,value", [
    ("num_key_value_heads", [1, 1]),  # per-layer lists (some models)
    ("num_key_value_heads", "two"), ("head_dim", 0),  # transformers writes 0 for NoPE (glm5)
    ("num_attention_heads", 0), ("intermediate_size", 64.5), ("hidden_size", True),
    ("shared_expert_intermediate_size", 0),  # vLLM: 0 = no shared expert
])
def test_config_size_not_usable_leaves_its_projections_unchecked(tmp_path, key, value):
    # k / v_proj are N = 8 here, which the fallbacks (kv = heads = 4, head_dim = 8) would
    # call wrong: a present but unusable size must not be replaced by a guess, nor crash
    d = T.write_canonical(tmp_path / "m", config=T.llama_config(num_key_value_heads=1))
    T.edit_config(d, **{key: value})
    report = inspect(d)
    assert report["ok"], report["problems"]
    assert len(report["modules"]) == 14


def _write_raw_shard(path, header: object, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("header,tensor,words", [
    ([1, 2], None, "safetensors header is a JSON list"),
    ({"x": [0]}, "x", "a JSON list instead of an object"),
    ({"x": {"shape": [2], "data_offsets": [0, 8]}}, "x", "no 'dtype'"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}}, "x",
     "data_offsets ['0', '8'] is not [begin, end]"),
    ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, "x",
     "shape [-2] is not a list of non-negative integers"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "y",
     "overlap the previous tensor"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "x", "leave a gap"),
])
def test_malformed_header(tmp_path, header, tensor, words):
    d = T.write_canonical(tmp_path / "m")
    _write_raw_shard(d / "extra.safetensors", header, bytes(16))
    refused(d, "re-download or re-write", words, file="extra.safetensors", tensor=tensor)


def test_tensor_safetensors_cannot_read(tmp_path):
    # a dtype this checker does not size, which safetensors itself refuses on open
    d = T.write_dense(tmp_path / "m")
    _write_raw_shard(d / "extra.safetensors",
                     {"odd.weight": {"dtype": "U2", "shape": [4, 4], "data_offsets": [0, 4]}},
                     bytes(4))
    with Checkpoint(d) as ckpt, pytest.raises(FormatError,
                                              match="safetensors cannot read it") as info:
        ckpt.files.get("odd.weight")
    assert info.value.file.endswith("extra.safetensors") and info.value.tensor == "odd.weight"
    with pytest.raises(FormatError, match="safetensors cannot read it"):
        convert(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_index_weight_map_entry_not_a_file_name(tmp_path):
    d = T.write_canonical(tmp_path / "m", max_shard_bytes=4000)
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"][f"{UP}.weight"] = None
    index.write_text(json.dumps(data))
    refused(d, "weight_map gives None as its file", file=index.name, tensor=f"{UP}.weight")
    data["weight_map"] = ["a"]
    index.write_text(json.dumps(data))
    refused(d, "weight_map is a JSON list", file=index.name)


def refused_model(model_dir, words, **kw) -> FormatError:
    """A model-level problem found on open: reading a module raises it, inspect lists it."""
    with pytest.raises(FormatError) as info:
        dequantize(model_dir, UP, **kw)
    e = info.value
    assert e.file.endswith("config.json") and e.tensor is None and words in str(e), str(e)
    assert words in inspect(model_dir, **kw)["problems"][0]["problem"]
    return e


@pytest.mark.parametrize("stated", ["8", 2.5, True])
def test_vendor_stated_group_size_not_an_integer(tmp_path, stated):
    d = T.write_vendor_int8(tmp_path / "m", group_size=8)
    want = dequantize(d, UP)
    T.edit_config(d, quantization_config={"quant_method": "vendor-int8", "group_size": stated})
    e = refused_model(d, f"quantization_config.group_size is {stated!r}; expected an integer")
    assert "--group-size" in e.record.hint
    # ... and the override the hint names does settle it
    assert torch.equal(dequantize(d, UP, group_size=8), want)
    assert inspect(d, group_size=8)["ok"]


@pytest.mark.parametrize("stated", [-1, 0])
def test_vendor_stated_group_size_none_as_gptq_writes_it(tmp_path, stated):
    # GPTQ / AWQ-style configs write -1 (or 0) for "no groups": read as not stated, so the
    # scale columns tell
    d = T.write_vendor_int8(tmp_path / "m", group_size=8)
    want = dequantize(d, UP)
    T.edit_config(d, quantization_config={"quant_method": "vendor-int8", "group_size": stated})
    assert torch.equal(dequantize(d, UP), want)
    report = inspect(d)
    assert report["ok"] and report["detected"]["code_map"] == "neg-zero-pos"
    assert {m["group_size"] for m in report["modules"]} == {8}


@pytest.mark.parametrize("override", [0, -8])
def test_vendor_group_size_override_not_positive(tmp_path, override):
    d = T.write_vendor_int8(tmp_path / "m", group_size=8)
    refused_model(d, f"group_size override is {override}; expected a positive integer",
                  group_size=override)


def test_vendor_scale_without_columns(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m", group_size=8)
    T.rewrite_tensors(d, {f"{UP}.weight_scale": torch.ones(64, 0)})
    with pytest.raises(FormatError, match=r"scale shape \[64, 0\] has no columns") as info:
        dequantize(d, UP)
    assert info.value.tensor == f"{UP}.weight_scale"


def test_convert_destination_is_a_file(tmp_path):
    src = T.write_bitnet(tmp_path / "b")
    (tmp_path / "out").write_text("x")
    with pytest.raises(FormatError, match="destination exists and is not a directory"):
        convert(src, tmp_path / "out")


def test_moe_experts_use_their_own_width(tmp_path):
    # Qwen2-MoE names: experts.i.* are moe_intermediate_size wide, shared_expert.* are
    # shared_expert_intermediate_size wide; neither is intermediate_size
    config = T.llama_config(intermediate_size=64)
    config.update(moe_intermediate_size=16, shared_expert_intermediate_size=24)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, n in (("model.layers.0.mlp.experts.0.up_proj", 16),
                    ("model.layers.0.mlp.experts.1.gate_proj", 16),
                    ("model.layers.0.mlp.shared_expert.up_proj", 24)):
        tensors[f"{name}.weight"] = torch.randn(n, 32, generator=g)
    tensors["model.layers.0.mlp.experts.0.down_proj.weight"] = torch.randn(32, 16, generator=g)
    d = T.write_model(tmp_path / "moe", config, tensors)
    report = inspect(d)
    assert report["ok"], report["problems"]
    assert len(report["modules"]) == 4
    out = convert(d, tmp_path / "c")
    assert out.modules == 4
    # a wrong expert width is still caught, against moe_intermediate_size
    config["moe_intermediate_size"] = 12
    (d / "config.json").write_text(json.dumps(config))
    problems = inspect(d)["problems"]
    assert len(problems) == 3 and all("moe_intermediate_size=12" in p["problem"]
                                      for p in problems)


def test_inspect_lists_data_problems_under_a_bad_quantization_config(tmp_path):
    d = T.write_canonical(tmp_path / "m")
    s = T.load_tensor(d, f"{UP}.weight_scale")
    s[0] = float("nan")
    T.rewrite_tensors(d, {f"{UP}.weight_scale": s})
    T.edit_config(d, quantization_config={"quant_method": "ternary", "version": 2})
    found = [p["problem"] for p in inspect(d)["problems"]]
    assert any("version is 2" in p for p in found) and any("NaN" in p for p in found), found

    b = T.write_bitnet(tmp_path / "b")
    w = T.load_tensor(b, f"{UP}.weight")
    w[0, 0] = 0xFF
    T.rewrite_tensors(b, {f"{UP}.weight": w})
    T.edit_config(b, quantization_config={"quant_method": "bitnet", "linear_class": "fancy"})
    found = [p["problem"] for p in inspect(b)["problems"]]
    assert any("linear_class is 'fancy'" in p for p in found), found
    assert any("codes are 3" in p for p in found), found


def test_bitnet_without_n_in_config_and_padded_rows(tmp_path):
    # k_proj with N = 6 packs into 2 byte rows = 8 rows; without config.json's sizes the
    # two zero-padded rows would read as w = -1
    config = T.llama_config(head_dim=6, num_key_value_heads=1)  # k_proj N = 6
    d = T.write_bitnet(tmp_path / "b", config=config)
    n = dequantize(d, K_PROJ).shape[0]
    assert n % 4, f"the test needs an N that is not a multiple of 4, got {n}"
    cfg = json.loads((d / "config.json").read_text())
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        cfg.pop(key, None)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="config.json does not give N") as info:
        dequantize(d, K_PROJ)
    assert info.value.tensor == f"{K_PROJ}.weight"
    assert f"N is anywhere from {n}" in str(info.value)


@pytest.mark.parametrize("kw", [{"code_map": "neg-zero-pos"}, {"group_size": 8}])
def test_vendor_overrides_on_another_format(tmp_path, kw):
    d = T.write_bitnet(tmp_path / "b")
    refused(d, "settle vendor-int8 checkpoints and this one is 'bitnet'", **kw)


def test_vendor_format_alias(tmp_path):
    d = T.write_vendor_int8(tmp_path / "m")
    assert Checkpoint(d, format="vendor_int8").format == "vendor-int8"


@pytest.mark.parametrize("with_index", [True, False])
def test_inspect_goes_on_past_a_truncated_shard(tmp_path, with_index):
    from ternary.formats.files import INDEX, ModelFiles

    d = T.write_canonical(tmp_path / "m", max_shard_bytes=1)  # a shard a tensor
    scale = T.load_tensor(d, f"{UP}.weight_scale")
    scale[5] = float("nan")
    T.rewrite_tensors(d, {f"{UP}.weight_scale": scale})
    # the shard truncated holds a module's scale; the module's weight is in another
    victim = "model.layers.0.mlp.gate_proj"
    with ModelFiles(d) as files:
        bad = files.file_of(f"{victim}.weight_scale")
        assert files.file_of(f"{victim}.weight") != bad
        lost = {t for t in files.names() if files.file_of(t) == bad}
    bad.write_bytes(bad.read_bytes()[:20])
    if not with_index:  # shards found by name: what the bad one held is unknown
        (d / INDEX).unlink()
    report = inspect(d)
    found = report["problems"]
    assert found[0]["file"] == str(bad) and "truncated" in found[0]["problem"], found
    # the other shards are still read: the NaN scale is found too
    assert any(p["tensor"] == f"{UP}.weight_scale" and "NaN" in p["problem"] for p in found)
    missing = [p for p in found if "missing" in p["problem"]]
    if with_index:  # the index says the scale is in the bad shard: its problem covers it
        assert not missing, found
    else:
        assert [p["tensor"] for p in missing] == [f"{victim}.weight_scale"], found
        assert f"{bad.name} could not be read and may hold it" in missing[0]["problem"]
    read = {m["module"] for m in report["modules"]}
    assert read and victim not in read and not any(f"{m}.weight" in lost for m in read)
    # reading the model (not inspecting it) still refuses at once
    with pytest.raises(FormatError, match="truncated"):
        Checkpoint(d)


def test_inspect_lists_every_unreadable_shard(tmp_path):
    d = T.write_canonical(tmp_path / "m", max_shard_bytes=4000)
    shards = sorted(d.glob("model-*.safetensors"))
    for sh in shards:
        sh.write_bytes(sh.read_bytes()[:20])
    report = inspect(d)
    assert not report["ok"] and report["format"] is None
    assert [p["file"] for p in report["problems"]] == [str(sh) for sh in shards]


def test_shape_check_skips_other_encoders_and_latent_attention(tmp_path):
    # Gemma-3-style: the text sizes sit in text_config, and a vision tower's q_proj has
    # its own; DeepSeek-style MLA: q_proj / o_proj widths are not heads * head_dim
    from ternary.formats.modules import expected_shape

    text = T.llama_config()
    mm = {"text_config": text, "vision_config": {"hidden_size": 48}}
    assert expected_shape(mm, "language_model.model.layers.0.self_attn.q_proj") == \
        expected_shape(text, "model.layers.0.self_attn.q_proj") is not None
    for tower in ("vision_tower.vision_model.encoder.layers.0.self_attn.q_proj",
                  "visual.blocks.0.attn.qkv_proj", "multi_modal_projector.mm_input_proj"):
        assert expected_shape(mm, tower) is None, tower
    mla = {**text, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 4}
    assert expected_shape(mla, "model.layers.0.self_attn.q_proj") is None
    why = "hidden_size=32, intermediate_size=64"
    assert expected_shape(mla, "model.layers.0.mlp.up_proj") == ((64, 32), why)
    # end to end: a dense multimodal-style checkpoint converts, its vision q_proj included
    g = torch.Generator().manual_seed(0)
    d = T.write_model(tmp_path / "mm", mm, {
        "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight":
            torch.randn(48, 48, generator=g),
        "language_model.model.layers.0.mlp.up_proj.weight": torch.randn(64, 32, generator=g)})
    report = inspect(d)
    assert report["ok"] and len(report["modules"]) == 2, report["problems"]


def test_modules_to_not_convert_must_be_a_list(tmp_path):
    d = T.write_canonical(tmp_path / "m")
    T.edit_config(d, quantization_config={**json.loads((d / "config.json").read_text())[
        "quantization_config"], "modules_to_not_convert": "lm_head"})
    e = refused_model(d, "modules_to_not_convert is 'lm_head'; expected a list of names")
    assert '["lm_head"]' in e.record.hint


@pytest.mark.parametrize("writer", [T.write_canonical, T.write_bitnet, T.write_vendor_int8])
def test_a_module_listed_as_dense_but_stored_packed(tmp_path, writer):
    d = writer(tmp_path / "m")
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    T.edit_config(d, quantization_config={**qc, "modules_to_not_convert": ["mlp.down_proj"]})
    found = [p for p in inspect(d)["problems"] if "stored packed" in p["problem"]]
    assert [p["tensor"] for p in found] == [f"model.layers.{i}.mlp.down_proj.weight"
                                            for i in range(2)], found
    assert "modules_to_not_convert (['mlp.down_proj']) lists it" in found[0]["problem"]
    with pytest.raises(FormatError, match="stored packed"):
        dequantize(d, "model.layers.1.mlp.down_proj")
    if writer is not T.write_canonical:  # the contradiction is not carried into a result
        with pytest.raises(FormatError, match="stored packed"):
            convert(d, tmp_path / "out")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("writer", [T.write_canonical, T.write_bitnet])
def test_a_fused_layer_listed_in_part(tmp_path, writer):
    # vLLM loads q/k/v_proj as one layer: listing only q_proj is refused by the plugin
    d = writer(tmp_path / "m")
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    T.edit_config(d, quantization_config={**qc, "modules_to_not_convert": ["self_attn.q_proj"]})
    found = [p for p in inspect(d)["problems"] if "loads as one layer" in p["problem"]]
    if writer is T.write_canonical:
        assert len(found) == 2 and found[0]["file"].endswith("config.json"), found
        assert ("lists ['model.layers.0.self_attn.q_proj'] but not "
                "['model.layers.0.self_attn.k_proj', 'model.layers.0.self_attn.v_proj']"
                in found[0]["problem"]), found[0]
    else:
        # bitnet is a source format: its q_proj then fails as "stored packed"; the same
        # split arrives from --not-convert below
        assert not found


def test_convert_refuses_to_write_a_fused_layer_in_part(tmp_path):
    d = T.write_bitnet(tmp_path / "m")
    with pytest.raises(FormatError, match="loads as one layer 'model.layers.0.self_attn.qkv_proj'"
                       ) as info:
        convert(d, tmp_path / "out", not_convert=["model.layers.0.self_attn.q_proj"])
    assert "--not-convert for all of them" in str(info.value)
    assert not (tmp_path / "out").exists()
    report = convert(d, tmp_path / "out", not_convert=["self_attn.q_proj", "self_attn.k_proj",
                                                       "self_attn.v_proj"])
    assert len(report.kept_dense) == 6 and inspect(tmp_path / "out")["ok"]


@pytest.mark.parametrize("writer", [T.write_bitnet, T.write_vendor_int8])
def test_source_modules_to_not_convert_must_be_a_list(tmp_path, writer):
    d = writer(tmp_path / "m")
    qc = json.loads((d / "config.json").read_text())["quantization_config"]
    T.edit_config(d, quantization_config={**qc, "modules_to_not_convert": "lm_head"})
    e = refused_model(d, "modules_to_not_convert is 'lm_head'; expected a list of names")
    assert '["lm_head"]' in e.record.hint
    with pytest.raises(FormatError, match="expected a list of names"):
        convert(d, tmp_path / "out")


def test_dense_modules_to_not_convert_at_the_top_level(tmp_path):
    # some dense exports keep the list beside the model's own keys: the result lists it too
    d = T.write_dense(tmp_path / "m")
    T.edit_config(d, modules_to_not_convert=["mlp.down_proj"])
    convert(d, tmp_path / "out")
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert "mlp.down_proj" in qc["modules_to_not_convert"], qc
    assert inspect(tmp_path / "out")["ok"]
    down = T.load_tensor(tmp_path / "out", "model.layers.0.mlp.down_proj.weight")
    assert down.is_floating_point(), down.dtype
    T.edit_config(d, modules_to_not_convert="down_proj")
    problem = inspect(d)["problems"][0]["problem"]
    assert problem.startswith("modules_to_not_convert is 'down_proj'; expected a list"), problem
    with pytest.raises(FormatError, match="expected a list of names"):
        convert(d, tmp_path / "out2")


def test_safetensors_metadata_not_strings(tmp_path):
    # safetensors refuses to open such a file; inspect names it instead of a traceback
    d = T.write_dense(tmp_path / "m")
    _write_raw_shard(d / "extra.safetensors",
                     {"__metadata__": {"format": 1},
                      "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8))
    refused(d, "__metadata__ must map names to strings", "{'format': 1}",
            file="extra.safetensors")


@pytest.mark.parametrize("kind", ["dangling link", "directory"])
def test_shard_that_is_not_a_readable_file(tmp_path, kind):
    d = T.write_canonical(tmp_path / "m")
    bad = d / "extra.safetensors"
    if kind == "directory":
        bad.mkdir()
    else:
        bad.symlink_to(tmp_path / "blobs" / "gone")
    e = refused(d, "cannot read it", file="extra.safetensors")
    assert "re-download" in e.record.hint
    with pytest.raises(FormatError, match="cannot read it"):
        convert(d, tmp_path / "out")


def test_inspect_goes_on_past_a_tensor_safetensors_cannot_read(tmp_path):
    # the header checks pass but safetensors refuses the data (a dtype this checker does
    # not size): inspect lists it with the others instead of stopping with a traceback
    d = T.write_canonical(tmp_path / "m")
    down = "model.layers.9.mlp.down_proj"
    _write_raw_shard(d / "extra.safetensors",
                     {"odd": {"dtype": "U2", "shape": [4, 4], "data_offsets": [0, 4]},
                      f"{down}.weight": {"dtype": "U8", "shape": [32, 16],
                                         "data_offsets": [4, 516]},
                      f"{down}.weight_scale": {"dtype": "F32", "shape": [32],
                                               "data_offsets": [516, 644]}}, bytes(644))
    report = inspect(d)
    assert not report["ok"] and len(report["modules"]) == 14, report["problems"]
    assert [(p["tensor"], p["file"].rsplit("/", 1)[1]) for p in report["problems"]] == [
        (f"{down}.weight", "extra.safetensors")], report["problems"]
    assert "safetensors cannot read it" in report["problems"][0]["problem"]
