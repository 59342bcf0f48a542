"""Toolchain providers: every refusal (fast, offline), the cache rules, the apt
configuration, and (marked build) real deb and pip toolchains compiling sm_90a."""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ternary._build import checks, matrix, sass
from ternary._build import toolchains as tc
from ternary._build.toolchains import apt, cache, conda, deb, system, wheels
from ternary._build.toolchains.pins import DEB

ToolchainError = checks.ToolchainError


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TERNARY_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def no_system_cuda(monkeypatch, tmp_path):
    """No CUDA_HOME; /usr/local/cuda-X.Y and `which nvcc` are left out of the search."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(system, "candidates",
                        lambda v, orig=system.candidates: [c for c in orig(v) if c[1][0] == "$"])


# --- provider refusals -------------------------------------------------------------------

def test_pip_refuses_cuda_12_target():
    with pytest.raises(ToolchainError, match=r"--toolchain pip: target h100 needs CUDA 12\.4.*"
                                             r"ptxas.*no nvcc.*--toolchain deb"):
        tc.resolve(matrix.get("h100"), "pip")


def test_pip_refuses_without_lock(monkeypatch, tmp_path):
    monkeypatch.setattr(wheels, "LOCK_DIR", tmp_path)
    with pytest.raises(ToolchainError, match=r"cuda-13\.0\.lock does not exist: run `nox -s lock`"):
        tc.resolve(matrix.get("h200"), "pip")


def test_system_refuses_version_mismatch(monkeypatch, cuda_home):
    monkeypatch.setenv("CUDA_HOME", str(cuda_home("13.0.88")))
    with pytest.raises(ToolchainError, match=r"no CUDA 12\.4 toolkit for target h100 \(\$CUDA_HOME: "
                                             r".*cuda-13\.0\.88 is CUDA 13\.0\.88\)"):
        tc.resolve(matrix.get("h100"), "system")


def test_system_never_takes_path_nvcc_of_other_version(monkeypatch, cuda_home, tmp_path):
    home13 = cuda_home("13.0.88")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{home13 / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(system, "candidates",
                        lambda v, orig=system.candidates: [c for c in orig(v)
                                                           if not c[0].name.startswith("cuda-12")])
    with pytest.raises(ToolchainError, match=r"`which nvcc`.*is CUDA 13\.0\.88"):
        tc.resolve(matrix.get("h100"), "system")


def test_system_refuses_when_nothing_installed(no_system_cuda):
    with pytest.raises(ToolchainError, match=r"no CUDA 12\.4 toolkit.*Set CUDA_HOME"):
        tc.resolve(matrix.get("h100"), "system")


def test_system_cuda_home_without_nvcc(monkeypatch, tmp_path, no_system_cuda):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(ToolchainError, match=rf"\$CUDA_HOME={tmp_path} has no working bin/nvcc"):
        tc.resolve(matrix.get("h100"), "system")


def test_system_accepts_matching_version(monkeypatch, cuda_home):
    home = cuda_home("12.4.131")
    monkeypatch.setenv("CUDA_HOME", str(home))
    t = tc.resolve(matrix.get("h100"), "system")
    assert (t.provider, t.cuda_home, t.nvcc_version) == ("system", home, "12.4.131")
    assert t.cuobjdump == home / "bin" / "cuobjdump"
    assert t.env["CUDA_HOME"] == str(home)
    assert t.env["PATH"].split(os.pathsep)[0] == str(home / "bin")
    assert not t.minor_mismatch
    checks.preflight(cuda_home=t.cuda_home, torch_cuda="12.4", arch_list=["9.0a"], gcc_major=12)


def test_no_cuobjdump(monkeypatch, cuda_home):
    home = cuda_home("12.4.131", cuobjdump=False)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setattr(system.shutil, "which", lambda name: None)
    monkeypatch.setattr(system.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ToolchainError, match="no cuobjdump for the SASS check"):
        tc.resolve(matrix.get("h100"), "system")


def test_conda_refuses_at_once_without_lock_file():
    t0 = time.monotonic()
    with pytest.raises(ToolchainError, match=r"envs/h100/conda-lock\.yml does not exist.*"
                                             r"--toolchain deb"):
        tc.resolve(matrix.get("h100"), "conda")
    assert time.monotonic() - t0 < 5


def test_conda_refuses_without_installer(monkeypatch, tmp_path):
    lock = tmp_path / "envs" / "h100" / "conda-lock.yml"
    lock.parent.mkdir(parents=True)
    lock.write_text("version: 1\n")
    monkeypatch.setattr(conda.matrix, "REPO", tmp_path)
    monkeypatch.setattr(conda.shutil, "which", lambda name: None)
    with pytest.raises(ToolchainError, match="neither conda-lock nor micromamba is on PATH"):
        tc.resolve(matrix.get("h100"), "conda")


def test_deb_refuses_cuda_12_1_without_override():
    for name in ("a100", "rtx4090", "wsl2"):
        with pytest.raises(ToolchainError, match=rf"target {name} needs CUDA 12\.1.*"
                                                 r"--allow-cuda-minor-mismatch"):
            tc.resolve(matrix.get(name), "deb")


def test_deb_refuses_cuda_13_target():
    with pytest.raises(ToolchainError, match=r"deb toolchain is CUDA 12\.4: a different major"):
        tc.resolve(matrix.get("h200"), "deb")


def test_deb_refuses_without_apt(monkeypatch):
    monkeypatch.setattr(deb.shutil, "which", lambda name: None)
    with pytest.raises(ToolchainError, match="needs apt-get and dpkg-deb"):
        tc.resolve(matrix.get("h100"), "deb")


def test_deb_refuses_wrong_file(tmp_path):
    fake = tmp_path / DEB.filename
    fake.write_bytes(b"not the package")
    with pytest.raises(ToolchainError, match=rf"sha256 .* does not match the pinned {DEB.sha256}"):
        deb.verify(fake)


def test_cpu_target_and_unknown_choice():
    with pytest.raises(ToolchainError, match="target cpu has no CUDA version"):
        tc.resolve(matrix.get("cpu"), "auto")
    with pytest.raises(ToolchainError, match="unknown toolchain 'brew'"):
        tc.resolve(matrix.get("h100"), "brew")


def test_auto_choice(no_system_cuda):
    assert tc._auto(matrix.get("h100"), False)[0] == "deb"
    assert tc._auto(matrix.get("h200"), False)[0] == "pip"
    provider, why = tc._auto(matrix.get("a100"), True)
    assert provider == "deb" and "no installed CUDA 12.1" in why


def test_auto_prefers_exact_system_for_12_1(monkeypatch, cuda_home):
    monkeypatch.setenv("CUDA_HOME", str(cuda_home("12.1.105")))
    provider, why = tc._auto(matrix.get("a100"), False)
    assert provider == "system" and "matches exactly" in why


# --- apt, wheels, cache ------------------------------------------------------------------

def test_mirror_from_deb822_and_one_line_sources(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n"
        "Signed-By: /k.gpg\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n")
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64 signed-by=/o.gpg] http://other.example/debian/ bookworm main\n")
    assert apt.debian_mirrors(tmp_path / "sources.list", d) == [
        ("http://mirror.example/debian", "/k.gpg"), ("http://other.example/debian", "/o.gpg")]


def test_no_mirror_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(apt, "SOURCES_LIST", tmp_path / "none.list")
    monkeypatch.setattr(apt, "SOURCES_DIR", tmp_path / "none.d")
    with pytest.raises(ToolchainError, match="no Debian archive mirror found"):
        apt.fetch_deb(tmp_path / "w", package=DEB.package, version=DEB.version, suite=DEB.suite,
                      component=DEB.component, arch=DEB.arch, progress=False)


def test_private_apt_config_stays_private(tmp_path):
    env = apt.private_config(tmp_path, uri="http://mirror.example/debian", keyring="/k.gpg",
                             suite="trixie", component="non-free", arch="amd64")
    conf = Path(env["APT_CONFIG"]).read_text()
    assert (tmp_path / "sources.list").read_text() == \
        "deb [signed-by=/k.gpg] http://mirror.example/debian trixie non-free\n"
    for line in conf.splitlines():
        if line.startswith("Dir::"):
            value = line.split('"')[1]
            assert value in ("", "/dev/null") or value.startswith(str(tmp_path)), line


@pytest.mark.skipif(not shutil.which("apt-get"), reason="apt-get not installed")
def test_unreachable_mirror_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(apt, "debian_mirrors",
                        lambda: [(f"file://{tmp_path}/mirror/debian", apt.DEFAULT_KEYRING)])
    with pytest.raises(ToolchainError, match=r"could not fetch nvidia-cuda-toolkit .*apt-get update failed"):
        apt.fetch_deb(tmp_path / "w", package=DEB.package, version=DEB.version, suite=DEB.suite,
                      component=DEB.component, arch=DEB.arch, progress=False)


def test_locks_pin_targets_toml_nvcc():
    cudas = matrix.cuda_versions()
    for version in wheels.LOCKED_VERSIONS:
        cuda = cudas[version]
        pins = wheels.locked(version)
        assert pins[wheels.nvcc_wheel(cuda)] == cuda.full_version
        assert pins["cuda-toolkit"].startswith(version + ".")
        text = wheels.lock_path(version).read_text()
        assert "Generated by `nox -s lock`" in text.splitlines()[0]
        for name in pins:
            assert re.search(rf"^{re.escape(name)}(\[.*\])?==\S+ \\\n    --hash=sha256:[0-9a-f]{{64}}",
                             text, re.M | re.I), name


def test_missing_lock_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(wheels, "LOCK_DIR", tmp_path)
    with pytest.raises(ToolchainError, match=r"cuda-12\.4\.lock does not exist"):
        wheels.download("12.4", tmp_path / "d", progress=False)


def test_download_failure_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(wheels, "LOCK_DIR", tmp_path)
    (tmp_path / "cuda-12.4.lock").write_text(
        "nvidia-cuda-runtime-cu12==12.4.127 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ToolchainError, match=r"pip download of the CUDA 12\.4 toolchain wheels"):
        wheels.download("12.4", tmp_path / "d", progress=False)


def test_write_lock_refusals(monkeypatch):
    with pytest.raises(ToolchainError, match=r'no \[cuda\."9\.9"\] table'):
        wheels.write_lock("9.9")
    monkeypatch.setattr(wheels.shutil, "which", lambda name: None)
    monkeypatch.setitem(__import__("sys").modules, "uv", None)
    with pytest.raises(ToolchainError, match="writing a toolchain lock needs uv"):
        wheels.write_lock("13.0")


def test_cache_stamp_rules(tmp_path):
    home = cache.root() / "demo"
    inputs = {"lock_sha256": "abc"}

    def assemble(partial, downloads):
        (partial / "bin").mkdir()
        (partial / "bin" / "nvcc").write_text("x")
        (downloads / "big.whl").write_text("y")

    assert not cache.valid(home, inputs)
    cache.build(home, inputs, assemble)
    assert cache.valid(home, inputs)
    assert not home.with_name("demo.downloads").exists()
    assert json.loads((home / cache.STAMP).read_text())["files"] == {"bin/nvcc": 1}
    assert not cache.valid(home, {"lock_sha256": "other"})
    (home / "bin" / "nvcc").write_text("changed")
    assert not cache.valid(home, inputs)


def test_interrupted_assembly_is_not_reused(tmp_path):
    home = cache.root() / "demo"

    def fails(partial, downloads):
        (partial / "half").write_text("x")
        raise ToolchainError("network went away")

    with pytest.raises(ToolchainError):
        cache.build(home, {}, fails)
    assert not cache.valid(home, {})


# --- real toolchains (downloads ~700-800 MB each on a cold cache) ------------------------

KERNEL = "#include <cuda_runtime.h>\n__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n"


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.parametrize("target,choice", [("h100", "deb"), ("h200", "pip")])
def test_real_toolchain_compiles_sm_90a(target, choice, tmp_path, monkeypatch):
    monkeypatch.delenv("TERNARY_CACHE")  # share the user's cache: these are big downloads
    t = matrix.get(target)
    toolchain = tc.resolve(t, choice, progress=False)
    assert toolchain.nvcc_version == t.cuda.full_version
    checks.preflight(cuda_home=toolchain.cuda_home, torch_cuda=t.torch_cuda,
                     arch_list=t.arch_list)
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    obj = tmp_path / "k.o"
    subprocess.run([str(toolchain.cuda_home / "bin" / "nvcc"), "-c", "-gencode",
                    "arch=compute_90a,code=sm_90a", str(src), "-o", str(obj)],
                   env={**os.environ, **toolchain.env}, check=True)
    assert sass.list_archs(toolchain.cuobjdump, obj) == (["sm_90a"], [])
    again = tc.resolve(t, choice, progress=False)  # warm: the stamp makes it a lookup
    assert again.cuda_home == toolchain.cuda_home
