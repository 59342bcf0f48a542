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
