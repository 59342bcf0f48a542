"""`ternary convert`: the command around ternary.formats.convert."""

from __future__ import annotations

import json

import torch

from ternary.cli import main
from ternary.formats import Checkpoint, dequantize
from ternary.formats import testing as T
from ternary.formats.convert import convert


def test_convert_json_report_and_result(tmp_path, capsys):
    src = T.write_vendor_int8(tmp_path / "v", code_map="zero-pos-neg", group_size=16,
                              stored_group_size=8, stated_group_size=8, max_shard_bytes=5000)
    dst = tmp_path / "c"
    assert main(["convert", str(src), str(dst), "--from", "vendor-int8", "--json",
                 "--max-shard-size", "6000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["source_format"] == "vendor-int8" and report["modules"] == 14
    assert (report["scale"], report["group_size"]) == ("group", 16)
    assert report["files_copied"] == ["tokenizer.json"]
    assert len(report["shards"]) > 1 and (dst / "model.safetensors.index.json").exists()
    assert "code map: zero-pos-neg (detected" in report["notes"][0]
    assert len(list(Checkpoint(dst))) == 14
    name = "model.layers.1.self_attn.o_proj"
    assert torch.equal(dequantize(dst, name), dequantize(src, name))


def test_convert_table(tmp_path, capsys):
    src = T.write_dense(tmp_path / "d")
    assert main(["convert", str(src), str(tmp_path / "c"), "--not-convert", "layers.1"]) == 0
    out = capsys.readouterr().out
    assert "(dense)" in out and "modules quantized" in out and "7" in out


def test_convert_error_exit_code(tmp_path, capsys):
    src = T.write_dense(tmp_path / "d")
    assert main(["convert", str(src), str(tmp_path / "c"), "--from", "bitnet"]) == 2
    err = capsys.readouterr().err
    assert "asked to read it as 'bitnet' but it is 'dense'" in err and "--from dense" in err
    assert not (tmp_path / "c").exists()


def test_convert_reports_progress_and_streams(tmp_path):
    src = T.write_bitnet(tmp_path / "b", max_shard_bytes=3000)
    seen = []
    convert(src, tmp_path / "c", progress=lambda done, total, t: seen.append((done, total, t)))
    dones = [d for d, _, _ in seen]
    assert dones == sorted(dones) and dones[-1] == seen[-1][1]
    assert len(seen) == 14 * 2 + 7  # every source tensor once


def test_convert_holds_one_module_of_the_source_at_a_time(tmp_path, monkeypatch):
    """Streaming, measured: the bytes of source tensors alive at any moment stay under one
    output shard plus the two largest tensors, far under the model (a convert that read
    everything first would hold it all)."""
    import weakref

    from ternary.formats.files import ModelFiles

    src = T.write_bitnet(tmp_path / "b", config=T.llama_config(num_hidden_layers=12,
                                                                intermediate_size=256))
    live, peak, total = [0], [0], [0]
    get = ModelFiles.get

    def spy(self, name):
        t = get(self, name)
        size = t.numel() * t.element_size()
        live[0] += size
        total[0] += size
        peak[0] = max(peak[0], live[0])
        weakref.finalize(t, lambda: live.__setitem__(0, live[0] - size))
        return t

    monkeypatch.setattr(ModelFiles, "get", spy)
    shard = 4096
    convert(src, tmp_path / "c", max_shard_bytes=shard)
    with ModelFiles(src) as files:
        sizes = sorted(files.nbytes(t) for t in files.names())
    bound = shard + sizes[-1] + sizes[-2]
    assert total[0] == sum(sizes) > 5 * bound  # every tensor read once; the model is large
    assert peak[0] <= bound, (peak[0], bound, total[0])
    assert len(list((tmp_path / "c").glob("model-*.safetensors"))) > 2
