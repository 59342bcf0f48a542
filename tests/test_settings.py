"""ternary.settings is the one registry of environment variables: nothing reads a TERNARY_*
variable it does not declare, and README's table is the generated one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ternary import settings

ROOT = Path(__file__).resolve().parents[1]
# set by a process for its own children, not read from a user's environment
INTERNAL = {"TERNARY_STACKS_DIR", "TERNARY_STACKS_AT", "TERNARY_H200_STEP",
            # macros of the generated build-info header
            "TERNARY_ARCH_LIST_H", "TERNARY_GIT_REVISION", "TERNARY_TORCH_VERSION"}
NAME = re.compile(r"\bTERNARY_[A-Z0-9_]+\b")


def _sources():
    for pattern in ("ternary/**/*.py", "csrc/**/*.cpp", "csrc/**/*.cu", "csrc/**/*.h",
                    "csrc/**/*.cuh", "setup.py", "noxfile.py", "tools/**/*.sh", "docker/*",
                    "wsl/*", ".ci/run"):
        yield from (p for p in ROOT.glob(pattern) if p.is_file())


def test_every_variable_read_is_declared():
    found = {}
    for path in _sources():
        for name in NAME.findall(path.read_text(errors="replace")):
            found.setdefault(name, path)
    # csrc macros, not environment variables
    macros = {n for n in found if n.startswith(("TERNARY_WG_", "TERNARY_WGMMA", "TERNARY_INST_"))
              or n == "TERNARY_TU"}
    undeclared = {n: str(p.relative_to(ROOT)) for n, p in found.items()
                  if n not in settings.BY_NAME and n not in INTERNAL | macros}
    assert not undeclared, f"declare these in ternary/settings.py: {undeclared}"


def test_get_defaults_and_flags():
    assert settings.get("TERNARY_KERNEL", {}) == "auto"
    assert settings.get("TERNARY_KERNEL", {"TERNARY_KERNEL": ""}) == "auto"
    assert settings.get("TERNARY_KERNEL", {"TERNARY_KERNEL": "fused"}) == "fused"
    assert settings.raw("TERNARY_LARGE_M_MAX", {}) == ""
    assert settings.flag("TERNARY_NO_EXTENSION", {"TERNARY_NO_EXTENSION": "1"})
    assert not settings.flag("TERNARY_NO_EXTENSION", {})
    with pytest.raises(KeyError, match="TERNARY_NOPE is not declared"):
        settings.get("TERNARY_NOPE")


READ = re.compile(r"""(?:os\.environ(?:\.get)?\s*[\[(]|os\.getenv\()\s*["'](TERNARY_[A-Z0-9_]+)""")


def test_declared_variables_are_read_through_the_registry():
    """Python reads a TERNARY_* variable only through ternary.settings (get/raw/flag), so its
    default lives in one place; only the registry itself touches os.environ for them."""
    direct = []
    for path in _sources():
        if path.suffix != ".py" or path.name == "settings.py":
            continue
        for name in READ.findall(path.read_text(errors="replace")):
            if name not in INTERNAL:
                direct.append(f"{path.relative_to(ROOT)}: {name}")
    assert not direct, f"read these through ternary.settings: {direct}"


def test_the_read_pattern_finds_a_direct_read():
    assert READ.findall('x = os.environ.get("TERNARY_CACHE")') == ["TERNARY_CACHE"]
    assert READ.findall("os.environ['TERNARY_KERNEL']") == ["TERNARY_KERNEL"]
    assert READ.findall('env["TERNARY_KERNEL"] = "1"') == []
