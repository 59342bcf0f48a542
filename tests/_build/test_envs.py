"""The hash-pinned pip layers stay in step with targets.toml."""

from __future__ import annotations

import re

import pytest

from ternary._build import envs, matrix

LOCKED = [t for t in matrix.load().values() if t.torch_source == "pypi"]


@pytest.mark.parametrize("target", LOCKED, ids=lambda t: t.name)
def test_lock_input_matches_targets_toml(target):
    req_in = envs.env_dir(target) / "requirements.in"
    assert req_in.read_text() == envs.requirements_in(target), (
        f"{req_in} is stale against envs/targets.toml: run `nox -s lock`")


@pytest.mark.parametrize("target", LOCKED, ids=lambda t: t.name)
def test_lock_pins_every_package_with_hashes(target):
    text = envs.lock_path(target).read_text()
    assert text.startswith(envs.HEADER)
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$", text, re.M)
    assert pins, "no pinned packages"
    blocks = re.split(r"^(?=[A-Za-z0-9_.\-]+==)", text, flags=re.M)[1:]
    for block in blocks:
        assert "--hash=sha256:" in block, f"unhashed pin in {envs.lock_path(target)}: {block[:80]}"
    names = {n.lower() for n, _ in pins}
    assert ("torch", target.torch) in {(n.lower(), v) for n, v in pins}
    for excluded in target.exclude:
        assert excluded not in names, f"{excluded} must be left out of the {target.name} lock"


def test_unreachable_torch_source_is_skipped_with_reason(capsys):
    win = matrix.get("windows")
    assert envs.lock(win) is None
    assert "cannot reach" in capsys.readouterr().err


def test_missing_lock_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TERNARY_VENVS", str(tmp_path))
    t = matrix.get("windows")  # no lock file here
    with pytest.raises(envs.EnvError, match="nox -s lock"):
        envs.ensure(t)


def test_host_torch_venv_sees_the_host_packages_even_from_a_venv(tmp_path, monkeypatch):
    # The test's own interpreter is a venv (like the H200's /opt/torch/.venv): the host venv
    # must still see its packages and install into its own prefix.
    import subprocess
    import sys

    monkeypatch.setenv("TERNARY_VENVS", str(tmp_path))
    py = envs.ensure(matrix.get("h200"), host_torch=True, host_python=sys.executable)
    out = subprocess.run([str(py), "-c", "import sys, pytest; print(sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(tmp_path / "h200-host")
