"""What the kernel policy, `ternary doctor` and the vLLM plugin share about the machine: the
platform a layer runs on (OS, WSL2, GPU capability, the compiled extension and its archs),
and which GPUs an arch list has code for."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

import torch

from ternary import _ext


@dataclass(frozen=True)
class Platform:
    system: str  # "linux" or "windows"
    wsl: bool
    cuda: bool  # a CUDA device is visible
    capability: tuple[int, int] | None
    extension: bool  # ternary._C loaded
    extension_error: str | None = None
    extension_archs: tuple[str, ...] | None = None  # its build_info arch_list (None: unknown)

    @property
    def jit_ptx(self) -> str | None:
        """The PTX arch of ternary._C that this GPU runs through the driver's JIT (a PTX build,
        or a GPU newer than every SASS arch of a +PTX build); None where SASS serves it."""
        if not (self.extension and self.extension_archs and self.capability):
            return None
        code = device_code(self.extension_archs, "%d.%d" % self.capability)
        return code[1] if code and code[0] == "ptx" else None

    @property
    def label(self) -> str:
        return "WSL2" if self.wsl else ("native Windows" if self.system == "windows" else self.system)


def is_wsl() -> bool:
    try:
        with open("/proc/version") as fh:
            return "microsoft" in fh.read().lower()
    except OSError:
        return False


def detect_platform(device: torch.device | None = None) -> Platform:
    cuda = torch.cuda.is_available()
    cap = None
    if cuda:
        idx = device.index if device is not None and device.type == "cuda" else None
        cap = torch.cuda.get_device_capability(idx)
    err = _ext.load_error()
    archs = tuple(_ext.arch_list(_ext.build_info())) or None
    return Platform(
        system="windows" if os.name == "nt" or sys.platform == "win32" else "linux",
        wsl=is_wsl(),
        cuda=cuda,
        capability=cap,
        extension=_ext.load() is not None,
        extension_error=None if err is None else str(err),
        extension_archs=archs,
    )


def major_minor(v: str) -> tuple[int, int]:
    a, b = (v.split(".") + ["0"])[:2]
    return int(a), int(re.match(r"\d+", b).group())  # type: ignore[union-attr]


def _virtual(compiled: str) -> tuple[int, int] | None:
    """compute_80 -> (8, 0): an arch a PTX build records by nvcc's name (ternary._build.archs)."""
    m = re.fullmatch(r"compute_(\d+)(\d)[af]?", compiled)
    return (int(m.group(1)), int(m.group(2))) if m else None


def arch_covers(compiled: str, device: str) -> bool:
    """`compiled` (an entry of a build's arch list) has code for a GPU of capability `device`:
    SASS for the same major and a minor not above it; an arch-specific build (9.0a) only on
    exactly that GPU; PTX (8.0+PTX, or compute_80 of a PTX-only build) on that capability or
    any later one, compiled by the driver."""
    return device_code([compiled], device) is not None


def device_code(compiled: list[str] | tuple[str, ...], device: str) -> tuple[str, str] | None:
    """How a GPU of capability `device` runs a build of these archs: ("sass", arch) where an
    arch's SASS fits it, else ("ptx", arch) where PTX does (the driver JIT-compiles it when
    the library loads), else None (no code for it)."""
    d = major_minor(device)
    ptx = None
    for arch in compiled:
        v = _virtual(arch)
        if v is not None:
            if d >= v:
                ptx = ptx or arch
            continue
        base = arch.removesuffix("+PTX")
        c = major_minor(base)
        if base.endswith("a") and c == d or not base.endswith("a") and c[0] == d[0] and c[1] <= d[1]:
            return "sass", arch
        if arch.endswith("+PTX") and d >= c:
            ptx = ptx or arch
    return ("ptx", ptx) if ptx else None


def ptx_floor(compiled: list[str] | tuple[str, ...]) -> str | None:
    """The lowest capability a PTX-only build runs on ('compute_80' -> '8.0'), None for a
    build with SASS."""
    vs = [_virtual(a) for a in compiled]
    if not vs or None in vs:
        return None
    return "%d.%d" % min(vs)  # type: ignore[type-var]
