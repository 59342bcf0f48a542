"""Loads the compiled extension ternary._C, if any, without ever breaking import.

A missing extension is normal (CPU installs, TERNARY_NO_EXTENSION=1): the reference ops
serve. A present but unloadable one (built for another torch or CUDA) is remembered with
its error, which is raised with a diagnosis when a native op is first needed.
"""

from __future__ import annotations

import importlib
import importlib.util

_state: dict[str, object] = {}


def load() -> object | None:
    """Import ternary._C once; return the module or None."""
    if "module" in _state:
        return _state["module"]
    module = None
    if importlib.util.find_spec("ternary._C") is not None:
        from ternary._build.windows import register_dll_directories

        register_dll_directories()  # Windows ignores PATH for an extension's DLLs; no-op elsewhere
        try:
            module = importlib.import_module("ternary._C")
        except ImportError as e:  # wrong torch ABI, missing libcudart, ...
            _state["error"] = e
        if module is not None and not hasattr(module, "build_info"):
            # a build from before this package's sources (its ops may not match them)
            _state["error"] = ImportError(
                f"{getattr(module, '__file__', 'ternary._C')} predates this vllm-ternary (it "
                "has no build_info); rebuild it")
            module = None
    _state["module"] = module
    return module


def load_error() -> Exception | None:
    load()
    return _state.get("error")  # type: ignore[return-value]


def require() -> object:
    """The extension, or an error that says why it is not usable and what to do."""
    module = load()
    if module is not None:
        return module
    err = load_error()
    if err is not None:
        import torch

        raise RuntimeError(
            f"ternary._C is installed but failed to load with torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}): {err}. Rebuild it for this torch: "
            "`nox -s build-<target>` or `pip install --no-build-isolation .`"
        ) from err
    raise RuntimeError(
        "ternary._C is not installed (built with TERNARY_NO_EXTENSION=1 or without a CUDA "
        "toolchain), so no CUDA kernel exists; use TERNARY_KERNEL=reference or build the "
        "extension with `nox -s build-<target>`"
    )


def build_info() -> dict[str, object] | None:
    """Facts compiled into ternary._C (CUDA version, archs, git revision), or None."""
    module = load()
    if module is None:
        return None
    return dict(module.build_info())  # type: ignore[attr-defined]


def arch_list(info: dict | None) -> list[str]:
    """The archs of a build_info() (its "arch_list", "8.0;8.6;9.0a"), as a list."""
    import re

    value = (info or {}).get("arch_list") or []
    return [a for a in re.split(r"[;, ]+", value) if a] if isinstance(value, str) else list(value)


def fused_route(m: int, n: int, k: int, group_size: int = 0, device: int = 0) -> str:
    """The CUDA kernel ternary::gemm_fused picks for x [m, k] and n outputs on `device`
    ("decode", "decode_pair", "decode_shallow", ..., "fused_gemm", "fused_gemm_nt",
    "wgmma_rs", ...; the decode kernel's instances all begin with "decode"). Needs ternary._C."""
    return str(fused_plan(m, n, k, group_size, device)["route"])


def a8_route(m: int, device: int = 0) -> str:
    """The kernel ternary::gemm_a8_repacked runs for m rows on `device`: "wgmma_a8" (Hopper's
    int8 wgmma, sm_90a builds, from m = 128) or "mma_a8" (mma.sync). Needs ternary._C."""
    return str(require().a8_route(m, device))  # type: ignore[attr-defined]


def linear_a8_route(m: int, n: int, k: int, dtype=None, device: int = 0) -> str:
    """The kernel ternary::linear_a8 runs for x [m, k] of `dtype` (torch.float16, bfloat16
    (the default) or float32) and n outputs on `device`: a float kernel's name as fused_route
    gives it (the decode kernels, "wgmma_big...", "fused_gemm_nt"; with gemm_a8's epilogue) or
    gemm_a8_repacked's "wgmma_a8" / "mma_a8". Needs ternary._C."""
    name = str(dtype or "torch.bfloat16").removeprefix("torch.")
    return str(require().linear_a8_route(m, n, k, name, device))  # type: ignore[attr-defined]


def a8_wgmma_compiled(device: int = 0) -> bool:
    """Whether ternary::gemm_a8_wgmma can run on `device` (its sm_90a image is the one the
    device loaded). Needs ternary._C."""
    return bool(require().a8_wgmma_compiled(device))  # type: ignore[attr-defined]


def fused_plan(m: int, n: int, k: int, group_size: int = 0, device: int = 0) -> dict:
    """fused_route with the tile of its tensor-core kernels: {"route", "tokens" (a block; 0
    off wgmma_rs / wgmma_big), "splits" (K split)}. Needs ternary._C."""
    return dict(require().fused_plan(m, n, k, group_size, device))  # type: ignore[attr-defined]
