"""checks.preflight: one test per refusal, with fake nvcc scripts (no CUDA needed)."""

from __future__ import annotations

import stat

import pytest

from ternary._build import checks, matrix

CUDA = matrix.cuda_versions()


def test_accepts_matching_toolchain(cuda_home):
    home = cuda_home(CUDA["12.4"].full_version)
    facts = checks.preflight(cuda_home=home, torch_cuda="12.4", arch_list=["9.0a"],
                             gcc_major=CUDA["12.4"].max_gcc)
    assert facts == {"nvcc_version": CUDA["12.4"].full_version, "torch_cuda": "12.4",
                     "minor_mismatch": "no"}


def test_major_mismatch(cuda_home):
    home = cuda_home(CUDA["13.0"].full_version)
    with pytest.raises(checks.ToolchainError, match=r"major version mismatch.*CUDA 13\.0\.88.*12\.4"):
        checks.preflight(cuda_home=home, torch_cuda="12.4", arch_list=["9.0a"], gcc_major=12)


def test_minor_mismatch_without_override(cuda_home):
    home = cuda_home(CUDA["12.4"].full_version)
    with pytest.raises(checks.ToolchainError, match=r"minor version mismatch.*--allow-cuda-minor"):
        checks.preflight(cuda_home=home, torch_cuda="12.1", arch_list=["8.0"], gcc_major=12)


def test_minor_mismatch_with_override_is_reported(cuda_home):
    home = cuda_home(CUDA["12.4"].full_version)
    facts = checks.preflight(cuda_home=home, torch_cuda="12.1", arch_list=["8.0"], gcc_major=12,
                             allow_cuda_minor_mismatch=True)
    assert facts["minor_mismatch"].startswith("yes")


def test_gcc_newer_than_cuda_accepts(cuda_home):
    cuda = CUDA["12.4"]
    home = cuda_home(cuda.full_version)
    with pytest.raises(checks.ToolchainError,
                       match=rf"host gcc {cuda.max_gcc + 1} is newer than CUDA 12\.4 accepts "
                             rf"\(at most gcc {cuda.max_gcc}\)"):
        checks.preflight(cuda_home=home, torch_cuda="12.4", arch_list=["9.0a"],
                         gcc_major=cuda.max_gcc + 1)


def test_arch_the_cuda_version_cannot_target(cuda_home):
    home = cuda_home(CUDA["12.4"].full_version)
    assert "10.0" not in CUDA["12.4"].archs
    with pytest.raises(checks.ToolchainError, match=r"CUDA 12\.4 cannot target arch 10\.0"):
        checks.preflight(cuda_home=home, torch_cuda="12.4", arch_list=["9.0a", "10.0"],
                         gcc_major=12)


def test_empty_arch_list(cuda_home):
    home = cuda_home(CUDA["12.4"].full_version)
    with pytest.raises(checks.ToolchainError, match="arch list is empty"):
        checks.preflight(cuda_home=home, torch_cuda="12.4", arch_list=[], gcc_major=12)


def test_no_cuda_home():
    with pytest.raises(checks.ToolchainError, match="no nvcc found: CUDA_HOME is not set"):
        checks.preflight(cuda_home=None, torch_cuda="12.4", arch_list=["9.0a"], gcc_major=12)


def test_cuda_home_without_nvcc(tmp_path):
    with pytest.raises(checks.ToolchainError, match=rf"no nvcc found: {tmp_path}/bin/nvcc does not exist"):
        checks.preflight(cuda_home=tmp_path, torch_cuda="12.4", arch_list=["9.0a"], gcc_major=12)


def test_cpu_torch(cuda_home):
    home = cuda_home(CUDA["12.4"].full_version)
    with pytest.raises(checks.ToolchainError, match="CPU build"):
        checks.preflight(cuda_home=home, torch_cuda=None, arch_list=["9.0a"], gcc_major=12)


def test_cuda_version_without_table(cuda_home):
    home = cuda_home("11.8.89")
    with pytest.raises(checks.ToolchainError, match=r'no \[cuda\."11\.8"\] table'):
        checks.preflight(cuda_home=home, torch_cuda="11.8", arch_list=["8.0"], gcc_major=11)


def test_unreadable_nvcc_version(tmp_path):
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'not a compiler'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(checks.ToolchainError, match="cannot read the CUDA version"):
        checks.nvcc_version(tmp_path)


def test_failing_nvcc(tmp_path):
    (tmp_path / "bin").mkdir()
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 3\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(checks.ToolchainError, match="--version failed"):
        checks.nvcc_version(tmp_path)


def test_no_host_compiler():
    with pytest.raises(checks.ToolchainError, match="no host C\\+\\+ compiler"):
        checks.gcc_version("no-such-c++-compiler")


def test_unreadable_host_compiler_version(tmp_path):
    cxx = tmp_path / "weird-c++"
    cxx.write_text("#!/bin/sh\necho banana\n")
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(checks.ToolchainError, match=r"cannot read the version of .*weird-c\+\+ "
                                                    r"\(-dumpversion said 'banana'\)"):
        checks.gcc_version(str(cxx))
