"""The loads a built library's programmatic kernels issue before griddepcontrol.wait.

Some kernels start before the kernel ahead of them in the stream ends (programmatic dependent
launch, csrc/common/launch.cuh) and wait for it (griddepcontrol.wait, ACQBULK in sm_90 SASS)
before they read what it wrote. ptxas schedules non-coherent loads (`ld.global.nc`: __ldg and
const __restrict__ pointers) above that wait, since they declare the memory read-only for the
kernel's whole life: once the decode kernel's first x loads went there and read x from before
the quantize wrote it. So above the wait these kernels may load only their weights (LDGSTS,
cp.async into shared memory) and 32-bit weight scales (LDG.E.CONSTANT); everything else they
load (x, linear_a8's s, the split parts) must come after it. Checked on the SASS the build
produced (`cuobjdump -sass`, which needs nvdisasm beside it), sm_90 code only: the older
arches compile the wait out and are never launched programmatically.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# The kernels launched programmatically (mangled-name patterns) and why each one is.
PROGRAMMATIC = {
    # the A8 instances (template flag SR, the last bool), behind linear_a8's quantize
    "fused_decode_kernel (srow)": re.compile(r"fused_decode_kernelI.*ELb1EEEv"),
    # behind the split-K parts they sum
    "wgmma_big_finish_kernel": re.compile(r"wgmma_big_finish_kernel"),
    "wgmma_rs_finish_kernel": re.compile(r"wgmma_rs_finish_kernel"),
}
# the kinds that must be present in any sm_90a build (the A8 decode instances are)
REQUIRED = ("fused_decode_kernel (srow)",)

_ARCH = re.compile(r"^\s*code for (sm_\d+[af]?)", re.M)
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)", re.M)
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_GLOBAL_LOAD = re.compile(r"\bLDG\.")
_SCALE_LOAD = re.compile(r"\bLDG\.E\.CONSTANT\s")  # 32-bit and non-coherent: a weight scale


class OrderError(RuntimeError):
    """A programmatic kernel loads, before its wait, memory the kernel before it writes."""


def functions(sass: str):
    """(arch, mangled name, [instructions]) for each function of `cuobjdump -sass` output."""
    marks = sorted([(m.start(), "arch", m.group(1)) for m in _ARCH.finditer(sass)] +
                   [(m.start(), "fn", m.group(1)) for m in _FUNCTION.finditer(sass)])
    arch = ""
    for i, (pos, kind, value) in enumerate(marks):
        if kind == "arch":
            arch = value
            continue
        end = marks[i + 1][0] if i + 1 < len(marks) else len(sass)
        yield arch, value, [m.group(1) for m in _INSTR.finditer(sass, pos, end)]


def early_loads(sass: str) -> tuple[dict[str, list[str]], dict[str, int]]:
    """({function: its loads above the first ACQBULK that are not weight-scale loads},
    {kind: how many sm_90 functions of that kind were checked})."""
    bad: dict[str, list[str]] = {}
    seen = {kind: 0 for kind in PROGRAMMATIC}
    for arch, name, instrs in functions(sass):
        if not arch.startswith("sm_9"):
            continue
        kind = next((k for k, p in PROGRAMMATIC.items() if p.search(name)), None)
        if kind is None:
            continue
        wait = next((i for i, ins in enumerate(instrs) if ins.startswith("ACQBULK")), None)
        if wait is None:
            bad[name] = ["no ACQBULK (griddepcontrol.wait) at all"]
            continue
        seen[kind] += 1
        loads = [ins for ins in instrs[:wait]
                 if _GLOBAL_LOAD.search(ins) and not _SCALE_LOAD.search(ins)]
        if loads:
            bad[name] = loads
    return bad, seen


def check_library(cuobjdump: Path, lib: Path, sm_list: tuple[str, ...]) -> dict:
    """Fail unless every programmatic kernel of lib's sm_90 code loads only weights above its
    wait. Returns what was checked, or why nothing could be (no nvdisasm for cuobjdump)."""
    if not any(sm.startswith("sm_9") for sm in sm_list):
        return {"checked": False, "why": f"no sm_90 code in {list(sm_list)}"}
    proc = subprocess.run([str(cuobjdump), "-sass", str(lib)], capture_output=True, text=True)
    if proc.returncode != 0:
        if "nvdisasm" in proc.stderr:
            return {"checked": False, "why": f"{cuobjdump} cannot disassemble without nvdisasm "
                                             f"(not in this toolchain): {proc.stderr.strip()}"}
        raise OrderError(f"`{cuobjdump} -sass {lib}` failed ({proc.returncode}): "
                         f"{proc.stderr.strip()[:400]}")
    bad, seen = early_loads(proc.stdout)
    if bad:
        lines = [f"{name}: {', '.join(loads[:4])}" for name, loads in sorted(bad.items())]
        raise OrderError(
            f"{lib.name}: {len(bad)} programmatic kernel(s) load before griddepcontrol.wait "
            "(ACQBULK) what the kernel before them may still be writing:\n  " +
            "\n  ".join(lines) + "\nRead x, s and workspaces after pdl_wait with coherent loads "
            "(csrc/common/launch.cuh, ld_coherent; csrc/common/mma.cuh, load_x16p<false>)")
    missing = [k for k in REQUIRED if not seen[k]]
    if missing:
        raise OrderError(f"{lib.name}: no sm_90 function matched {missing} "
                         f"({[PROGRAMMATIC[k].pattern for k in missing]}): the kernels were "
                         "renamed or dropped, so ternary._build.sass_order checks nothing; "
                         "update PROGRAMMATIC there")
    return {"checked": True, "kernels": seen}
