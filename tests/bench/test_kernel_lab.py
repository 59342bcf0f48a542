"""bench/kernel_lab.cu includes the kernel headers of csrc/fused/ and instantiates their templates
with other parameters: it must keep compiling as the kernels change (it runs only on a GPU
machine)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.build
def test_kernel_lab_builds_for_sm90a(tmp_path):
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        pytest.skip("no nvcc on PATH (set NVCC)")
    r = subprocess.run(["bash", str(ROOT / "bench/kernel_lab.sh")], capture_output=True,
                       text=True, env={**os.environ, "NVCC": nvcc}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ROOT / "bench/kernel_lab").stat().st_size > 0
