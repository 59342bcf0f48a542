"""`ternary doctor`: every verdict of every check, reached through injected probes."""

from __future__ import annotations

import json

import pytest

from ternary.tools import doctor
from ternary.tools.doctor import FAIL, OK, WARN

A100 = ("NVIDIA A100-SXM4-80GB", "8.0")
H100 = ("NVIDIA H100 80GB HBM3", "9.0")
L40 = ("NVIDIA L40S", "8.9")
Probes = doctor.Probes  # the real class, kept before tests monkeypatch doctor.Probes


def gpu_probes(**over) -> doctor.Probes:
    """A healthy A100 machine with torch 2.4.0+cu121 and an extension built for 8.0."""
    base = dict(
        driver=lambda: {"driver": "550.54.15", "cuda": "12.4", "gpus": [A100]},
        torch=lambda: {"version": "2.4.0+cu121", "cuda": "12.1", "available": True,
                       "devices": [A100]},
        nvcc=lambda: ("/opt/cuda-12.1", "12.1.105"),
        libcuda=lambda: {"files": ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
                         "resolved": ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
                         "wsl_lib_configured": False},
        build_info=lambda: ({"cuda_version": "12.1", "arch_list": "8.0",
                             "git_revision": "abc1234"}, None),
        host_compiler=lambda: ("/usr/bin/g++", 12),
        vllm=lambda: "0.6.2",
        plugin=lambda: "dict",
        kernel=lambda: "fused",
        wsl=lambda: False,
        os_name=lambda: "posix",
        env=lambda: {},
    )
    base.update(over)
    return Probes(**base)


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_gpu_machine_is_all_ok():
    checks = doctor.run_checks(gpu_probes())
    assert {c.name: c.verdict for c in checks if c.verdict != OK} == {}
    assert doctor.exit_code(checks) == 0
    assert "8.0" in by_name(checks)["gpu0 arch"].detail


def test_cpu_machine_warns_but_passes():
    def no_kernels():
        raise ImportError("No module named 'ternary.kernels'")

    p = gpu_probes(driver=lambda: None, nvcc=lambda: None, vllm=lambda: None, kernel=no_kernels,
                   torch=lambda: {"version": "2.13.0+cpu", "cuda": None, "available": False,
                                  "devices": []},
                   libcuda=lambda: {"files": [], "resolved": [], "wsl_lib_configured": False},
                   build_info=lambda: (None, None), host_compiler=lambda: None)
    c = by_name(doctor.run_checks(p))
    for name in ("driver", "nvcc", "libcuda", "ternary._C", "vllm", "kernel path",
                 "host compiler"):
        assert c[name].verdict == WARN, name
        assert c[name].fix, name
    assert c["torch"].verdict == OK
    assert doctor.exit_code(list(c.values())) == 0


@pytest.mark.parametrize("drv_cuda,verdict", [("11.8", FAIL), ("12.0", WARN), ("12.4", OK)])
def test_driver_against_torch_cuda(drv_cuda, verdict):
    p = gpu_probes(driver=lambda: {"driver": "5xx", "cuda": drv_cuda, "gpus": [A100]})
    c = by_name(doctor.run_checks(p))["driver"]
    assert c.verdict == verdict
    if verdict != OK:
        assert "12.1" in c.detail and c.fix


def test_cpu_torch_with_a_gpu_fails():
    p = gpu_probes(torch=lambda: {"version": "2.13.0+cpu", "cuda": None, "available": False,
                                  "devices": []})
    checks = doctor.run_checks(p)
    c = by_name(checks)["torch"]
    assert c.verdict == FAIL and "CPU build" in c.detail and "requirements.lock" in c.fix
    assert doctor.exit_code(checks) == 1


def test_torch_that_sees_no_gpu_fails():
    p = gpu_probes(torch=lambda: {"version": "2.4.0+cu121", "cuda": "12.1", "available": False,
                                  "devices": []})
    assert by_name(doctor.run_checks(p))["torch"].verdict == FAIL


def test_torch_import_error_fails():
    def broken():
        raise ImportError("libcudnn.so.9: cannot open shared object file")

    c = by_name(doctor.run_checks(gpu_probes(torch=broken)))["torch"]
    assert c.verdict == FAIL and "libcudnn" in c.detail


@pytest.mark.parametrize("nvcc,verdict", [("13.0.88", FAIL), ("12.4.131", WARN),
                                          ("12.1.105", OK)])
def test_nvcc_against_torch_cuda(nvcc, verdict):
    c = by_name(doctor.run_checks(gpu_probes(nvcc=lambda: ("/opt/cuda", nvcc))))["nvcc"]
    assert c.verdict == verdict
    if verdict != OK:
        assert nvcc in c.detail and "12.1" in c.detail


def test_nvcc_with_cpu_torch_is_ok():
    p = gpu_probes(torch=lambda: {"version": "2.13.0+cpu", "cuda": None, "available": False,
                                  "devices": []}, driver=lambda: None)
    assert by_name(doctor.run_checks(p))["nvcc"].verdict == OK


