"""`ternary bench` without a GPU: its refusals, and rendering the stored H200 results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ternary import cli

RESULTS = Path(__file__).resolve().parents[2] / "bench"


def test_render_stored_results_with_gemlite(capsys):
    assert cli.main(["bench", "--render", str(RESULTS / "results-h200.json"), "--gemlite-from",
                     str(RESULTS / "results-h200-gemlite.json")]) == 0
    out = capsys.readouterr().out
    assert "4096 x 22016" in out and "gemlite column from an earlier run" in out


@pytest.mark.parametrize("shape,match", [("4096by22016", "takes KxN"),
                                         ("4098x16", "multiple of 4")])
def test_bad_shapes(shape, match):
    with pytest.raises(SystemExit, match=match):
        cli.main(["bench", "--shapes", shape])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_needs_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        cli.main(["bench", "--shapes", "64x64", "--m", "1"])


def test_needs_the_extension(monkeypatch):
    # a GPU with no ternary._C: refused before any timing (it was a traceback after the
    # bandwidth and FLOP probes)
    from ternary import _ext

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_ext, "load", lambda: None)
    monkeypatch.setattr(_ext, "load_error", lambda: None)
    with pytest.raises(SystemExit, match=r"fused kernel of ternary._C, which is not built here; "
                       r"build it for this GPU with `nox -s build-<target>`"):
        cli.main(["bench", "--shapes", "64x64", "--m", "1"])
    monkeypatch.setattr(_ext, "load_error", lambda: ImportError("undefined symbol: foo"))
    with pytest.raises(SystemExit, match="fails to load: undefined symbol: foo"):
        cli.main(["bench", "--shapes", "64x64", "--m", "1"])


def test_json_folder_checked_first(tmp_path):
    for args in (["--render", str(RESULTS / "results-h200.json")], ["--shapes", "64x64"]):
        with pytest.raises(SystemExit, match=f"--json {tmp_path}/no/r.json: the folder "
                           f"{tmp_path}/no does not exist"):
            cli.main(["bench", *args, "--json", str(tmp_path / "no" / "r.json")])


@pytest.mark.parametrize("value", ["-1", "11"])
def test_bad_settle(value):
    with pytest.raises(SystemExit, match=f"--settle {float(value)}"):
        cli.main(["bench", "--settle", value, "--shapes", "64x64", "--m", "1"])


def test_render_says_how_long_each_timing_settled(capsys, tmp_path):
    import json

    result = json.loads((RESULTS / "results-h200.json").read_text())
    result["meta"]["settle_s"] = 0.25
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert cli.main(["bench", "--render", str(path)]) == 0
    assert "each kernel timed after 0.25 s idle" in capsys.readouterr().out
    result["meta"]["settle_s"] = 0
    path.write_text(json.dumps(result))
    assert cli.main(["bench", "--render", str(path)]) == 0
    assert "idle" not in capsys.readouterr().out


def test_render_stored_sustained_run(capsys):
    """bench/results-h200-sustained.json: M 1024 and 4096, each kernel run 2 s first."""
    assert cli.main(["bench", "--render", str(RESULTS / "results-h200-sustained.json")]) == 0
    out = capsys.readouterr().out
    assert "each kernel ran 2 s before its timing" in out and "4096 x 22016" in out


@pytest.mark.parametrize("argv", [["--m", "0"], ["--m", "1", "-4"], ["--replays", "0"]])
def test_bad_m_or_replays(argv):
    with pytest.raises(SystemExit, match="give positive numbers"):
        cli.main(["bench", "--shapes", "64x64", *argv])


def test_bad_sustain():
    with pytest.raises(SystemExit, match="--sustain -1.0"):
        cli.main(["bench", "--sustain", "-1", "--shapes", "64x64", "--m", "1"])


@pytest.mark.parametrize("value", ["-1", "10001"])
def test_bad_window(value):
    with pytest.raises(SystemExit, match=f"--window {float(value)}"):
        cli.main(["bench", "--window", value, "--shapes", "64x64", "--m", "1"])


@pytest.mark.parametrize("replay_ms,window_ms,replays,expected", [
    (0.08, 20.0, 20, 20),   # short calls: all replays fit
    (1.8, 20.0, 20, 11),    # cuBLAS at M = 4096: two 0.9 ms copies a replay
    (8.3, 20.0, 20, 3),     # the fused kernel at M = 4096: nine copies; never under 3
    (8.3, 20.0, 2, 2),      # unless fewer were asked for
    (8.3, 0.0, 20, 20),     # no window
])
def test_timed_replays_stop_at_the_window(replay_ms, window_ms, replays, expected):
    from ternary.tools.gemm_bench import replays_in_window

    assert replays_in_window(replay_ms, window_ms, replays) == expected


@pytest.mark.parametrize("call_ms,window_ms,copies,expected", [
    (0.02, 20.0, 32, 32),   # short calls: every copy
    (0.92, 20.0, 9, 7),     # the fused kernel at M = 4096: 3 replays of 7 copies fit 20 ms
    (2.1, 20.0, 9, 3),      # gemlite at M = 4096
    (8.0, 20.0, 9, 2),      # a call longer than the window / 3: still two weight copies
    (8.0, 20.0, 1, 1),      # unless there is one
    (0.92, 0.0, 9, 9),      # no window
])
def test_graphs_hold_fewer_copies_where_the_window_is_short(call_ms, window_ms, copies,
                                                            expected):
    from ternary.tools.gemm_bench import copies_in_window

    assert copies_in_window(call_ms, window_ms, copies) == expected


def test_render_names_cells_timed_past_the_window(capsys, tmp_path):
    import json

    result = _result([(4096, 22016, 1, {"auto": 10.0}, 1.0, 1.0),
                      (4096, 22016, 4096, {"auto": 900.0}, 1.0, 1.0)])
    result["meta"].update(window_ms=20.0, replays=20)
    result["rows"][0]["timed_ms"] = {"auto": 1.2}
    result["rows"][1]["timed_ms"] = {"auto": 27.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert cli.main(["bench", "--render", str(path)]) == 0
    out = capsys.readouterr().out
    assert "before the power limiter" in out
    assert "timed over more than the window (1): 4096 x 22016 M=4096 auto 27 ms" in out
    result["meta"]["window_ms"] = 1000.0  # a window past the limiter makes no such claim
    path.write_text(json.dumps(result))
    assert cli.main(["bench", "--render", str(path)]) == 0
    out = capsys.readouterr().out
    assert "within its first 1000 ms" in out and "power limiter" not in out
    assert "timed over more than the window" not in out


def test_render_says_which_clock_the_timings_saw(capsys, tmp_path):
    import json

    result = json.loads((RESULTS / "results-h200.json").read_text())
    path = tmp_path / "r.json"
    for window, words in ((20.0, "within its first 20 ms of GPU time"),
                          (0.0, "no timing window (--window 0)"),
                          (None, "no timing window (a run before the window existed)")):
        result["meta"].pop("window_ms", None)
        if window is not None:
            result["meta"]["window_ms"] = window
        path.write_text(json.dumps(result))
        assert cli.main(["bench", "--render", str(path)]) == 0
        assert words in capsys.readouterr().out


def _result(rows):
    meta = {"device": "GPU X", "dtype": "torch.bfloat16", "copy_bandwidth_Bps": 4e12,
            "bf16_mm_flops": 8e14, "settle_s": 0}
    return {"meta": meta, "rows": [
        {"k": k, "n": n, "m": m, "us": us, "auto_kernel": "fused", "fused_kernel": "decode",
         "floor_bw_us": bw, "floor_compute_us": c} for k, n, m, us, bw, c in rows]}


def _cells(out: str, label: str) -> list[str]:
    line = next(ln for ln in out.splitlines() if label in ln)
    return [c.strip() for c in line.split("│")[1:-1]]


def test_render_cells_are_the_ratios_of_the_stored_times(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("COLUMNS", "200")
    times = {"fused": 12.0, "auto": 10.0, "cublas_path": 99.0, "cublas_dense": 50.0,
             "gemlite": 25.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result([(4096, 4096, 1, times, 4.0, 0.5),
                                        (4096, 4096, 4096, {**times, "gemlite": None}, 4.0,
                                         8.0)])))
    assert cli.main(["bench", "--render", str(path)]) == 0
    out = capsys.readouterr().out
    # K x N, M, fused, auto, cuBLAS, dequant+mm, gemlite, x cuBLAS, x gemlite, floor, floor %
    assert _cells(out, "│    1 │") == ["4096 x 4096", "1", "12.0 (decode)", "10.0 (fused)",
                                      "50.0", "99.0", "25.0", "5.00", "2.50", "4.0", "40"]
    # the compute floor is the larger at M = 4096: marked (c), and it is what floor % uses
    assert _cells(out, "│ 4096 │")[6:] == ["-", "5.00", "-", "8.0 (c)", "80"]


@pytest.mark.parametrize("content,words", [
    (None, "cannot read it"), ("{not json", "not JSON"), ('{"rows": []}', "not a `ternary bench"),
    ('{"meta": {}, "rows": []}', "not a `ternary bench"),
    ('{"meta": {}, "rows": [{"k": 1}]}', "not a `ternary bench")])
def test_render_names_a_file_it_cannot_use(tmp_path, content, words):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    with pytest.raises(SystemExit, match=f"--render {bad}: {words}"):
        cli.main(["bench", "--render", str(bad)])
    with pytest.raises(SystemExit, match=f"--gemlite-from {bad}: {words}"):
        cli.main(["bench", "--render", str(RESULTS / "results-h200.json"), "--gemlite-from",
                  str(bad)])


def test_render_refuses_a_run_missing_what_the_table_reads(tmp_path):
    import json

    good = _result([(64, 64, 1, {"auto": 1.0}, 1.0, 1.0)])
    for broken in ({**good, "meta": {k: v for k, v in good["meta"].items() if k != "device"}},
                   {**good, "rows": [{k: v for k, v in good["rows"][0].items()
                                      if k != "floor_bw_us"}]}):
        path = tmp_path / "r.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(SystemExit, match="not a `ternary bench --json` result"):
            cli.main(["bench", "--render", str(path)])
    path.write_text(json.dumps(good))
    assert cli.main(["bench", "--render", str(path)]) == 0


def test_render_json_writes_the_merged_run(tmp_path, capsys):
    import json

    out = tmp_path / "merged.json"
    assert cli.main(["bench", "--render", str(RESULTS / "results-h200-sustained.json"),
                     "--gemlite-from", str(RESULTS / "results-h200-gemlite.json"),
                     "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    gemlite = {(r["k"], r["n"], r["m"]): r["us"]["gemlite"]
               for r in json.loads((RESULTS / "results-h200-gemlite.json").read_text())["rows"]}
    assert merged["meta"]["gemlite_from"]["device"] == "NVIDIA H200"
    # which clock the merged column was timed at travels with it
    assert merged["meta"]["gemlite_from"]["window_ms"] == 20.0
    assert all(r["us"]["gemlite"] == gemlite.get((r["k"], r["n"], r["m"]))
               for r in merged["rows"])
    assert any(r["us"]["gemlite"] is not None for r in merged["rows"])


def test_gemlite_from_needs_render():
    with pytest.raises(SystemExit, match="use it with --render"):
        cli.main(["bench", "--gemlite-from", str(RESULTS / "results-h200-gemlite.json")])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times kernels on a GPU")
def test_bench_json_on_a_gpu(tmp_path, capsys):
    """The timing path end to end on a tiny shape: every method timed, the JSON written is
    what --render reads back, and the ratios in it are consistent."""
    import json

    path = tmp_path / "run.json"
    assert cli.main(["bench", "--shapes", "256x320", "--m", "1", "64", "--no-gemlite",
                     "--replays", "3", "--settle", "0", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert [(r["k"], r["n"], r["m"]) for r in result["rows"]] == [(256, 320, 1), (256, 320, 64)]
    assert result["meta"]["window_ms"] == 20.0
    for r in result["rows"]:
        for method in ("fused", "auto", "cublas_path", "cublas_dense", "a8"):
            assert 0 < r["us"][method] < 1e4, (method, r)
            # three replays of a few copies of a tiny call: well inside the window
            assert 0 < r["timed_ms"][method] < 20.0, (method, r)
        assert r["floor_bw_us"] > 0 and r["floor_compute_us"] > 0 and r["fused_kernel"]
    assert result["meta"]["copy_bandwidth_Bps"] > 1e11 and result["meta"]["bf16_mm_flops"] > 1e12
    capsys.readouterr()
    assert cli.main(["bench", "--render", str(path)]) == 0
    out = capsys.readouterr().out
    assert "256 x 320" in out and "A8 x cuBLAS" in out


def test_render_int8_tensor_core_columns_are_the_ratios(capsys, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("COLUMNS", "260")
    times = {"fused": 12.0, "auto": 10.0, "cublas_path": 99.0, "cublas_dense": 50.0,
             "gemlite": None, "a8": 20.0, "a8_tc": 8.0, "a8_tc_rp": 10.0, "int_mm": None}
    big = {**times, "a8_tc": 40.0, "a8_tc_rp": 30.0, "int_mm": 60.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result([(4096, 4096, 1, times, 4.0, 0.5),
                                        (4096, 4096, 4096, big, 4.0, 8.0)])))
    assert cli.main(["bench", "--render", str(path)]) == 0
    out = capsys.readouterr().out
    # ... A8 route, A8 x cuBLAS, A8 TC 64, A8 TC 128, int_mm A8, TC x cuBLAS, TC x int_mm (the
    # ratios of the faster TC kernel: 64 at M = 1, 128 at M = 4096)
    assert _cells(out, "│    1 │")[-7:] == ["20.0", "2.50", "8.0", "10.0", "-", "6.25", "-"]
    assert _cells(out, "│ 4096 │")[-5:] == ["40.0", "30.0", "60.0", "1.67", "2.00"]
    assert "torch._int_mm (cuBLASLt int8)" in out


def test_render_keeps_each_shape_on_one_line(capsys, tmp_path):
    """With every column present (the int8 tensor-core ones too) the shape and M cells do not
    fold ("2560 x" over "13824"), whatever the terminal: the table is read and grepped by shape."""
    import json

    times = {"fused": 12.0, "auto": 10.0, "cublas_path": 99.0, "cublas_dense": 50.0,
             "gemlite": None, "a8": 20.0, "a8_tc": 8.0, "a8_tc_rp": 10.0, "int_mm": 9.0}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result([(2560, 13824, 16384, times, 4.0, 0.5)])))
    assert cli.main(["bench", "--render", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2560 x 13824" in out and "16384" in out


def test_the_int8_kernel_table_in_the_docs_is_the_saved_run():
    """docs/kernels.md's int8 table quotes bench/results-h200-a8.json cell for cell (rounded
    to 0.1 us), and the saved run renders."""
    import json
    import re

    rows = {(r["k"], r["n"], r["m"]): r["us"]
            for r in json.loads((RESULTS / "results-h200-a8.json").read_text())["rows"]}
    doc = (RESULTS.parent / "docs" / "kernels.md").read_text()
    table = doc[doc.index("| K x N | M | fused (A16) | A8 route |"):].split("\n\n")[0]
    quoted = re.findall(r"^\| (\d+) x (\d+) \| (\d+) \|(.*)\|$", table, re.M)
    assert len(quoted) >= 6
    for k, n, m, cells in quoted:
        us = rows[(int(k), int(n), int(m))]
        want = [us["fused"], us["a8"], us["a8_tc"], us["a8_tc_rp"], us.get("int_mm"),
                us["cublas_dense"]]
        got = [c.strip() for c in cells.split("|")]
        assert got == [f"{v:.1f}" if v else "-" for v in want], (k, n, m)
    assert cli.main(["bench", "--render", str(RESULTS / "results-h200-a8.json")]) == 0
