"""Native Windows (MSVC) decisions: which toolset, which nvcc/cl flags, which GEMM path, and
where the CUDA DLLs are. Pure functions of their inputs so they are tested on Linux; the
probes (vswhere, the environment) are separate and injectable. Standard library only.

Why these rules:
- CUDA 12.1-12.3's host_config.h rejects MSVC newer than 19.39 (toolset 14.39): pick the
  14.39 toolset with `vcvarsall.bat -vcvars_ver=14.39` when it is installed.
- A newer toolset than targets.toml's msvc_max for the CUDA version only compiles with
  `--allow-unsupported-compiler` (nvcc) and, from VS 17.10 on, with
  `-D_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH` (the STL refuses older nvcc's front end).
- cublasLt on Windows ships as a separate large DLL that torch wheels load lazily and that
  fails in some driver/runtime combinations: the default GEMM path is plain cuBLAS.
- Python 3.8+ on Windows ignores PATH for DLL dependencies of extension modules: the CUDA
  bin directory must be registered with os.add_dll_directory before ternary._C loads.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ternary._build import matrix

ALLOW_UNSUPPORTED = "--allow-unsupported-compiler"
STL_MISMATCH = "-D_ALLOW_COMPILER_AND_STL_VERSION_MISMATCH"
# the first toolset whose STL checks the CUDA front end version (VS 2022 17.10)
STL_CHECK_TOOLSET = (14, 40)


class WindowsBuildError(RuntimeError):
    """No usable MSVC toolset for this CUDA version; the message says what to install."""


def toolset_tuple(version: str) -> tuple[int, int]:
    """'14.39' or '14.39.33519' -> (14, 39)."""
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        raise WindowsBuildError(f"MSVC toolset version {version!r} is not MAJOR.MINOR[.BUILD] "
                                "(e.g. 14.39 or 14.39.33519)")
    return int(parts[0]), int(parts[1])


@dataclasses.dataclass(frozen=True)
class MsvcPlan:
    toolset: str  # the toolset picked, "14.39"
    vcvars_ver: str  # the argument of vcvarsall.bat -vcvars_ver=
    nvcc_flags: tuple[str, ...]
    cxx_flags: tuple[str, ...]
    unsupported: bool  # built with a toolset newer than the CUDA version accepts
    reason: str


def plan_msvc(cuda: matrix.CudaVersion, installed: list[str]) -> MsvcPlan:
    """Pick the toolset and flags for CUDA `cuda` from the toolsets installed
    (vswhere/VC/Tools/MSVC directory names, e.g. ['14.38.33130', '14.41.34120'])."""
    if not installed:
        raise WindowsBuildError(
            f"no MSVC toolset found (CUDA {cuda.version} needs one, at most {cuda.msvc_max}): "
            "install Visual Studio 2022 Build Tools with the 'MSVC v143' component"
            f"{' and the 14.39 toolset' if cuda.major == 12 and cuda.minor <= 3 else ''}")
    limit = toolset_tuple(cuda.msvc_max)
    by_tuple = {toolset_tuple(v): v for v in installed}
    supported = [t for t in by_tuple if t <= limit]
    base = ("/Zc:__cplusplus", "/permissive-", "/EHsc", "/O2", "/MD")
    nvcc_base = ("-Xcompiler", "/Zc:__cplusplus", "-Xcompiler", "/EHsc")
    if supported:
        best = max(supported)
        ts = f"{best[0]}.{best[1]}"
        return MsvcPlan(ts, ts, nvcc_base, base, False,
                        f"toolset {ts} is the newest installed that CUDA {cuda.version} accepts "
                        f"(at most {cuda.msvc_max})")
    newest = max(by_tuple)
    ts = f"{newest[0]}.{newest[1]}"
    nvcc = nvcc_base + (ALLOW_UNSUPPORTED,)
    cxx = base
    if newest >= STL_CHECK_TOOLSET:
        nvcc += ("-Xcompiler", STL_MISMATCH)
        cxx += (STL_MISMATCH,)
    return MsvcPlan(ts, ts, nvcc, cxx, True,
                    f"no installed toolset is at most {cuda.msvc_max} (CUDA {cuda.version}'s "
                    f"limit; installed: {', '.join(sorted(installed))}): building with {ts} and "
                    f"{ALLOW_UNSUPPORTED}. Install the {cuda.msvc_max} toolset "
                    f"(VS installer: 'MSVC v143 - VS 2022 C++ x64/x86 build tools "
                    f"(v{cuda.msvc_max})') for a supported build")


def gemm_path(platform: str, wsl: bool) -> str:
    """Which dense GEMM the dequantize+GEMM kernel path uses: cuBLAS without cublasLt on
    native Windows and WSL2 (see module docstring), cuBLASLt-capable torch.matmul elsewhere."""
    return "cublas-no-lt" if platform == "windows" or wsl else "torch-matmul"


def gemm_env(platform: str, wsl: bool) -> dict[str, str]:
    """Environment that keeps torch's matmul off cublasLt where gemm_path says so."""
    if gemm_path(platform, wsl) == "cublas-no-lt":
        # torch picks cublasLt for bias-fused addmm unless told otherwise
        return {"DISABLE_ADDMM_CUDA_LT": "1"}
    return {}


def dll_directories(env: dict[str, str] | None = None, *, exists=os.path.isdir) -> list[str]:
    """Directories holding the CUDA DLLs ternary._C depends on (cudart64_12.dll, cublas64_12
    .dll), in search order: CUDA_PATH\\bin (and bin\\x64 of CUDA 13), then conda's
    Library\\bin. Only existing directories are returned."""
    env = dict(os.environ if env is None else env)
    dirs: list[str] = []
    for key in ("CUDA_PATH", "CUDA_HOME"):
        if env.get(key):
            dirs += [str(Path(env[key]) / "bin"), str(Path(env[key]) / "bin" / "x64")]
    if env.get("CONDA_PREFIX"):
        dirs.append(str(Path(env["CONDA_PREFIX"]) / "Library" / "bin"))
    seen: list[str] = []
    for d in dirs:
        if d not in seen and exists(d):
            seen.append(d)
    return seen


def register_dll_directories(env: dict[str, str] | None = None, *, os_name: str = os.name,
                             add=None) -> list[str]:
    """On Windows, os.add_dll_directory each CUDA DLL directory (ternary/_ext.py calls this
    before importing ternary._C). Returns what was registered; a no-op elsewhere."""
    if os_name != "nt":
        return []
    add = add or os.add_dll_directory  # type: ignore[attr-defined]
    done = []
    for d in dll_directories(env):
        add(d)
        done.append(d)
    return done
