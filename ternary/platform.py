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


def arch_covers(compiled: str, device: str) -> bool:
    """SASS for `compiled` runs on a GPU of capability `device`: same major and a minor not
    above it; an arch-specific build (9.0a) only on exactly that GPU; PTX (8.0+PTX) on that
    capability or any later one, compiled by the driver."""
    c_major, c_minor = major_minor(compiled)
    d_major, d_minor = major_minor(device)
    if compiled.endswith("+PTX"):
        return (d_major, d_minor) >= (c_major, c_minor)
    if compiled.endswith("a"):
        return (c_major, c_minor) == (d_major, d_minor)
    return c_major == d_major and c_minor <= d_minor
