"""bench/one_layer.py, the profiler's target (tools/h200's ncu stage): its refusals, and on a
GPU one checked call sequence a route (linear_a8 and linear_fused)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/one_layer.py"


def _run(*args):
    # the installed ternary (-P: the wheel on the GPU machine, an editable checkout in nox's
    # environments), else this checkout's
    installed = subprocess.run([sys.executable, "-P", "-c", "import ternary"],
                               capture_output=True, cwd=ROOT).returncode == 0
    env = dict(os.environ) if installed else {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, *(["-P"] if installed else []), str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_bad_sizes_are_refused_by_name():
    r = _run("--m", "0", "--k", "64", "--n", "8")
    assert r.returncode == 2 and "--m must be at least 1; got 0" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_says_so():
    r = _run("--m", "4", "--k", "64", "--n", "8")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("activation,m", [("int8_per_token", 1), ("int8_per_token", 300),
                                          ("none", 16), ("none", 200)])
def test_a_checked_layer_on_the_gpu(activation, m):
    r = _run("--m", str(m), "--k", "1000", "--n", "300", "--activation", activation, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["ok"] and facts["route"] and (facts["m"], facts["calls"]) == (m, 3), facts
