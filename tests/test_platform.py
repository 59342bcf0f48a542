"""ternary.platform: which GPUs an arch list has code for, and the platform value the kernel
policy and doctor read."""

from __future__ import annotations

from ternary import platform


def test_arch_coverage_rules():
    assert platform.arch_covers("8.0", "8.9")  # same major, lower minor SASS runs
    assert not platform.arch_covers("8.9", "8.0")
    assert platform.arch_covers("9.0a", "9.0")
    assert not platform.arch_covers("9.0a", "10.0")
    assert not platform.arch_covers("8.0", "9.0")
    assert platform.arch_covers("8.0+PTX", "12.0") and platform.arch_covers("9.0+PTX", "9.0")
    assert not platform.arch_covers("9.0+PTX", "8.9")


def test_a_ptx_build_covers_its_arch_and_every_later_one():
    assert platform.arch_covers("compute_80", "8.0") and platform.arch_covers("compute_80", "9.0")
    assert platform.arch_covers("compute_89", "12.0")
    assert not platform.arch_covers("compute_89", "8.6")  # PTX never runs below its arch
    assert not platform.arch_covers("compute_100", "9.0")


def test_device_code_says_sass_or_jit():
    assert platform.device_code(["8.0", "9.0a"], "9.0") == ("sass", "9.0a")
    assert platform.device_code(["compute_80"], "9.0") == ("ptx", "compute_80")
    assert platform.device_code(["8.0+PTX"], "8.6") == ("sass", "8.0+PTX")
    assert platform.device_code(["8.0+PTX"], "9.0") == ("ptx", "8.0+PTX")
    assert platform.device_code(["8.9+PTX", "9.0a"], "9.0") == ("sass", "9.0a")  # SASS first
    assert platform.device_code(["8.0"], "9.0") is None
    assert platform.ptx_floor(["compute_89"]) == "8.9" and platform.ptx_floor(["8.0"]) is None


def test_the_platform_names_the_ptx_its_gpu_runs_by_jit():
    p = platform.Platform(system="linux", wsl=False, cuda=True, capability=(9, 0),
                          extension=True, extension_archs=("compute_80",))
    assert p.jit_ptx == "compute_80"
    sass = platform.Platform(system="linux", wsl=False, cuda=True, capability=(9, 0),
                             extension=True, extension_archs=("9.0a",))
    assert sass.jit_ptx is None


def test_major_minor_reads_arch_and_version_strings():
    assert platform.major_minor("9.0a") == (9, 0)
    assert platform.major_minor("12.4") == (12, 4)
    assert platform.major_minor("8.0+PTX") == (8, 0)
    assert platform.major_minor("13") == (13, 0)


def test_detect_platform_reads_wsl(monkeypatch):
    monkeypatch.setattr(platform, "is_wsl", lambda: True)
    p = platform.detect_platform()
    assert p.wsl and p.label == "WSL2"


def test_detect_platform_on_this_machine():
    import torch

    p = platform.detect_platform()
    assert p.cuda == torch.cuda.is_available()
    assert p.system in ("linux", "windows") and isinstance(p.wsl, bool)
    assert (p.capability is None) == (not p.cuda)