def test_missing_libcuda_with_gpu_fails():
    p = gpu_probes(libcuda=lambda: {"files": [], "resolved": [], "wsl_lib_configured": False})
    assert by_name(doctor.run_checks(p))["libcuda"].verdict == FAIL


WSL_STUB = f"{doctor.WSL_LIB}/libcuda.so.1"


@pytest.mark.parametrize("libcuda,verdict,needle", [
    ({"files": [WSL_STUB], "resolved": [WSL_STUB], "wsl_lib_configured": True}, OK, "stub"),
    ({"files": [WSL_STUB, "/usr/lib/x86_64-linux-gnu/libcuda.so.1"], "resolved": [],
      "wsl_lib_configured": True}, FAIL, "Linux driver"),
    ({"files": [], "resolved": [], "wsl_lib_configured": True}, FAIL, "no libcuda"),
    ({"files": [WSL_STUB], "resolved": [], "wsl_lib_configured": False}, FAIL, "does not search"),
])
def test_wsl_libcuda(libcuda, verdict, needle):
    p = gpu_probes(wsl=lambda: True, libcuda=lambda: libcuda)
    c = by_name(doctor.run_checks(p))
    assert c["libcuda"].verdict == verdict and needle in c["libcuda"].detail
    assert c["wsl2"].verdict == OK and "cublas-no-lt" in c["wsl2"].detail


def test_wsl_pinned_memory_override_warns():
    p = gpu_probes(wsl=lambda: True, env=lambda: {"TERNARY_PIN_MEMORY": "1"},
                   libcuda=lambda: {"files": [WSL_STUB], "resolved": [WSL_STUB],
                                    "wsl_lib_configured": True})
    c = by_name(doctor.run_checks(p))["wsl2"]
    assert c.verdict == WARN and "TERNARY_PIN_MEMORY" in c.fix


def test_gpu_not_in_compiled_archs_fails_and_names_a_target():
    p = gpu_probes(torch=lambda: {"version": "2.4.0+cu121", "cuda": "12.1", "available": True,
                                  "devices": [A100, H100]})
    c = by_name(doctor.run_checks(p))
    assert c["gpu0 arch"].verdict == OK
    assert c["gpu1 arch"].verdict == FAIL
    assert "9.0" in c["gpu1 arch"].detail and "nox -s build-" in c["gpu1 arch"].fix


def test_arch_with_no_target_says_add_one():
    p = gpu_probes(torch=lambda: {"version": "2.4.0+cu121", "cuda": "12.1", "available": True,
                                  "devices": [("Some GPU", "6.1")]})
    c = by_name(doctor.run_checks(p))["gpu0 arch"]
    assert c.verdict == FAIL and "no target" in c.fix


def test_extension_list_form_and_l40():
    p = gpu_probes(build_info=lambda: ({"cuda_version": "12.1", "arch_list": ["8.0", "8.9"]},
                                       None),
                   torch=lambda: {"version": "2.4.0+cu121", "cuda": "12.1", "available": True,
                                  "devices": [L40]})
    assert by_name(doctor.run_checks(p))["gpu0 arch"].verdict == OK


def test_extension_that_fails_to_load_fails():
    p = gpu_probes(build_info=lambda: (None, "undefined symbol: _ZN3c10..."))
    c = by_name(doctor.run_checks(p))["ternary._C"]
    assert c.verdict == FAIL and "undefined symbol" in c.detail


def test_gcc_newer_than_cuda_accepts_fails():
    c = by_name(doctor.run_checks(gpu_probes(host_compiler=lambda: ("/usr/bin/g++", 14))))
    assert c["host compiler"].verdict == FAIL
    assert "gcc 14" in c["host compiler"].detail and "g++-12" in c["host compiler"].fix


def test_plugin_import_error_warns_and_registration_error_fails():
    def missing():
        raise ImportError("No module named 'ternary.vllm.plugin'")

    def refused():
        raise RuntimeError("QUANTIZATION_METHODS is a list")

    c = by_name(doctor.run_checks(gpu_probes(plugin=missing)))["vllm plugin"]
    assert c.verdict == WARN
    c = by_name(doctor.run_checks(gpu_probes(plugin=refused)))["vllm plugin"]
    assert c.verdict == FAIL and "0.6.2" in c.detail and "QUANTIZATION_METHODS" in c.detail


def test_plugin_import_error_names_the_package_vllm_lacks():
    def vllm_broken():
        raise ImportError("No module named 'compressed_tensors'", name="compressed_tensors")

    def ours_missing():
        raise ImportError("No module named 'ternary.vllm'", name="ternary.vllm")

    c = by_name(doctor.run_checks(gpu_probes(plugin=vllm_broken)))["vllm plugin"]
    assert c.verdict == WARN and "cannot import compressed_tensors" in c.fix
    assert "reinstall vllm-ternary" not in c.fix
    c = by_name(doctor.run_checks(gpu_probes(plugin=ours_missing)))["vllm plugin"]
    assert "reinstall vllm-ternary" in c.fix


