"""Pinned CUDA toolchains, found by a provider and always handed on with an explicit
CUDA_HOME (torch otherwise picks whatever nvcc is on PATH).

Providers: conda (envs/<target>/conda-lock.yml), deb (CUDA 12.4.131 from Debian's package
plus hash-pinned wheels), pip (CUDA 13 from hash-pinned wheels), system (an installed
toolkit of the target's CUDA major.minor). Standard library only."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ternary._build import matrix
from ternary._build.checks import ToolchainError, nvcc_version
from ternary._build.toolchains import conda, deb, pip, system
from ternary._build.toolchains.pins import DEB, PIP_CUDA_MAJORS
from ternary._build.toolchains.wheels import write_lock

CHOICES = ("auto", "conda", "system", "pip", "deb")

__all__ = ["CHOICES", "Toolchain", "ToolchainError", "resolve", "write_lock"]


@dataclasses.dataclass(frozen=True)
class Toolchain:
    provider: str
    cuda_home: Path
    nvcc_version: str
    cuobjdump: Path
    env: dict[str, str]
    notes: list[str]
    minor_mismatch: bool = False  # nvcc's CUDA minor differs from the target's (allowed)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "cuda_home": str(self.cuda_home),
                "cuobjdump": str(self.cuobjdump)}


def build_env(cuda_home: Path) -> dict[str, str]:
    """Variables to build with: every tool that guesses a toolkit is told this one."""
    bin_dir = str(cuda_home / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    return {
        "CUDA_HOME": str(cuda_home),
        "CUDA_PATH": str(cuda_home),
        "CUDACXX": str(cuda_home / "bin" / "nvcc"),
        "PATH": os.pathsep.join([bin_dir, *path]),
    }


def _auto(target: matrix.Target, allow_cuda_minor_mismatch: bool) -> tuple[str, str]:
    """(provider, why) for --toolchain auto."""
    cuda = target.cuda
    if conda.refusal(target) is None:
        return "conda", f"{conda.lock_file(target).name} and {conda.installer()} are present"
    conda_why = "no conda lock file or installer"
    if cuda.major in PIP_CUDA_MAJORS and pip.refusal(target) is None:
        return "pip", f"{conda_why}; CUDA {cuda.version} is served by the pinned wheels"
    if cuda.major == int(DEB.cuda_version.split(".")[0]) and deb.usable() is None:
        if cuda.version == DEB.cuda_version:
            return "deb", f"{conda_why}; CUDA {cuda.version} is the deb toolchain's version"
        try:
            system.provide(target)
            return "system", f"{conda_why}; an installed CUDA {cuda.version} matches exactly"
        except ToolchainError:
            pass
        return "deb", (f"{conda_why} and no installed CUDA {cuda.version}; the deb toolchain is "
                       f"CUDA {DEB.cuda_version}")
    return "system", f"{conda_why}; neither the deb nor the pip toolchain serves this host/target"


def resolve(target: matrix.Target, choice: str = "auto", *, allow_cuda_minor_mismatch: bool = False,
            progress: bool = True) -> Toolchain:
    """The CUDA toolchain target builds with, from the provider choice names; downloads
    and assembles it on first use (cached). Raises ToolchainError with one clear message."""
    if choice not in CHOICES:
        raise ToolchainError(f"unknown toolchain {choice!r}: choose one of {', '.join(CHOICES)}")
    if target.cuda is None:
        raise ToolchainError(f"target {target.name} has no CUDA version in envs/targets.toml "
                             "(a CPU target): it needs no CUDA toolchain")
    notes: list[str] = []
    provider = choice
    if choice == "auto":
        provider, why = _auto(target, allow_cuda_minor_mismatch)
        notes.append(f"--toolchain auto picked {provider}: {why}")
    if provider == "deb":
        home, more = deb.provide(target, allow_cuda_minor_mismatch=allow_cuda_minor_mismatch,
                                 show=progress)
    elif provider == "pip":
        home, more = pip.provide(target, show=progress)
    elif provider == "conda":
        home, more = conda.provide(target, show=progress)
    else:
        home, more = system.provide(target)
    notes += more
    version = nvcc_version(home)
    mm = version.split(".")[:2] != target.cuda.version.split(".")
    if mm:
        notes.append(f"CUDA {'.'.join(version.split('.')[:2])} toolchain used for a CUDA "
                     f"{target.cuda.version} target (--allow-cuda-minor-mismatch)")
    cuobjdump = system.find_cuobjdump(home)
    if cuobjdump is None:
        raise ToolchainError(
            f"no cuobjdump for the SASS check: {home}/bin/cuobjdump does not exist and none is "
            "on PATH or bundled with triton. Install CUDA's cuobjdump, or use `--toolchain deb` "
            "or `pip`, which bring one"
        )
    return Toolchain(provider=provider, cuda_home=Path(home), nvcc_version=version,
                     cuobjdump=cuobjdump, env=build_env(Path(home)), notes=notes,
                     minor_mismatch=mm)
