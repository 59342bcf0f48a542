"""`ternary build-info` and `ternary targets` from an installed package."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _ternary(*args):
    # -P: run the installed package, not a checkout in the working directory
    return subprocess.run([sys.executable, "-P", "-m", "ternary", *args], capture_output=True, text=True,
                          check=True).stdout


def test_build_info_json_names_extension_state():
    from ternary import _ext

    info = json.loads(_ternary("build-info", "--json"))
    assert info["extension"] is (_ext.load() is not None)
    if info["extension"]:
        assert info["arch_list"] and info["cuda_version"] and info["git_revision"]
    else:
        assert "reference" in info["extension_status"] or "fails to load" in info["extension_status"]


def test_targets_json_lists_matrix():
    data = json.loads(_ternary("targets", "--json"))
    assert data["h100"]["arch_list"] == ["9.0a"]
    assert "current" in _ternary("targets")


def test_a_stale_extension_is_reported_not_a_traceback(monkeypatch, capsys):
    """An extension built from older sources (no build_info) reads as present but unusable,
    with the advice to rebuild, in build-info and wherever a native op is needed."""
    import importlib
    import importlib.util
    import types

    from ternary import _ext
    from ternary.cli import main

    stale = types.ModuleType("ternary._C")
    stale.__file__ = "/x/ternary/_C.so"
    monkeypatch.setattr(_ext, "_state", {})
    with monkeypatch.context() as m:  # only for the extension's one import (it is cached)
        m.setattr(importlib.util, "find_spec", lambda name, *a: object())
        m.setattr(importlib, "import_module", lambda name, *a: stale)
        assert _ext.load() is None
    assert main(["build-info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["extension"] is False
    assert "present but fails to load: /x/ternary/_C.so predates this vllm-ternary" in \
        info["extension_status"]
    with pytest.raises(RuntimeError, match="predates this vllm-ternary .* Rebuild it"):
        _ext.require()
