"""The system provider: a CUDA toolkit already on this machine, taken only when its nvcc
is the target's CUDA major.minor (torch would otherwise pick whatever nvcc is on PATH)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from ternary._build import matrix
from ternary._build.checks import ToolchainError, major_minor, nvcc_version

PROVIDER = "system"


def candidates(version: str) -> list[tuple[Path, str]]:
    """(cuda_home, where it came from) in the order they are tried."""
    found: list[tuple[Path, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found.append((Path(os.environ[var]), f"${var}"))
    found.append((Path(f"/usr/local/cuda-{version}"), "the default install prefix"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        found.append((Path(nvcc).resolve().parent.parent, f"`which nvcc` ({nvcc})"))
    return found


def _version(home: Path) -> str | None:
    if not (home / "bin" / "nvcc").is_file():
        return None
    try:
        return nvcc_version(home)
    except ToolchainError:
        return None


def find_cuobjdump(home: Path) -> Path | None:
    """A cuobjdump at least as new as the toolkit: its own, or triton's bundled one."""
    own = home / "bin" / "cuobjdump"
    if own.is_file():
        return own
    spec = importlib.util.find_spec("triton")  # locates the package without importing it
    if spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            bundled = Path(loc) / "backends" / "nvidia" / "bin" / "cuobjdump"
            if bundled.is_file():
                return bundled
    on_path = shutil.which("cuobjdump")
    return Path(on_path) if on_path else None


def provide(target: matrix.Target) -> tuple[Path, list[str]]:
    if target.cuda is None:
        raise ToolchainError(f"--toolchain system: target {target.name} has no CUDA version in "
                             "envs/targets.toml")
    want = target.cuda.version
    seen = []
    for home, origin in candidates(want):
        got = _version(home)
        if got is None:
            if origin.startswith("$"):
                seen.append(f"{origin}={home} has no working bin/nvcc")
            continue
        if major_minor(got) == (target.cuda.major, target.cuda.minor):
            return home, [f"CUDA toolchain: system CUDA {got} at {home} (from {origin})"]
        seen.append(f"{origin}: {home} is CUDA {got}")
        if origin.startswith("$"):
            # An explicit CUDA_HOME of the wrong version is a mistake to report, not to
            # route around with another toolkit the user did not name.
            break
    raise ToolchainError(
        f"--toolchain system: no CUDA {want} toolkit for target {target.name} "
        f"({'; '.join(seen) or 'no CUDA_HOME, /usr/local/cuda-' + want + ' or nvcc on PATH'}). "
        f"Set CUDA_HOME to a CUDA {want} toolkit, or use a pinned toolchain "
        "(`--toolchain deb` gives 12.4, `pip` gives 13.x)"
    )
