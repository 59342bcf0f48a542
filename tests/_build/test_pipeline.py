"""Build pipeline decisions that need no compiler: options, host torch, SASS comparison."""

from __future__ import annotations

import zipfile

import pytest

from ternary._build import checks, matrix, pipeline, sass


def test_options():
    o = pipeline.parse_args(["--toolchain", "deb", "--allow-cuda-minor-mismatch"])
    assert o.toolchain == "deb" and o.allow_cuda_minor_mismatch and not o.host_torch
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--toolchain", "brew"])


def test_host_torch_must_match_cuda_major():
    h100 = matrix.get("h100")
    with pytest.raises(checks.ToolchainError, match=r"CUDA 13\.0.*CUDA 12\.4"):
        pipeline._check_host_torch(h100, {"torch": "2.11.0+cu130", "torch_cuda": "13.0"})
    notes = pipeline._check_host_torch(matrix.get("h200"), {"torch": "2.11.0+cu130", "torch_cuda": "13.0"})
    assert "host torch 2.11.0+cu130" in notes[0]


def test_host_torch_cpu_build_refused():
    with pytest.raises(checks.ToolchainError, match="CPU build"):
        pipeline._check_host_torch(matrix.get("h200"), {"torch": "2.13.0+cpu", "torch_cuda": None})


def test_windows_target_refused_off_windows():
    opts = pipeline.parse_args([])
    with pytest.raises(checks.ToolchainError, match="native Windows"):
        pipeline.build(matrix.get("windows"), opts)


def _fake_cuobjdump(tmp_path, elf_lines):
    tool = tmp_path / "cuobjdump"
    listing = "\n".join(elf_lines)
    tool.write_text(f"#!/bin/sh\ncase \"$1\" in --list-elf) printf '%s\\n' '{listing}';; "
                    "*) echo 'cuobjdump info    : File does not contain device code';; esac\n")
    tool.chmod(0o755)
    return tool


def _wheel(tmp_path):
    whl = tmp_path / "vllm_ternary-0.1.0+cu124torch2.5-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ternary/_C.cpython-311-x86_64-linux-gnu.so", b"\x7fELF")
    return whl


def test_sass_exact_match(tmp_path):
    tool = _fake_cuobjdump(tmp_path, ["ELF file    1: _C.1.sm_80.cubin", "ELF file    2: _C.2.sm_90a.cubin"])
    assert sass.check_wheel(tool, _wheel(tmp_path), ("sm_80", "sm_90a"))["sass"] == ["sm_80", "sm_90a"]


def test_sass_missing_or_extra_arch_fails(tmp_path):
    tool = _fake_cuobjdump(tmp_path, ["ELF file    1: _C.1.sm_80.cubin", "ELF file    2: _C.2.sm_90.cubin"])
    with pytest.raises(sass.SassError, match=r"missing \['sm_90a'\], unexpected \['sm_90'\]"):
        sass.check_wheel(tool, _wheel(tmp_path), ("sm_80", "sm_90a"))


def test_wheel_without_extension_fails(tmp_path):
    whl = tmp_path / "x.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("ternary/__init__.py", "")
    with pytest.raises(sass.SassError, match="no ternary/_C"):
        sass.check_wheel(tmp_path / "cuobjdump", whl, ("sm_80",))


def test_gpu_smoke_runs_bf16_on_the_fused_kernel():
    from pathlib import Path

    cmd = pipeline.smoke_command(matrix.get("h200"), Path("py"), ["--formats", "ternary"])
    assert cmd[:6] == ["py", "-P", "-m", "ternary", "smoke", "--target"]
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--expect-kernel") + 1] == "fused"
    assert cmd[-2:] == ["--formats", "ternary"]  # the user's arguments last: they win
    cpu = pipeline.smoke_command(matrix.get("cpu"), Path("py"), [])
    assert "--dtype" not in cpu and "--expect-kernel" not in cpu


def test_ptx_arch_option():
    assert pipeline.parse_args(["--ptx-arch", "8.0", "--", "-m", "gpu"]).ptx_arch == "8.0"
    assert pipeline.parse_args([]).ptx_arch is None


def test_a_ptx_build_must_hold_exactly_its_ptx(tmp_path):
    tool = tmp_path / "cuobjdump"
    tool.write_text("#!/bin/sh\ncase \"$1\" in --list-ptx) echo 'PTX file    1: _C.1.sm_80.ptx';; "
                    "*) echo 'cuobjdump info    : File does not contain device code';; esac\n")
    tool.chmod(0o755)
    assert sass.check_wheel(tool, _wheel(tmp_path), (), ptx=("sm_80",)) == {
        "sass": [], "ptx": ["sm_80"]}
    with pytest.raises(sass.SassError, match=r"PTX for \['sm_80'\], but this PTX build asked "
                                             r"for \['sm_89'\]"):
        sass.check_wheel(tool, _wheel(tmp_path), (), ptx=("sm_89",))
