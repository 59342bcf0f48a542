"""ternary._build.sass_order: what the programmatic kernels load before griddepcontrol.wait,
on SASS as cuobjdump prints it (lines taken from a CUDA 12.4 build of the decode kernel whose
A8 instances read x through ld.global.nc, the bug this check exists for), and (build marker)
on the real decode kernels through the pinned CUDA 12.4 toolchain."""

from __future__ import annotations

import os
import subprocess

import pytest

from ternary._build import matrix, sass_order

SR = ("_ZN7ternary14decode_bf16_cu19fused_decode_kernelI13__nv_bfloat16Li4ELi2ELi1ELi0ELb0ELb1"
      "ELi1ELb1EEEvPKT_lPK5uint4PKfS5_PS3_iiiibSA_b")
A16 = SR.replace("ELi1ELb1EEEv", "ELi1ELb0EEEv")
FINISH = ("_ZN7ternary12wgmma_big_cu23wgmma_big_finish_kernelI13__nv_bfloat16Li64EEEvPKfPKT_"
          "PS5_iiiiiiS4_bS4_")


def _ins(addr, text, enc):
    """One instruction as cuobjdump -sass prints it: address, instruction, encoding."""
    return f"        /*{addr}*/    {text} ;  /* {enc} */\n"


WEIGHTS = (_ins("0500", "@!P2 LDGSTS.E.BYPASS.128 [R3], desc[UR6][R16.64]", "0x000000001003afae")
           + " " * 50 + "/* 0x000fe2000b921c46 */\n"  # (the encoding's second word)
           + _ins("07d0", "@!P6 LDG.E.CONSTANT R4, desc[UR6][R24.64]", "0x000000061804e981"))
X = _ins("05c0", "@P3 LDG.E.128.CONSTANT R12, desc[UR6][R104.64]", "0x00000006680c3981")
S = _ins("0990", "LDG.E R7, desc[UR6][R14.64]", "0x000000060e077981")
WAIT = _ins("0a00", "ACQBULK", "0x000000000000782e")


def _fn(name, body, arch="sm_90a"):
    return (f"\n\tcode for {arch}\n\t\tFunction : {name}\n\t.headerflags\t@\"EF_CUDA_SM90\"\n"
            + body)


def test_loads_of_x_or_s_above_the_wait_are_found_and_weights_are_not():
    sass = (_fn(SR, WEIGHTS + X + WAIT + X)            # x above the wait: the bug
            + _fn(SR + "2", WEIGHTS + WAIT + X + S)    # weights only above it: fine
            + _fn(SR + "3", S + WAIT)                  # s above it (coherent, 32-bit)
            + _fn(A16, WEIGHTS + X + WAIT)             # A16: never launched early
            + _fn(SR + "4", WEIGHTS + X, arch="sm_80")  # no wait before sm_90: not checked
            + _fn(FINISH, X + WAIT))                   # the split parts above the wait
    bad, seen = sass_order.early_loads(sass)
    assert set(bad) == {SR, SR + "3", FINISH}, bad
    assert bad[SR] == ["@P3 LDG.E.128.CONSTANT R12, desc[UR6][R104.64]"]
    assert bad[SR + "3"] == ["LDG.E R7, desc[UR6][R14.64]"]
    assert seen == {"fused_decode_kernel (srow)": 3, "wgmma_big_finish_kernel": 1,
                    "wgmma_rs_finish_kernel": 0}


def test_a_programmatic_kernel_without_a_wait_is_reported():
    bad, _ = sass_order.early_loads(_fn(SR, WEIGHTS + X))
    assert bad == {SR: ["no ACQBULK (griddepcontrol.wait) at all"]}


def _cuobjdump(tmp_path, sass: str, rc: int = 0, err: str = ""):
    (tmp_path / "out.sass").write_text(sass)
    tool = tmp_path / "cuobjdump"
    tool.write_text(f"#!/bin/sh\ncat '{tmp_path / 'out.sass'}'\necho '{err}' >&2\nexit {rc}\n")
    tool.chmod(0o755)
    return tool


def test_check_library_names_the_kernel_and_the_fix(tmp_path):
    tool = _cuobjdump(tmp_path, _fn(SR, WEIGHTS + X + WAIT))
    with pytest.raises(sass_order.OrderError, match=r"(?s)1 programmatic kernel.*" + SR +
                       r".*LDG\.E\.128\.CONSTANT.*ld_coherent"):
        sass_order.check_library(tool, tmp_path / "_C.so", ("sm_90a",))
    tool = _cuobjdump(tmp_path, _fn(SR, WEIGHTS + WAIT + X))
    assert sass_order.check_library(tool, tmp_path / "_C.so", ("sm_80", "sm_90a")) == {
        "checked": True, "kernels": {"fused_decode_kernel (srow)": 1,
                                     "wgmma_big_finish_kernel": 0, "wgmma_rs_finish_kernel": 0}}


def test_check_library_refuses_to_check_nothing(tmp_path):
    tool = _cuobjdump(tmp_path, _fn(A16, WEIGHTS + X + WAIT))
    with pytest.raises(sass_order.OrderError, match=r"no sm_90 function matched "
                                                    r"\['fused_decode_kernel \(srow\)'\]"):
        sass_order.check_library(tool, tmp_path / "_C.so", ("sm_90a",))


def test_check_library_without_nvdisasm_or_sm90_says_why(tmp_path):
    tool = _cuobjdump(tmp_path, "", rc=1, err="cuobjdump fatal : Could not find executable "
                                              "file 'nvdisasm'")
    got = sass_order.check_library(tool, tmp_path / "_C.so", ("sm_90a",))
    assert got["checked"] is False and "nvdisasm" in got["why"]
    assert sass_order.check_library(tool, tmp_path / "_C.so", ("sm_80", "sm_89")) == {
        "checked": False, "why": "no sm_90 code in ['sm_80', 'sm_89']"}
    tool = _cuobjdump(tmp_path, "", rc=1, err="cuobjdump fatal : bad file")
    with pytest.raises(sass_order.OrderError, match="bad file"):
        sass_order.check_library(tool, tmp_path / "_C.so", ("sm_90a",))


@pytest.mark.build
def test_real_decode_kernels_load_x_and_s_after_the_wait(tmp_path, monkeypatch):
    """csrc/fused/decode_bf16.cu through the pinned CUDA 12.4 nvcc for sm_90a (the h100
    target's toolchain), read back by its cuobjdump: every A8 instance is checked and clean."""
    from ternary._build import toolchains as tc

    monkeypatch.delenv("TERNARY_CACHE", raising=False)  # the user's cache: a big download
    toolchain = tc.resolve(matrix.get("h100"), "deb", progress=False)
    obj = tmp_path / "decode_bf16.o"
    subprocess.run([str(toolchain.cuda_home / "bin" / "nvcc"), "-std=c++17", "-O3",
                    f"-I{matrix.REPO / 'csrc'}", "-gencode=arch=compute_90a,code=sm_90a", "-c",
                    str(matrix.REPO / "csrc/fused/decode_bf16.cu"), "-o", str(obj)],
                   env={**os.environ, **toolchain.env}, check=True)
    got = sass_order.check_library(toolchain.cuobjdump, obj, ("sm_90a",))
    assert got["checked"] and got["kernels"]["fused_decode_kernel (srow)"] >= 10, got
