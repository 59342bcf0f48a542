"""Shared fixtures and the GPU skip rule: `gpu` tests run where a CUDA GPU and the
compiled extension are present, and are reported as skipped, with the reason, elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# test-<target> runs these tests against an installed wheel: the build-system tests still
# read this checkout's envs/ (locks, targets.toml).
os.environ.setdefault("TERNARY_REPO", str(Path(__file__).resolve().parents[1]))


def _gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA GPU visible (torch {torch.__version__}, CUDA {torch.version.cuda})"
    from ternary import _ext

    if _ext.load() is None:
        err = _ext.load_error()
        return f"ternary._C is not built{f' ({err})' if err else ''}"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
