"""The WSL2 distribution builder: config files, refusals, and (marked build/slow) a real
tarball chrooted into to import ternary."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from ternary._build import matrix, wsl


def test_wsl_conf_files_parse_and_point_at_the_first_boot_check():
    conf = configparser.ConfigParser()
    conf.read(wsl.WSL_DIR / "wsl.conf")
    assert conf["user"]["default"] == "ternary"
    assert conf["interop"]["appendWindowsPath"] == "false"
    dist = configparser.ConfigParser()
    dist.read(wsl.WSL_DIR / "wsl-distribution.conf")
    assert dist["oobe"]["command"] == "/usr/local/lib/ternary/first-boot.sh"
    assert dist["oobe"]["defaultUid"] == "1000"
    boot = (wsl.WSL_DIR / "first-boot.sh").read_text()
    assert "ternary doctor" in boot and os.access(wsl.WSL_DIR / "first-boot.sh", os.X_OK)


def test_install_ps1_imports_with_wsl_import():
    ps1 = (wsl.WSL_DIR / "install.ps1").read_text()
    assert "wsl.exe --import $Name $InstallDir $Tarball --version 2" in ps1
    assert "first-boot.sh" in ps1 and "throw" in ps1


def test_profile_is_pin_memory_safe_and_avoids_cublaslt():
    text = wsl.profile_script(matrix.get("wsl2"))
    assert "export TERNARY_PIN_MEMORY=0" in text
    assert "export DISABLE_ADDMM_CUDA_LT=1" in text
    assert f"export PATH={wsl.VENV}/bin:$PATH" in text


def test_install_config_writes_ld_conf_and_no_driver(tmp_path):
    for d in ("etc/profile.d", "etc/ld.so.conf.d"):
        (tmp_path / d).mkdir(parents=True)
    wsl.install_config(tmp_path, matrix.get("wsl2"))
    assert (tmp_path / wsl.LD_CONF).read_text() == "/usr/lib/wsl/lib\n"
    assert (tmp_path / "etc" / "wsl-distribution.conf").is_file()
    assert os.access(tmp_path / "usr/local/lib/ternary/first-boot.sh", os.X_OK)
    assert wsl.linux_gpu_driver_files(tmp_path) == []


def test_a_linux_driver_in_the_rootfs_is_found(tmp_path):
    lib = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.1").write_text("")
    stub = tmp_path / "usr" / "lib" / "wsl" / "lib"
    stub.mkdir(parents=True)
    (stub / "libcuda.so.1").write_text("")
    assert wsl.linux_gpu_driver_files(tmp_path) == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]


def test_missing_wheel_is_refused(tmp_path):
    with pytest.raises(wsl.WslBuildError, match=r"nope\.whl does not exist.*build-wsl2"):
        wsl.build_tarball("wsl2", tmp_path / "nope.whl", tmp_path / "out.tar.gz")


def test_missing_requirements_is_refused(tmp_path):
    whl = tmp_path / "x-1-py3-none-any.whl"
    whl.write_text("")
    with pytest.raises(wsl.WslBuildError, match=r"missing\.txt does not exist.*nox -s lock"):
        wsl.build_tarball("wsl2", whl, tmp_path / "o.tar.gz", requirements=tmp_path / "missing.txt")


def test_windows_target_is_refused(tmp_path):
    whl = tmp_path / "x-1-py3-none-any.whl"
    whl.write_text("")
    req = tmp_path / "r.txt"
    req.write_text("")
    with pytest.raises(wsl.WslBuildError, match="'windows' is platform 'windows'"):
        wsl.build_tarball("windows", whl, tmp_path / "o.tar.gz", requirements=req)


def test_non_root_is_refused(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(wsl.WslBuildError, match="needs root"):
        wsl.check_host()


def test_failed_command_is_named():
    with pytest.raises(wsl.WslBuildError, match=r"probe failed \(exit 1\): `false`"):
        wsl._run(["false"], "probe")


def _build_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot)"
    if shutil.which("debootstrap") is None:
        return "debootstrap not installed (apt install debootstrap)"
    if not list(Path("/opt/wheels").glob("torch-*+cpu-*.whl")):
        return "no CPU torch wheel in /opt/wheels"
    return None


@pytest.mark.build
@pytest.mark.slow
def test_tarball_chroots_and_imports_ternary(tmp_path):
    """A real tarball: reference-only wheel of ternary and the CPU torch (the wsl2 target's
    8 GB CUDA stack is not practical here); unpack it, chroot, import ternary."""
    why = _build_skip_reason()
    if why:
        pytest.skip(why)
    env = {**os.environ, "TERNARY_NO_EXTENSION": "1", "TERNARY_BUILD_DIR": str(tmp_path / "b")}
    subprocess.run([os.sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(matrix.REPO)], check=True, env=env,
                   capture_output=True)
    wheel = next((tmp_path / "dist").glob("vllm_ternary-*.whl"))
    req = tmp_path / "req.txt"
    req.write_text("torch==2.13.0+cpu\nnumpy\nsafetensors\nrich\n")
    out = wsl.build_tarball("wsl2", wheel, tmp_path / "wsl2.tar.gz", requirements=req,
                            find_links="/opt/wheels")
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(out) as tf:
        names = tf.getnames()
    assert "./etc/wsl.conf" in names and "./etc/wsl-distribution.conf" in names
    assert "./" + wsl.LD_CONF in names
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xzf", str(out)], check=True)
    r = subprocess.run(["chroot", str(root), f"{wsl.VENV}/bin/python", "-c",
                        "import ternary, ternary.ops, torch; print(ternary.__version__, "
                        "torch.__version__)"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1] == "2.13.0+cpu"
    doc = subprocess.run(["chroot", str(root), f"{wsl.VENV}/bin/ternary", "doctor", "--json"],
                         capture_output=True, text=True)
    assert '"checks"' in doc.stdout, doc.stderr
    assert wsl.linux_gpu_driver_files(root) == []


# --- the same tarball from the same packages ---------------------------------------------

def _tree(root: Path, order, mtime: int, umask_mode: int) -> Path:
    for rel in order:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"content of {rel}\n")
        p.chmod(umask_mode)
        os.utime(p, (mtime, mtime))
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "shadow").write_text(f"root:*:{mtime // 86400}:0:99999:7:::\n"
                                         f"ternary:!:{mtime // 86400 + 3}:0:99999:7:::\n")
    (root / "var" / "log" / "apt").mkdir(parents=True, exist_ok=True)
    (root / "var" / "log" / "apt" / "history.log").write_text(f"Start-Date: {mtime}\n")
    (root / "var" / "cache" / "ldconfig").mkdir(parents=True, exist_ok=True)
    (root / "var" / "cache" / "ldconfig" / "aux-cache").write_bytes(os.urandom(16))
    return root


@pytest.mark.skipif(shutil.which("tar") is None or shutil.which("gzip") is None,
                    reason="needs GNU tar and gzip")
def test_same_tree_gives_same_tarball_whatever_times_order_and_logs(tmp_path):
    files = ["usr/bin/a", "opt/ternary/venv/lib/x.py", "usr/lib/b.so", "home/ternary/.bashrc"]
    one = _tree(tmp_path / "one", files, 1_700_000_000, 0o644)
    two = _tree(tmp_path / "two", list(reversed(files)), 1_800_000_000, 0o644)
    epoch = 1_764_581_000
    for root in (one, two):
        touched = wsl.scrub(root, epoch)
        assert "var/cache/ldconfig/aux-cache" in touched and "etc/shadow" in touched
    a = wsl.deterministic_tar_gz(one, tmp_path / "one.tar.gz", epoch)
    b = wsl.deterministic_tar_gz(two, tmp_path / "two.tar.gz", epoch)
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as t:
        members = t.getmembers()
        names = [m.name for m in members]
        assert names == sorted(names, key=lambda n: n.split("/"))
        assert {m.mtime for m in members} == {epoch}
        assert {(m.uname, m.gname) for m in members} <= {("", ""), ("root", "root")}
        assert t.extractfile("./var/log/apt/history.log").read() == b""
        assert f":{epoch // 86400}:" in t.extractfile("./etc/shadow").read().decode()
    (two / "usr" / "bin" / "a").chmod(0o755)  # a mode is content: it must show
    c = wsl.deterministic_tar_gz(two, tmp_path / "three.tar.gz", epoch)
    assert c.read_bytes() != a.read_bytes()


def test_package_manifest_and_what_changed(tmp_path):
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/apt/lists").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "Package: python3\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-1+b1\n\n"
        "Package: tzdata\nStatus: install ok installed\nArchitecture: all\nVersion: 2024a-0+deb12u1\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1\n")
    (tmp_path / "var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages"
     ).write_text("Package: python3\nVersion: 3.11.2-1+b1\nArchitecture: amd64\nSHA256: " + "a" * 64
                  + "\nDescription: x\n continued\n\nPackage: tzdata\nVersion: 2024b-0+deb12u1\n"
                  "Architecture: all\nSHA256: " + "b" * 64 + "\n")
    m = wsl.package_manifest(tmp_path)
    assert [(p["package"], p["version"], p["sha256"]) for p in m] == [
        ("python3", "3.11.2-1+b1", "a" * 64), ("tzdata", "2024a-0+deb12u1", None)]
    new = [dict(m[0], sha256="c" * 64), dict(m[1], version="2024b-0+deb12u1", sha256="b" * 64),
           {"package": "libgomp1", "version": "12.2.0-14", "architecture": "amd64", "sha256": None}]
    changes = wsl.manifest_changes(m, new)
    assert changes == ["libgomp1:amd64: added 12.2.0-14",
                       "python3:amd64: 3.11.2-1+b1, same version, other .deb (sha256 "
                       "aaaaaaaaaaaaaaaa... -> cccccccccccccccc...)",
                       "tzdata:all: 2024a-0+deb12u1 -> 2024b-0+deb12u1"]
