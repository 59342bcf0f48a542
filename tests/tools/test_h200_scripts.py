"""tools/h200's shell scripts: they only run on the GPU machine, where a wrong path costs a
device call, so here: their syntax, every checkout path they name exists, and every stage
serve-and-bench.sh accepts has its function in lib.sh."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

H200 = Path(__file__).resolve().parents[2] / "tools" / "h200"
REPO = H200.parents[1]
SCRIPTS = sorted(H200.glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_parses(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_checkout_path_it_names_exists(script):
    text = script.read_text()
    paths = set(re.findall(r'\$REPO/((?:tests|bench|tools|ternary|docs)/[\w./-]+\.(?:py|sh|txt))', text))
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"{script.name} names {missing}, which the checkout does not have"


def test_every_stage_has_its_function():
    accepted = set()
    for line in re.findall(r"^\s+([\w|-]+)\) ;;$", (H200 / "serve-and-bench.sh").read_text(),
                           re.M):
        accepted |= set(line.split("|"))
    defined = set(re.findall(r"^stage_(\w+)\(\)", (H200 / "lib.sh").read_text(), re.M))
    assert {"kbench", "ptx", "faults", "smoke", "bench"} <= accepted
    missing = sorted(s for s in accepted if s.replace("-", "_") not in defined)
    assert not missing, f"serve-and-bench.sh accepts {missing}, lib.sh has no stage_ for them"