def test_cuda_home_without_a_working_nvcc_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(Exception, match=f"CUDA_HOME={tmp_path}: "):
        doctor.probe_nvcc()
    c = by_name(doctor.run_checks(gpu_probes(nvcc=doctor.probe_nvcc)))["nvcc"]
    assert c.verdict == WARN and f"CUDA_HOME={tmp_path}" in c.detail
    assert "unset" not in c.detail.split(":")[0] and "point CUDA_HOME" in c.fix
    # the host compiler check still runs
    assert "host compiler" in by_name(doctor.run_checks(gpu_probes(nvcc=doctor.probe_nvcc)))


def test_kernel_chooser_error_fails():
    def nothing_fits():
        raise RuntimeError("fused: needs sm_80+; cublas: TERNARY_KERNEL=fused forbids it")

    c = by_name(doctor.run_checks(gpu_probes(kernel=nothing_fits)))["kernel path"]
    assert c.verdict == FAIL and "sm_80" in c.detail and "TERNARY_KERNEL" in c.fix


def test_windows_dll_directories(tmp_path):
    (tmp_path / "bin").mkdir()
    ok = by_name(doctor.run_checks(gpu_probes(os_name=lambda: "nt",
                                              env=lambda: {"CUDA_PATH": str(tmp_path)})))
    assert ok["windows"].verdict == OK and "cublas-no-lt" in ok["windows"].detail
    assert ok["libcuda"].verdict == OK and ok["host compiler"].verdict == OK
    bad = by_name(doctor.run_checks(gpu_probes(os_name=lambda: "nt", env=lambda: {})))
    assert bad["windows"].verdict == FAIL and "CUDA_PATH" in bad["windows"].fix


def test_a_probe_that_crashes_is_a_failed_check():
    def boom():
        raise OSError("ldconfig: permission denied")

    c = by_name(doctor.run_checks(gpu_probes(libcuda=boom)))["libcuda"]
    assert c.verdict == FAIL and "ldconfig" in c.detail


def test_cli_json_and_exit_code(monkeypatch, capsys):
    from ternary import cli

    monkeypatch.setattr(doctor, "Probes", lambda: gpu_probes(host_compiler=lambda: ("g++", 14)))
    assert cli.main(["doctor", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 1
    assert {"name", "verdict", "detail", "fix"} <= set(out["checks"][0])
    monkeypatch.setattr(doctor, "Probes", gpu_probes)
    assert cli.main(["doctor"]) == 0
    assert "ternary doctor" in capsys.readouterr().out


def test_real_probes_run_on_this_machine():
    """The real probes, not stubs: what they find must be what this interpreter has."""
    import torch

    c = by_name(doctor.run_checks())
    assert c["torch"].verdict == OK and f"torch {torch.__version__}" in c["torch"].detail
    assert all(x.fix for x in c.values() if x.verdict != OK)
    if not torch.cuda.is_available():
        assert c["driver"].verdict == WARN
        kernel = c["kernel path"]
        assert kernel.verdict == OK and kernel.detail.startswith("reference on this ")
        assert "int8_per_token: per-token int8 quantize by the PyTorch reference" in kernel.detail


def test_kernel_policy_with_another_api_warns():
    def old_api():
        raise AttributeError("module 'ternary.kernels' has no attribute 'detect_platform'")

    c = by_name(doctor.run_checks(gpu_probes(kernel=old_api)))["kernel path"]
    assert c.verdict == WARN and "detect_platform" in c.detail


def test_a_ptx_build_on_a_later_gpu_is_ok_and_says_the_driver_jit_compiles_it():
    p = gpu_probes(build_info=lambda: ({"cuda_version": "13.0", "arch_list": "compute_80"}, None),
                   torch=lambda: {"version": "2.11.0+cu130", "cuda": "13.0", "available": True,
                                  "devices": [H100, H100]},
                   jit_seconds=lambda: 41.25)
    c = by_name(doctor.run_checks(p))
    assert c["gpu0 arch"].verdict == OK and c["gpu1 arch"].verdict == OK
    assert "runs compute_80 PTX: the driver JIT-compiles each kernel" in c["gpu0 arch"].detail
    assert "took 41.2 s longer than the next with a cold cache" in c["gpu0 arch"].detail


def test_a_ptx_build_above_the_gpu_fails_and_says_what_to_rebuild():
    p = gpu_probes(build_info=lambda: ({"cuda_version": "12.4", "arch_list": "compute_89"}, None),
                   jit_seconds=lambda: pytest.fail("no JIT to time: the GPU cannot run it"))
    c = by_name(doctor.run_checks(p))["gpu0 arch"]
    assert c.verdict == FAIL and "compute_89 PTX only, which needs 8.9 or later" in c.detail
    assert "--ptx-arch 8.0 or lower" in c.fix and "nox -s build-a100" in c.fix
