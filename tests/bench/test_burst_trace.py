"""bench/burst_trace.py without a GPU: the windows it summarises must be the stored H200
trace's own (tests/data/burst-h200.json.gz: every window's median is the median of
the per-launch times that start in it), its clock and cycle arithmetic on a made-up trace,
and bad arguments are refused by name."""

import gzip
import importlib.util
import json
import statistics
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests/data/burst-h200.json.gz"
spec = importlib.util.spec_from_file_location("burst_trace", ROOT / "bench/burst_trace.py")
burst_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(burst_trace)


def test_stored_windows_are_the_medians_of_the_stored_launches():
    result = json.loads(gzip.decompress(TRACE.read_bytes()))
    assert {(c["k"], c["n"], c["m"], c["kernel"]) for c in result["cases"]} >= {
        (4096, 22016, 4096, "fused"), (4096, 22016, 4096, "cublas")}
    for case in result["cases"]:
        starts = burst_trace.launch_starts(case["us"])
        for w in case["windows"]:
            lo, hi = w["window_ms"]
            sel = [u for u, s in zip(case["us"], starts) if lo <= s < hi]
            assert len(sel) == w["launches"]
            assert statistics.median(sel) == pytest.approx(w["median_us"])
            assert sel[0] == pytest.approx(w["first_us"])


def test_summary_of_a_made_up_trace():
    # 30 launches of 1 ms, then 30 of 1.25 ms; the host's sync returned at t = 100 s, so the
    # GPU started at 100 - 0.0675 s. The clock reads 1980 MHz for the first 20 ms, then
    # 1600 MHz under the software power cap (bit 0x4).
    us = [1000.0] * 30 + [1250.0] * 30
    gpu0 = 100.0 - sum(us) / 1e6
    samples = [(gpu0 + t / 1e3, 1980 if t < 20 else 1600, 300.0, 650.0, 0 if t < 20 else 0x4)
               for t in range(0, 67, 2)]
    windows = {tuple(w["window_ms"]): w for w in burst_trace.summarise(
        {"us": us, "host_t0": 99.0, "host_t1": 100.0, "samples": samples})}
    assert windows[(0, 5)]["launches"] == 5 and windows[(0, 5)]["sm_mhz"] == 1980
    assert windows[(0, 5)]["reasons"] == []
    assert windows[(0, 5)]["mcycles"] == pytest.approx(1000 * 1980 / 1e6)
    late = windows[(50, 100)]
    assert late["median_us"] == 1250.0 and late["sm_mhz"] == 1600
    assert late["reasons"] == ["sw-power"] and late["power_w"] == 300.0
    assert late["mcycles"] == pytest.approx(1250 * 1600 / 1e6)
    assert (100, 200) not in windows  # no launch started there


@pytest.mark.parametrize("argv,words", [
    (["--shapes", "4096by22016"], "takes KxN"),
    (["--shapes", "4098x16"], "multiple of 4"),
    (["--m", "0"], "give positive"),
    (["--ms", "0"], "give positive"),
    (["--ms", "nan"], "give positive"),
    (["--settle", "-1"], "idle seconds"),
])
def test_bad_arguments(argv, words):
    with pytest.raises(SystemExit, match=words):
        burst_trace.main(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_needs_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        burst_trace.main(["--shapes", "64x64", "--m", "1"])
