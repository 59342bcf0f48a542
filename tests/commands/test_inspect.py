"""`ternary inspect`: format, modules and every problem, as a table or JSON."""

from __future__ import annotations

import json

from ternary.cli import main
from ternary.formats import testing as T

UP = "model.layers.1.mlp.up_proj"
Q = "model.layers.0.self_attn.q_proj"
DOWN = "model.layers.0.mlp.down_proj"


def _json(capsys, *argv) -> tuple[int, dict]:
    rc = main(["inspect", *map(str, argv), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_inspect_canonical_json(tmp_path, capsys):
    d = T.write_canonical(tmp_path / "m", scale="group", group_size=8)
    rc, r = _json(capsys, d)
    assert rc == 0 and r["ok"] and r["format"] == "ternary" and not r["problems"]
    assert r["quantization_config"]["group_size"] == 8
    mods = {m["module"]: m for m in r["modules"]}
    assert len(mods) == 14
    up = mods[UP]
    assert up["shape"] == [64, 32] and up["stored"] == "U8 [64, 8]" and up["group_size"] == 8
    assert sum(up["histogram"].values()) == 64 * 32


def test_inspect_bitnet_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich's table width when stdout is not a terminal
    d = T.write_bitnet(tmp_path / "m", config=T.llama_config(head_dim=6, num_key_value_heads=1),
                       linear_class="autobitlinear")
    assert main(["inspect", str(d)]) == 0
    out = capsys.readouterr().out
    assert "format bitnet" in out and "autobitlinear" in out and "no problems found" in out
    assert "N=6 from config.json" in out


def test_inspect_vendor_reports_detection(tmp_path, capsys):
    d = T.write_vendor_int8(tmp_path / "m", code_map="zero-pos-neg", group_size=16,
                            stored_group_size=8, stated_group_size=8)
    rc, r = _json(capsys, d)
    assert rc == 0 and r["detected"]["code_map"] == "zero-pos-neg"
    assert r["detected"]["code_map_evidence"].startswith("detected: code counts")
    assert {m["group_size"] for m in r["modules"]} == {16}
    assert "real group size is 16 (config.json states 8)" in r["modules"][0]["note"]


def test_inspect_lists_every_problem(tmp_path, capsys):
    d = T.write_canonical(tmp_path / "m")
    w = T.load_tensor(d, f"{UP}.weight")
    w[0, 0] = 0xFF
    s = T.load_tensor(d, f"{Q}.weight_scale")
    s[3] = float("nan")
    T.rewrite_tensors(d, {f"{UP}.weight": w, f"{Q}.weight_scale": s,
                          f"{DOWN}.weight_scale": None})
    rc, r = _json(capsys, d)
    assert rc == 1 and not r["ok"] and len(r["modules"]) == 11
    by_tensor = {p["tensor"]: p for p in r["problems"]}
    assert set(by_tensor) == {f"{UP}.weight", f"{Q}.weight_scale", f"{DOWN}.weight_scale"}
    assert "codes are 3" in by_tensor[f"{UP}.weight"]["problem"]
    assert by_tensor[f"{UP}.weight"]["file"].endswith("model.safetensors")
    assert "NaN" in by_tensor[f"{Q}.weight_scale"]["problem"]
    assert by_tensor[f"{DOWN}.weight_scale"]["problem"].startswith("missing scale")
    assert main(["inspect", str(d)]) == 1
    out = capsys.readouterr().out
    assert "3 problem(s)" in out and "codes are 3" in out


def test_inspect_unreadable_checkpoint(tmp_path, capsys):
    d = T.write_dense(tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-64])
    rc, r = _json(capsys, d)
    assert rc == 1 and r["format"] is None
    assert "truncated safetensors file" in r["problems"][0]["problem"]


def test_inspect_dense_and_vendor_override(tmp_path, capsys):
    rc, r = _json(capsys, T.write_dense(tmp_path / "d"))
    assert rc == 0 and r["format"] == "dense" and len(r["modules"]) == 14
    v = T.write_vendor_int8(tmp_path / "v", zero_fraction=1 / 3)
    rc, r = _json(capsys, v)
    assert rc == 1 and "--code-map" in r["problems"][0]["hint"]
    rc, r = _json(capsys, v, "--code-map", "neg-zero-pos")
    assert rc == 0 and r["detected"]["code_map_evidence"] == "override"


def test_group_size_must_be_positive(tmp_path, capsys):
    import pytest

    d = T.write_vendor_int8(tmp_path / "m", group_size=8)
    for argv in (["inspect", str(d), "--group-size", "0"],
                 ["convert", str(d), str(tmp_path / "out"), "--group-size", "-8"],
                 ["convert", str(d), str(tmp_path / "out"), "--max-shard-size", "x"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert ("is not a positive integer" in err or "is not an integer" in err), err
    assert not (tmp_path / "out").exists()
