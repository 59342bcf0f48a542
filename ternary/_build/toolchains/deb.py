"""The deb provider: CUDA 12.4.131 from Debian's nvidia-cuda-toolkit package (NVIDIA's
binaries, unpacked with dpkg-deb, never installed), completed with the hash-pinned
-cu12 wheels of envs/toolchains/cuda-12.4.lock (ptxas, libnvvm, libdevice, headers,
libcudart). The layout is the one docs/build.md describes, which works with torch."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

from ternary._build import matrix
from ternary._build.checks import ToolchainError, nvcc_version
from ternary._build.hashing import sha256
from ternary._build.toolchains import apt, cache, progress, wheels
from ternary._build.toolchains.pins import DEB

PROVIDER = "deb"
# Bump when the assembled layout changes, so older caches are rebuilt.
LAYOUT = "1"
# From the deb: the compiler driver and the tools around it. ptxas and libdevice come
# from the wheel instead (byte-identical ptxas; the wheel is the pinned, hash-locked one).
DEB_BIN = ("cudafe++", "fatbinary", "nvlink", "bin2c", "cuobjdump", "nvdisasm", "cu++filt",
           "nvprune")
DEB_TOOLKIT = Path("usr/lib/nvidia-cuda-toolkit")
# Debian's usr/bin/nvcc is a two-line wrapper pointing into /usr/lib; nvcc.profile is ours.
NVCC_PROFILE = """\
# Written by ternary._build.toolchains.deb: paths relative to this directory, so the
# toolchain works wherever the cache lives.
TOP              = $(_HERE_)/..
CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice

LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(CICC_PATH):$(_HERE_):

INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)

LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"

CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


def name() -> str:
    return f"deb-cuda-{DEB.version.split('~')[0]}"


