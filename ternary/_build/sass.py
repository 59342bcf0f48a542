"""What a built library really contains: the SASS (cubin) and PTX arches cuobjdump lists."""

from __future__ import annotations

import re
import subprocess
import tempfile
import zipfile
from pathlib import Path

_CUBIN = re.compile(r"\.(sm_\d+[af]?)\.cubin\b")
_PTX = re.compile(r"\.(sm_\d+[af]?)\.ptx\b")


class SassError(RuntimeError):
    """The built library does not hold exactly the target's arch list."""


def _list(cuobjdump: Path, lib: Path, flag: str, pattern: re.Pattern) -> list[str]:
    proc = subprocess.run([str(cuobjdump), flag, str(lib)], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 and "does not contain" not in text:
        raise SassError(f"`{cuobjdump} {flag} {lib}` failed ({proc.returncode}): {text.strip()}")
    return sorted(set(pattern.findall(text)), key=_sm_key)


def _sm_key(sm: str) -> tuple[int, str]:
    """sm_80 < sm_90a < sm_100 (numeric, not string, order)."""
    digits = sm[3:].rstrip("af")
    return int(digits), sm[3 + len(digits):]


def list_archs(cuobjdump: Path, lib: Path) -> tuple[list[str], list[str]]:
    """(SASS arches, PTX arches) embedded in lib, e.g. (['sm_80', 'sm_90a'], [])."""
    return _list(cuobjdump, lib, "--list-elf", _CUBIN), _list(cuobjdump, lib, "--list-ptx", _PTX)


def extension_from_wheel(wheel: Path, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith("ternary/_C") and n.endswith((".so", ".pyd"))]
        if len(names) != 1:
            raise SassError(f"{wheel} holds {names or 'no'} ternary/_C library; expected exactly one")
        return Path(z.extract(names[0], into))


def check_wheel(cuobjdump: Path, wheel: Path, expected: tuple[str, ...],
                ptx: tuple[str, ...] | None = None) -> dict[str, list[str]]:
    """Fail unless the wheel's ternary._C holds SASS for exactly `expected` (sm names) and,
    where `ptx` is given (a PTX build), PTX for exactly those."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = extension_from_wheel(wheel, Path(tmp))
        sass, found_ptx = list_archs(cuobjdump, lib)
    if set(sass) != set(expected):
        missing = sorted(set(expected) - set(sass))
        extra = sorted(set(sass) - set(expected))
        raise SassError(
            f"{wheel.name}: ternary._C holds SASS for {sass or 'nothing'}, but the target's arch list "
            f"is {list(expected) or 'no SASS (a PTX build)'} (missing {missing or 'none'}, "
            f"unexpected {extra or 'none'}). Check TERNARY_ARCH_LIST / TORCH_CUDA_ARCH_LIST / "
            "TERNARY_PTX_ARCH reached the build and TERNARY_NVCC_FLAGS adds no -gencode"
        )
    if ptx is not None and set(found_ptx) != set(ptx):
        raise SassError(
            f"{wheel.name}: ternary._C holds PTX for {found_ptx or 'nothing'}, but this PTX "
            f"build asked for {list(ptx)} only. Check TERNARY_PTX_ARCH reached the build and "
            "TERNARY_NVCC_FLAGS adds no -gencode"
        )
    return {"sass": sass, "ptx": found_ptx}
