"""The conda provider: cuda-nvcc, cuda-cudart-dev, cuda-cccl and libcublas-dev at the
target's pinned version from envs/<target>/conda-lock.yml, installed with conda-lock or
micromamba into the toolchain cache. It refuses before touching the network when the lock
file or an installer is missing (conda-lock otherwise retries unreachable channels for
about a minute)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ternary._build import matrix
from ternary._build.checks import ToolchainError
from ternary._build.toolchains import cache, progress
from ternary._build.hashing import sha256

PROVIDER = "conda"
INSTALLERS = ("conda-lock", "micromamba")


def lock_file(target: matrix.Target) -> Path:
    return matrix.REPO / "envs" / target.name / "conda-lock.yml"


def installer() -> str | None:
    for tool in INSTALLERS:
        if shutil.which(tool):
            return tool
    return None


def refusal(target: matrix.Target) -> str | None:
    lock = lock_file(target)
    if not lock.is_file():
        return (f"{lock.relative_to(matrix.REPO)} does not exist (conda channels were not "
                f"reachable when `nox -s lock` ran, so no conda lock was generated for target "
                f"{target.name}). Run `nox -s lock` where conda channels are reachable, or use "
                "`--toolchain deb`, `pip` or `system`")
    if installer() is None:
        return (f"neither {' nor '.join(INSTALLERS)} is on PATH to install {lock}: "
                "`pip install conda-lock` or install micromamba, or use another toolchain")
    return None


def provide(target: matrix.Target, *, show: bool = True) -> tuple[Path, list[str]]:
    why = refusal(target)
    if why:
        raise ToolchainError(f"--toolchain conda: {why}")
    lock, tool = lock_file(target), installer()
    inputs = {"conda_lock_sha256": sha256(lock)}
    with cache.locked(f"conda-{target.name}") as home:
        if not cache.valid(home, inputs):
            def install(prefix: Path, _downloads: Path) -> None:
                progress.step(PROVIDER, f"installing {lock} with {tool}", show)
                prefix.rmdir()  # both installers want to create the prefix themselves
                cmd = (["conda-lock", "install", "--prefix", str(prefix), str(lock)]
                       if tool == "conda-lock" else
                       ["micromamba", "create", "--yes", "--prefix", str(prefix), "-f", str(lock)])
                run = subprocess.run(cmd, text=True, capture_output=not show)
                if run.returncode != 0:
                    raise ToolchainError(f"{' '.join(cmd)} failed (exit {run.returncode})"
                                         f"{': ' + run.stderr[-2000:] if run.stderr else ''}")
            cache.build(home, inputs, install)
    return home, [f"CUDA toolchain: conda, {lock.relative_to(matrix.REPO)} installed with {tool} "
                  f"at {home}"]
