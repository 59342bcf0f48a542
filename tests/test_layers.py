"""The layer contract of pyproject.toml ([tool.importlinter]): commands -> tools -> vllm
plugin -> formats -> kernels -> ops -> platform -> build system, no upward import and no
import cycle among sibling modules, function-level imports included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_layers_and_no_cycles():
    pytest.importorskip("importlinter", reason="import-linter is not installed here")
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is not next to this python: install import-linter"
    proc = subprocess.run([exe, str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
