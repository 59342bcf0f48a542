"""setup.py: reference-only package without a toolchain; refusals before compiling."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _wheel(tmp_path, **env):
    full = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_HOME", "TERNARY_ARCH_LIST", "TORCH_CUDA_ARCH_LIST", "TERNARY_NO_EXTENSION")}
    full.update(env, TERNARY_BUILD_DIR=str(tmp_path / "build"))
    return subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
         "--outdir", str(tmp_path / "dist"), str(REPO)],
        env=full, capture_output=True, text=True)


@pytest.mark.parametrize("env", [{}, {"TERNARY_NO_EXTENSION": "1", "TERNARY_ARCH_LIST": "8.0",
                                      "CUDA_HOME": "/nonexistent"}])
def test_reference_only_wheel(tmp_path, env):
    proc = _wheel(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    (whl,) = (tmp_path / "dist").glob("vllm_ternary-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "ternary/ops.py" in names
    assert not [n for n in names if n.startswith("ternary/_C")]


def test_cpu_torch_refused_before_compiling(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.version.cuda:
        pytest.skip("this torch is a CUDA build")
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    proc = _wheel(tmp_path, TERNARY_ARCH_LIST="9.0a", CUDA_HOME=str(nvcc.parents[1]))
    assert proc.returncode != 0
    assert "CPU build" in proc.stderr + proc.stdout


def test_editable_install_builds(tmp_path):
    # `nox -s tests` and test-vllm-compat install the checkout editable into target envs.
    import shutil

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    # The build backend (setuptools, --no-build-isolation) comes from the environment running
    # these tests, the target's locked one, as in nox's editable installs. With
    # --system-site-packages it came from the base interpreter instead (here pyenv's
    # setuptools 65.5, which rejects pyproject's SPDX `license` string). Every package
    # directory this interpreter sees, not only its own purelib: a --host-torch venv (the
    # H200) has no setuptools of its own and sees the host's through a .pth file.
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    dirs = [sysconfig.get_paths()["purelib"]] + [
        p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (Path(site) / "_tests_parent_env.pth").write_text("".join(f"{d}\n" for d in dict.fromkeys(dirs)))
    proc = subprocess.run([uv, "pip", "install", "-q", "--python", str(py),
                           "--no-deps", "--no-build-isolation", "-e", str(REPO)],
                          env={**os.environ, "TERNARY_NO_EXTENSION": "1"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_wheel_carries_the_target_matrix(tmp_path):
    proc = _wheel(tmp_path)
    assert proc.returncode == 0, proc.stderr
    (whl,) = (tmp_path / "dist").glob("vllm_ternary-*.whl")
    z = zipfile.ZipFile(whl)
    assert z.read("ternary/_build/targets.toml") == (REPO / "envs" / "targets.toml").read_bytes()
