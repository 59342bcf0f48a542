"""Native Windows decisions, tested through the flags and choices they produce."""

from __future__ import annotations

import types

import pytest

from ternary._build import matrix, windows

CUDA = matrix.cuda_versions()


def test_cuda_12_1_picks_toolset_14_39_when_installed():
    plan = windows.plan_msvc(CUDA["12.1"], ["14.39.33519", "14.41.34120"])
    assert plan.toolset == "14.39" and plan.vcvars_ver == "14.39"
    assert not plan.unsupported
    assert windows.ALLOW_UNSUPPORTED not in plan.nvcc_flags
    assert windows.STL_MISMATCH not in plan.cxx_flags


def test_msvc_limit_comes_from_targets_toml():
    for version, cuda in CUDA.items():
        newest_ok = cuda.msvc_max + ".30000"
        plan = windows.plan_msvc(cuda, [newest_ok, "14.29.30133"])
        assert plan.toolset == cuda.msvc_max, version


def test_newer_only_toolset_needs_both_overrides():
    plan = windows.plan_msvc(CUDA["12.1"], ["14.41.34120"])
    assert plan.unsupported and plan.toolset == "14.41"
    assert windows.ALLOW_UNSUPPORTED in plan.nvcc_flags
    assert windows.STL_MISMATCH in plan.cxx_flags
    assert windows.STL_MISMATCH in plan.nvcc_flags
    assert "14.39" in plan.reason and "14.41" in plan.reason


def test_unsupported_toolset_before_stl_check_needs_only_nvcc_override():
    cuda = matrix.CudaVersion("12.0", "12.0.76", 12, "14.35", ("8.0",))
    plan = windows.plan_msvc(cuda, ["14.38.33130"])
    assert plan.unsupported and windows.ALLOW_UNSUPPORTED in plan.nvcc_flags
    assert windows.STL_MISMATCH not in plan.cxx_flags


def test_no_toolset_refuses_with_what_to_install():
    with pytest.raises(windows.WindowsBuildError, match=r"no MSVC toolset.*12\.1.*14\.39 toolset"):
        windows.plan_msvc(CUDA["12.1"], [])


def test_bad_toolset_version_is_named():
    with pytest.raises(windows.WindowsBuildError, match="'v143' is not MAJOR.MINOR"):
        windows.plan_msvc(CUDA["12.4"], ["v143"])


def test_default_gemm_path_avoids_cublaslt_on_windows_and_wsl():
    t = matrix.get("windows")
    assert windows.gemm_path(t.platform, t.wsl) == "cublas-no-lt"
    assert windows.gemm_env(t.platform, t.wsl) == {"DISABLE_ADDMM_CUDA_LT": "1"}
    w = matrix.get("wsl2")
    assert windows.gemm_path(w.platform, w.wsl) == "cublas-no-lt"
    h = matrix.get("h100")
    assert windows.gemm_path(h.platform, h.wsl) == "torch-matmul"
    assert windows.gemm_env(h.platform, h.wsl) == {}


def test_dll_directories_in_order_and_only_existing():
    env = {"CUDA_PATH": r"C:\CUDA\v12.4", "CONDA_PREFIX": r"C:\conda\envs\t"}
    present = {r"C:\CUDA\v12.4/bin", r"C:\conda\envs\t/Library/bin"}
    dirs = windows.dll_directories(env, exists=lambda d: d.replace("\\", "/") in
                                   {p.replace("\\", "/") for p in present})
    assert [d.replace("\\", "/") for d in dirs] == [r"C:/CUDA/v12.4/bin",
                                                    r"C:/conda/envs/t/Library/bin"]


def test_register_dll_directories_only_on_windows(tmp_path):
    (tmp_path / "bin").mkdir()
    added = []
    env = {"CUDA_PATH": str(tmp_path)}
    assert windows.register_dll_directories(env, os_name="posix", add=added.append) == []
    assert windows.register_dll_directories(env, os_name="nt", add=added.append) == [
        str(tmp_path / "bin")]
    assert added == [str(tmp_path / "bin")]


def test_extension_loader_registers_dll_directories_first(monkeypatch):
    from ternary import _ext

    calls = []
    monkeypatch.setattr(windows, "register_dll_directories", lambda: calls.append("dll"))
    monkeypatch.setattr(_ext, "_state", {})
    monkeypatch.setattr(_ext.importlib.util, "find_spec", lambda name: object())
    ext = types.SimpleNamespace(build_info=dict)  # (an extension from these sources has it)
    monkeypatch.setattr(_ext.importlib, "import_module",
                        lambda name: calls.append(name) or ext)
    assert _ext.load() is not None
    assert calls == ["dll", "ternary._C"]
