"""`ternary build-info` and `ternary targets` from an installed package."""

from __future__ import annotations

import json
import subprocess
import sys


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
