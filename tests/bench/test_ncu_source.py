"""bench/ncu_source.py on an ncu source-counter CSV of a wgmma_big kernel
(H200, tests/data/ncu-wgmma-big-source-h200.csv.gz): the per-region sums must be the
file's own (the epilogue that each of the 1024 consumer warps ran once held 2923 of the 7394
warp samples, 2115 of them stall_no_inst), and malformed input is refused by name."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "tests/data/ncu-wgmma-big-source-h200.csv.gz"
spec = importlib.util.spec_from_file_location("ncu_source", ROOT / "bench/ncu_source.py")
ncu_source = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu_source)


def test_regions_of_the_wgmma_big_profile(capsys):
    assert ncu_source.main([str(CSV), "--json", "--top", "3"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert "fused_wgmma_big_kernel" in s["kernel"]
    assert s["samples"] == 7394 and s["instructions"] == 7664
    by_exec = {g["executed"]: g for g in s["regions"]}
    loop, epilogue = by_exec[32768], by_exec[1024]
    assert (epilogue["instructions"], epilogue["samples"]) == (2866, 2923)
    assert epilogue["stalls"]["stall_no_inst"] == 2115
    assert loop["samples"] == 3987
    assert sum(g["samples"] for g in s["regions"]) == s["samples"]
    assert [h["samples"] for h in s["hot"]] == sorted((h["samples"] for h in s["hot"]),
                                                     reverse=True)
    assert s["hot"][0]["source"].startswith("HGMMA")


def test_tables_print(capsys):
    assert ncu_source.main([str(CSV), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "2866" in out and "no_inst 2115" in out


def test_a_csv_without_source_counters_is_refused(tmp_path, capsys):
    bad = tmp_path / "details.csv"
    bad.write_text('"ID","Kernel Name","Metric Name"\n"0","k","Duration"\n')
    assert ncu_source.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "details.csv" in err and "--page source" in err


def test_a_missing_column_is_named(tmp_path, capsys):
    bad = tmp_path / "nosamples.csv.gz"
    bad.write_bytes(gzip.compress(b'"Address","Source","Instructions Executed"\n"0x0","NOP","1"\n'))
    assert ncu_source.main([str(bad)]) == 2
    assert "Warp Stall Sampling (All Samples)" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["nope.csv"])
def test_a_missing_file_is_named(tmp_path, capsys, missing):
    assert ncu_source.main([str(tmp_path / missing)]) == 2
    assert missing in capsys.readouterr().err
