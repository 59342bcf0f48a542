"""`ternary bench` without a GPU: its refusals, and rendering the stored H200 results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ternary import cli

RESULTS = Path(__file__).resolve().parents[1] / "bench"


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


def test_bad_sustain():
    with pytest.raises(SystemExit, match="--sustain -1.0"):
        cli.main(["bench", "--sustain", "-1", "--shapes", "64x64", "--m", "1"])
