"""The pip provider: a CUDA 13 toolkit assembled from NVIDIA's wheels, hash-pinned in
envs/toolchains/cuda-13.X.lock. From CUDA 13 on, nvidia-cuda-nvcc ships the whole compiler
driver; the -cu12 wheels hold ptxas only, so CUDA 12 targets cannot use this provider."""

from __future__ import annotations

import platform
from pathlib import Path

from ternary._build import matrix
from ternary._build.checks import ToolchainError, nvcc_version
from ternary._build.toolchains import cache, progress, wheels
from ternary._build.hashing import sha256
from ternary._build.toolchains.pins import PIP_CUDA_MAJORS

PROVIDER = "pip"
LAYOUT = "1"
# Shared libraries worth their size: the runtime (torch links -lcudart) and nvvm (cicc
# loads it). cublas & co. are there for their headers only (hundreds of MB of .so).
KEEP_LIBS = ("libcudart", "libcudadevrt", "libnvvm")


def name(cuda: matrix.CudaVersion) -> str:
    return f"pip-cuda-{cuda.full_version}"


def refusal(target: matrix.Target) -> str | None:
    """None when the pip provider can serve target, else why not."""
    cuda = target.cuda
    if cuda is None:
        return f"target {target.name} has no CUDA version in envs/targets.toml"
    if cuda.major not in PIP_CUDA_MAJORS:
        return (f"target {target.name} needs CUDA {cuda.version}, and the pip toolchain serves "
                f"CUDA {', '.join(f'{m}.x' for m in PIP_CUDA_MAJORS)} only: the -cu{cuda.major} "
                f"nvidia-cuda-nvcc wheels ship ptxas, libnvvm and libdevice but no nvcc, cicc, "
                f"cudafe++ or nvlink. Use `--toolchain deb` (CUDA 12.4), `conda` or `system`")
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return (f"the pip toolchain uses manylinux x86_64 wheels; this host is "
                f"{platform.system()} {platform.machine()}")
    if not wheels.lock_path(cuda.version).is_file():
        return (f"{wheels.lock_path(cuda.version)} does not exist: run `nox -s lock` to pin the "
                f"CUDA {cuda.version} wheels")
    return None


def _member(major: int):
    prefix = f"nvidia/cu{major}/"

    def where(member: str) -> str | None:
        if not member.startswith(prefix) or member.endswith("__init__.py"):
            return None
        rel = member[len(prefix):]
        if rel.startswith(".metadata/"):
            return None
        if rel.startswith("lib/") and "/" not in rel[4:]:
            return rel if rel[4:].startswith(KEEP_LIBS) else None
        return rel

    return where


def assemble(cuda: matrix.CudaVersion, home: Path, downloads: Path, *, show: bool) -> None:
    lock = wheels.lock_path(cuda.version)
    progress.step(PROVIDER, f"downloading the wheels of {lock.relative_to(matrix.REPO)} "
                  "(pip, --require-hashes)", show)
    whls = wheels.download(cuda.version, downloads, progress=show)
    where = _member(cuda.major)
    for whl in progress.track(whls, "unpacking wheels", len(whls), show):
        wheels.extract(whl, home, where)
    lib = home / "lib"
    for so in sorted(lib.glob("lib*.so.*")):
        plain = lib / (so.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(so.name)
    # torch looks for CUDA_HOME/lib64.
    (home / "lib64").symlink_to("lib")
    missing = [p for p in ("bin/nvcc", "bin/nvcc.profile", "bin/ptxas", "bin/cuobjdump",
                           "bin/nvdisasm",
                           "nvvm/bin/cicc", "include/cuda_runtime.h", "include/cublas_v2.h",
                           "include/cusparse.h", "include/cusolverDn.h", "lib/libcudart.so")
               if not (home / p).exists()]
    if missing:
        raise ToolchainError(f"the CUDA {cuda.version} toolchain assembled in {home} lacks "
                             f"{missing}: the wheels of {lock} no longer hold them; rerun "
                             "`nox -s lock` and check")
    got = nvcc_version(home)
    if got != cuda.full_version:
        raise ToolchainError(f"{home}/bin/nvcc reports CUDA {got}, but envs/targets.toml pins "
                             f"CUDA {cuda.version} to {cuda.full_version}: rerun `nox -s lock`")


def provide(target: matrix.Target, *, show: bool) -> tuple[Path, list[str]]:
    why = refusal(target)
    if why:
        raise ToolchainError(f"--toolchain pip: {why}")
    cuda = target.cuda
    lock = wheels.lock_path(cuda.version)
    pins = wheels.locked(cuda.version)
    inputs = {"lock_sha256": sha256(lock), "layout": LAYOUT}
    note = (f"CUDA toolchain: pip wheels of {lock.name} (cuda-toolkit "
            f"{pins.get('cuda-toolkit', '?')}, cuobjdump {pins.get('nvidia-cuda-cuobjdump', '?')}, "
            f"nvdisasm {pins.get('nvidia-cuda-nvdisasm', '?')})")
    with cache.locked(name(cuda)) as home:
        why = cache.check(home, inputs)
        if why is None:
            progress.step(PROVIDER, f"CUDA {cuda.full_version} toolchain cached at {home}", show)
            return home, [f"{note}, cached at {home}"]
        if (home / cache.STAMP).exists():
            progress.step(PROVIDER, f"cached toolchain not used: {why}; reassembling it", show)
        cache.build(home, inputs, lambda h, d: assemble(cuda, h, d, show=show))
        progress.step(PROVIDER, f"CUDA {cuda.full_version} toolchain assembled at {home} "
                      f"({cache.size(home) / 1e6:.0f} MB)", show)
    return home, [f"{note}, assembled at {home}"]
