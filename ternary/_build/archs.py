"""The device code a build compiles, as nvcc flags: SASS for each arch of a target's arch
list, or, for a PTX build (`--ptx-arch 8.0`), only the PTX of one virtual arch (compute_80),
which the driver JIT-compiles on any GPU of that capability or later. A PTX build runs the
sm_80 code path (`__CUDA_ARCH__` 800) on an H200: how the A100 and RTX 4090 kernels are
tested on the GPU we have (docs/build.md, "PTX builds"). Standard library only (setup.py).
"""

from __future__ import annotations

import re

from ternary._build.matrix import MatrixError, arch_to_sm

_PLAIN = re.compile(r"^(\d+)\.(\d+)$")


def ptx_arch(value: str) -> str:
    """The `--ptx-arch` / TERNARY_PTX_ARCH value, checked: a plain MAJOR.MINOR."""
    v = value.strip()
    if v.endswith(("a", "f")) and _PLAIN.match(v[:-1]):
        raise MatrixError(
            f"--ptx-arch {v}: PTX of an arch-specific target ({v}) runs only on exactly that GPU "
            "and cannot stand in for another; give a plain arch such as 8.0 or 8.9")
    if not _PLAIN.match(v):
        raise MatrixError(f"--ptx-arch {value!r} is not of the form MAJOR.MINOR (e.g. 8.0, 8.9)")
    return v


def virtual(arch: str) -> str:
    """'8.0' -> 'compute_80': nvcc's name for the virtual arch, and the name a PTX build
    records in its arch list (build_info, `ternary build-info`)."""
    return "compute_" + arch_to_sm(arch)[len("sm_"):]


def gencode_flags(arch_list: list[str] | tuple[str, ...], ptx: str | None = None) -> list[str]:
    """nvcc's -gencode flags: SASS for each arch ('9.0a' -> code=sm_90a; '8.0+PTX' adds the
    PTX), or with `ptx` the PTX of that one arch and no SASS. Passed explicitly rather than
    through TORCH_CUDA_ARCH_LIST: torch adds none of its own once any flag mentions "arch",
    and a checkout path with "arch" in it (inside -ffile-prefix-map) would then leave the
    build with nvcc's default arch."""
    if ptx:
        c = virtual(ptx_arch(ptx))
        return [f"-gencode=arch={c},code={c}"]
    flags = []
    for a in arch_list:
        base, plus = (a[:-len("+PTX")], True) if a.endswith("+PTX") else (a, False)
        c = virtual(base)
        flags.append(f"-gencode=arch={c},code={arch_to_sm(base)}")
        if plus:
            flags.append(f"-gencode=arch={c},code={c}")
    return flags
