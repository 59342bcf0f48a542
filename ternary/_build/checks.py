"""Refusals before compiling: each problem found gets one clear message naming the values
and what to do. Used by `nox -s build-*` and by setup.py, so `pip install .` refuses alike."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ternary._build import matrix


class ToolchainError(RuntimeError):
    """The toolchain cannot build this target; the message says why and what to do."""


def nvcc_path(cuda_home: str | os.PathLike | None) -> Path:
    if not cuda_home:
        raise ToolchainError(
            "no nvcc found: CUDA_HOME is not set. Pick a pinned toolchain with "
            "`-- --toolchain deb|pip|conda`, or point CUDA_HOME at a CUDA toolkit "
            "(`-- --toolchain system`)"
        )
    nvcc = Path(cuda_home) / "bin" / ("nvcc.exe" if os.name == "nt" else "nvcc")
    if not nvcc.is_file():
        raise ToolchainError(
            f"no nvcc found: {nvcc} does not exist (CUDA_HOME={cuda_home}). Point CUDA_HOME at "
            "a CUDA toolkit or pick a pinned toolchain with `-- --toolchain deb|pip|conda`"
        )
    return nvcc


def nvcc_version(cuda_home: str | os.PathLike) -> str:
    """'12.4.131' from `nvcc --version` ('release 12.4, V12.4.131')."""
    nvcc = nvcc_path(cuda_home)
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise ToolchainError(f"{nvcc} --version failed: {e}") from e
    m = re.search(r"release \d+\.\d+, V(\d+\.\d+\.\d+)", out)
    if not m:
        raise ToolchainError(f"cannot read the CUDA version from `{nvcc} --version`: {out!r}")
    return m.group(1)


def gcc_version(cxx: str | None = None) -> tuple[str, int]:
    """(path, major) of the host C++ compiler torch will use (CXX, else c++)."""
    cxx = cxx or os.environ.get("CXX") or "c++"
    path = shutil.which(cxx)
    if path is None:
        raise ToolchainError(f"no host C++ compiler: {cxx!r} is not on PATH (set CXX)")
    out = subprocess.run([path, "-dumpversion"], capture_output=True, text=True).stdout.strip()
    try:
        return path, int(out.split(".")[0])
    except ValueError as e:
        raise ToolchainError(f"cannot read the version of {path} (-dumpversion said {out!r})") from e


def major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def preflight(*, cuda_home: str | os.PathLike | None, torch_cuda: str | None,
              arch_list: list[str] | tuple[str, ...], allow_cuda_minor_mismatch: bool = False,
              gcc_major: int | None = None, nvcc_ver: str | None = None) -> dict[str, str]:
    """Check that the toolchain at cuda_home can build arch_list for a torch built with
    torch_cuda. Returns the facts it established (for the build report); raises
    ToolchainError naming the first problem. gcc_major/nvcc_ver skip the probes (tests)."""
    if nvcc_ver is None:
        nvcc_ver = nvcc_version(cuda_home)
    if not torch_cuda:
        raise ToolchainError(
            "torch in this environment is a CPU build (torch.version.cuda is None): it cannot "
            "load a CUDA extension. Install the target's CUDA torch (`nox -s build-<target>` "
            "does) or set TERNARY_NO_EXTENSION=1 for a reference-only package"
        )
    n_major, n_minor = major_minor(nvcc_ver)
    t_major, t_minor = major_minor(torch_cuda)
    if n_major != t_major:
        raise ToolchainError(
            f"CUDA major version mismatch: nvcc at {cuda_home} is CUDA {nvcc_ver} but torch was "
            f"built with CUDA {torch_cuda}. Use a CUDA {t_major}.x toolchain "
            f"(`-- --toolchain deb` gives 12.4, `pip` gives 13.0)"
        )
    if n_minor != t_minor and not allow_cuda_minor_mismatch:
        raise ToolchainError(
            f"CUDA minor version mismatch: nvcc is CUDA {nvcc_ver}, torch was built with CUDA "
            f"{torch_cuda}. Pass `-- --allow-cuda-minor-mismatch` to build anyway (the report "
            f"will say so), or use a CUDA {torch_cuda} toolchain"
        )
    key = f"{n_major}.{n_minor}"
    cudas = matrix.cuda_versions()
    if key not in cudas:
        raise ToolchainError(
            f"CUDA {nvcc_ver} (nvcc at {cuda_home}) has no [cuda.\"{key}\"] table in "
            f"{matrix.TARGETS_TOML}: its gcc limit and arch list are unknown (known: {sorted(cudas)})"
        )
    cuda = cudas[key]
    if os.name != "nt":
        if gcc_major is None:
            _, gcc_major = gcc_version()
        if gcc_major > cuda.max_gcc:
            raise ToolchainError(
                f"host gcc {gcc_major} is newer than CUDA {key} accepts (at most gcc "
                f"{cuda.max_gcc}). Set CXX/CC to an older gcc (e.g. CXX=g++-{cuda.max_gcc})"
            )
    bad = [a for a in arch_list if a not in cuda.archs]
    if bad:
        raise ToolchainError(
            f"CUDA {key} cannot target arch {', '.join(bad)} (it targets {', '.join(cuda.archs)}); "
            "9.0a needs CUDA 12.0+, 10.0 and 12.0 need 12.8+. Use a newer toolchain or "
            "change the arch list"
        )
    if not arch_list:
        raise ToolchainError("the arch list is empty: nothing to compile (TERNARY_ARCH_LIST)")
    return {
        "nvcc_version": nvcc_ver,
        "torch_cuda": torch_cuda,
        "minor_mismatch": "yes (allowed by --allow-cuda-minor-mismatch)" if n_minor != t_minor else "no",
    }