def usable() -> str | None:
    """None when this host can run the deb provider, else why not."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (f"the deb toolchain is {DEB.arch} Linux binaries; this host is "
                f"{platform.system()} {platform.machine()}")
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        return "the deb toolchain needs apt-get and dpkg-deb (a Debian or Ubuntu host)"
    return None


def verify(deb: Path) -> None:
    got_size, got = deb.stat().st_size, sha256(deb)
    if got != DEB.sha256 or got_size != DEB.size:
        raise ToolchainError(
            f"{deb.name}: sha256 {got} ({got_size} bytes) does not match the pinned "
            f"{DEB.sha256} ({DEB.size} bytes) in ternary/_build/toolchains/pins.py. The mirror "
            "serves a different file under the same version: do not use it; report it, or use "
            "`--toolchain system` with an installed CUDA 12.4"
        )


def _wheel_member(member: str) -> str | None:
    """Where a member of a -cu12 wheel goes in CUDA_HOME (None: not needed)."""
    parts = member.split("/")
    if len(parts) < 4 or parts[0] != "nvidia" or parts[-1] == "__init__.py":
        return None
    comp, sub, rest = parts[1], parts[2], "/".join(parts[3:])
    if sub == "include":
        return f"include/{rest}"
    if comp == "cuda_nvcc" and sub == "bin" and rest == "ptxas":
        return "bin/ptxas"
    if comp == "cuda_nvcc" and sub == "nvvm":
        return f"nvvm/{rest}"
    if comp == "cuda_runtime" and sub == "lib" and rest.startswith("libcudart"):
        return f"lib64/{rest}"
    return None


def assemble(home: Path, downloads: Path, *, show: bool) -> None:
    progress.step(PROVIDER, f"fetching {DEB.package} {DEB.version} ({DEB.suite} {DEB.component}, "
                  f"{DEB.size / 1e6:.0f} MB) with a private apt configuration", show)
    deb = apt.fetch_deb(downloads / "apt", package=DEB.package, version=DEB.version,
                        suite=DEB.suite, component=DEB.component, arch=DEB.arch, progress=show)
    verify(deb)
    progress.step(PROVIDER, f"sha256 verified ({DEB.sha256[:16]}...); unpacking with dpkg-deb -x", show)
    unpacked = downloads / "deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    tk = unpacked / DEB_TOOLKIT
    (home / "bin" / "crt").mkdir(parents=True)
    (home / "nvvm" / "bin").mkdir(parents=True)
    shutil.copy2(tk / "bin" / "nvcc", home / "bin" / "nvcc")
    for tool in DEB_BIN:
        shutil.copy2(unpacked / "usr" / "bin" / tool, home / "bin" / tool)
    for stub in (tk / "bin" / "crt").glob("*.stub"):
        shutil.copy2(stub, home / "bin" / "crt" / stub.name)
    shutil.copy2(tk / "bin" / "cicc", home / "nvvm" / "bin" / "cicc")
    (home / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)

    lock = wheels.lock_path(DEB.cuda_version)
    progress.step(PROVIDER, f"downloading the wheels of {lock.relative_to(matrix.REPO)} "
                  "(pip, --require-hashes)", show)
    whls = wheels.download(DEB.cuda_version, downloads / "wheels", progress=show)
    for whl in progress.track(whls, "unpacking wheels", len(whls), show):
        wheels.extract(whl, home, _wheel_member)
    for lib in (home / "lib64").glob("libcudart.so.*"):
        (home / "lib64" / "libcudart.so").symlink_to(lib.name)
    (home / "lib").symlink_to("lib64")
    missing = [p for p in ("bin/ptxas", "nvvm/lib64/libnvvm.so", "nvvm/libdevice/libdevice.10.bc",
                           "include/cuda_runtime.h", "include/cublas_v2.h", "include/cusparse.h",
                           "include/cusolverDn.h", "include/thrust/version.h",
                           "lib64/libcudart.so") if not (home / p).exists()]
    if missing:
        raise ToolchainError(f"the CUDA 12.4 toolchain assembled in {home} lacks {missing}: the "
                             f"wheels of {lock} no longer hold them; rerun `nox -s lock` and check")
    want = DEB.version.split("~")[0]
    if nvcc_version(home) != want:
        raise ToolchainError(f"{home}/bin/nvcc reports CUDA {nvcc_version(home)}, not the pinned "
                             f"{want} of {DEB.package} {DEB.version}")


def refusal(target: matrix.Target, allow_cuda_minor_mismatch: bool) -> str | None:
    """None when the deb provider can serve target, else why not."""
    cuda = target.cuda
    if cuda is None:
        return f"target {target.name} has no CUDA version in envs/targets.toml"
    if cuda.version == DEB.cuda_version:
        return usable()
    if cuda.major != int(DEB.cuda_version.split(".")[0]):
        return (f"target {target.name} needs CUDA {cuda.version}, and the deb toolchain is CUDA "
                f"{DEB.cuda_version}: a different major version. Use `--toolchain pip` (CUDA 13), "
                "`conda` or `system`")
    if not allow_cuda_minor_mismatch:
        return (f"target {target.name} needs CUDA {cuda.version}, which has no reachable source "
                f"here; the deb toolchain is CUDA {DEB.cuda_version}. Pass "
                f"`--allow-cuda-minor-mismatch` to build with CUDA {DEB.cuda_version} (the build "
                f"report will say so), or use `--toolchain conda` / `system` with CUDA {cuda.version}")
    return usable()


def provide(target: matrix.Target, *, allow_cuda_minor_mismatch: bool = False,
            show: bool = True) -> tuple[Path, list[str]]:
    """CUDA_HOME of the deb toolchain (assembled once, then reused), and report notes."""
    why = refusal(target, allow_cuda_minor_mismatch)
    if why:
        raise ToolchainError(f"--toolchain deb: {why}")
    lock = wheels.lock_path(DEB.cuda_version)
    wheels.locked(DEB.cuda_version)
    inputs = {"deb_sha256": DEB.sha256, "lock_sha256": sha256(lock), "layout": LAYOUT}
    with cache.locked(name()) as home:
        why = cache.check(home, inputs)
        if why is None:
            progress.step(PROVIDER, f"CUDA {DEB.version.split('~')[0]} toolchain cached at {home}", show)
            return home, [f"CUDA toolchain: deb {DEB.package} {DEB.version} + "
                          f"{lock.name} wheels (cached at {home})"]
        if (home / cache.STAMP).exists():
            progress.step(PROVIDER, f"cached toolchain not used: {why}; reassembling it", show)
        cache.build(home, inputs, lambda h, d: assemble(h, d, show=show))
        progress.step(PROVIDER, f"CUDA {nvcc_version(home)} toolchain assembled at {home} "
                      f"({cache.size(home) / 1e6:.0f} MB)", show)
    return home, [f"CUDA toolchain: deb {DEB.package} {DEB.version} + {lock.name} wheels "
                  f"(assembled at {home})"]
