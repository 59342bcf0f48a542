"""ternary._build.archs: the -gencode flags of a target's arch list and of a PTX build, and
(build marker) what a real nvcc then puts in the library."""

from __future__ import annotations

import os
import subprocess
import zipfile

import pytest

from ternary._build import archs, matrix, sass


def test_sass_flags_for_every_arch_of_the_list():
    assert archs.gencode_flags(["8.0", "8.9", "9.0a", "10.0", "12.0"]) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_89,code=sm_89",
        "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_100,code=sm_100",
        "-gencode=arch=compute_120,code=sm_120"]
    assert archs.gencode_flags(["8.0+PTX"]) == ["-gencode=arch=compute_80,code=sm_80",
                                                "-gencode=arch=compute_80,code=compute_80"]


def test_a_ptx_build_compiles_one_virtual_arch_and_no_sass():
    assert archs.gencode_flags(["9.0a"], ptx="8.9") == ["-gencode=arch=compute_89,code=compute_89"]
    assert archs.virtual("8.0") == "compute_80" and archs.virtual("9.0a") == "compute_90a"


@pytest.mark.parametrize("bad,match", [("9.0a", "arch-specific"), ("sm_80", "MAJOR.MINOR"),
                                       ("8", "MAJOR.MINOR")])
def test_a_bad_ptx_arch_is_refused_by_name(bad, match):
    with pytest.raises(matrix.MatrixError, match=match):
        archs.ptx_arch(bad)


KERNEL = "__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n"


@pytest.mark.build
def test_real_nvcc_ptx_build_holds_exactly_that_ptx(tmp_path, monkeypatch):
    """The flags through the pinned CUDA 12.4 nvcc (the cached deb toolchain), read back by
    its cuobjdump as the build pipeline's check reads a wheel."""
    from ternary._build import toolchains as tc

    monkeypatch.delenv("TERNARY_CACHE", raising=False)  # the user's cache: a big download
    toolchain = tc.resolve(matrix.get("h100"), "deb", progress=False)
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    lib = tmp_path / "_C.cpython-311-x86_64-linux-gnu.so"  # an object file: cuobjdump reads both
    subprocess.run([str(toolchain.cuda_home / "bin" / "nvcc"), "-c",
                    *archs.gencode_flags([], ptx="8.0"), str(src), "-o", str(lib)],
                   env={**os.environ, **toolchain.env}, check=True)
    assert sass.list_archs(toolchain.cuobjdump, lib) == ([], ["sm_80"])
    whl = tmp_path / "vllm_ternary-0.1.0+cu124torch2.5.ptx80-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.write(lib, "ternary/" + lib.name)
    assert sass.check_wheel(toolchain.cuobjdump, whl, (), ptx=("sm_80",)) == {
        "sass": [], "ptx": ["sm_80"]}
    with pytest.raises(sass.SassError, match=r"PTX for \['sm_80'\].*asked for \['sm_89'\]"):
        sass.check_wheel(toolchain.cuobjdump, whl, (), ptx=("sm_89",))
    with pytest.raises(sass.SassError, match="SASS for nothing"):
        sass.check_wheel(toolchain.cuobjdump, whl, ("sm_80",))
