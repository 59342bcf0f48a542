"""Fake CUDA toolkits for toolchain tests: a bin/nvcc script that prints what a real
`nvcc --version` prints (the text of CUDA 12.4.131's and 13.0.88's own nvcc)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

NVCC_VERSION_TEXT = """\
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2024 NVIDIA Corporation
Built on Thu_Mar_28_02:18:24_PDT_2024
Cuda compilation tools, release {mm}, V{full}
Build cuda_{mm}.r{mm}/compiler.34097967_0
"""


def make_cuda_home(root: Path, full_version: str, *, cuobjdump: bool = True) -> Path:
    mm = ".".join(full_version.split(".")[:2])
    home = root / f"cuda-{full_version}"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    text = NVCC_VERSION_TEXT.format(mm=mm, full=full_version)
    nvcc.write_text(f"#!/bin/sh\ncat <<'END'\n{text}END\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    if cuobjdump:
        tool = home / "bin" / "cuobjdump"
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return home


@pytest.fixture
def cuda_home(tmp_path):
    """cuda_home("12.4.131") -> a fake CUDA_HOME whose nvcc reports that version."""
    return lambda full_version, **kw: make_cuda_home(tmp_path, full_version, **kw)
