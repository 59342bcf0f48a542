"""`ternary doctor`: is this machine able to run ternary, and which path will it take?

Each check gives a verdict (ok / warn / fail), what it saw, and the fix. Everything the checks
look at comes through `Probes`, whose fields are plain callables: tests replace them to reach
every verdict on a machine without a GPU. A probe that raises is reported as that check's
failure, never as a crash of the doctor.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from ternary import settings
from ternary.platform import arch_covers, device_code, is_wsl, major_minor, ptx_floor
from typing import Callable

OK, WARN, FAIL = "ok", "warn", "fail"
WSL_LIB = "/usr/lib/wsl/lib"


@dataclasses.dataclass
class Check:
    name: str
    verdict: str
    detail: str
    fix: str = ""


# ---------------------------------------------------------------- probes (real system) ----

def _run(cmd: list[str], timeout: float = 15) -> str | None:
    exe = shutil.which(cmd[0]) or (f"{WSL_LIB}/{cmd[0]}" if os.path.exists(f"{WSL_LIB}/{cmd[0]}")
                                   else None)
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def probe_driver() -> dict | None:
    """{'driver': '550.54.15', 'cuda': '12.4', 'gpus': [('NVIDIA A100', '8.0'), ...]} from
    nvidia-smi (on WSL2 it lives in /usr/lib/wsl/lib), or None when there is none."""
    head = _run(["nvidia-smi"])
    query = _run(["nvidia-smi", "--query-gpu=driver_version,name,compute_cap",
                  "--format=csv,noheader"])
    if head is None or query is None:
        return None
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", head)
    rows = [[c.strip() for c in line.split(",")] for line in query.strip().splitlines()]
    return {"driver": rows[0][0] if rows else "?", "cuda": m.group(1) if m else None,
            "gpus": [(r[1], r[2]) for r in rows if len(r) >= 3]}


def probe_torch() -> dict:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "available": torch.cuda.is_available(),
            "devices": [(torch.cuda.get_device_name(i),
                         "%d.%d" % torch.cuda.get_device_capability(i)) for i in range(n)]}


def probe_nvcc() -> tuple[str, str] | None:
    """(CUDA_HOME, nvcc version) of the toolkit a build here would use; None when there is
    none at all. A toolkit named (CUDA_HOME / CUDA_PATH, or nvcc on PATH) whose nvcc does not
    answer raises ToolchainError, with the variable that named it."""
    from ternary._build import checks

    var = next((v for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)), None)
    home = os.environ.get(var) if var else None
    if not home:
        nvcc = shutil.which("nvcc")
        home = str(Path(nvcc).resolve().parent.parent) if nvcc else None
    if not home:
        return None
    try:
        return home, checks.nvcc_version(home)
    except checks.ToolchainError as e:
        named = f"{var}={home}" if var else f"nvcc on PATH (toolkit {home})"
        raise checks.ToolchainError(f"{named}: {e}") from e


def probe_libcuda() -> dict:
    """Where libcuda.so.1 is: the files present and what the dynamic loader resolves."""
    found = []
    for d in (WSL_LIB, "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        found += sorted(glob.glob(f"{d}/libcuda.so*"))
    ld = _run(["ldconfig", "-p"]) or _run(["/sbin/ldconfig", "-p"]) or ""
    resolved = [line.split("=>")[-1].strip() for line in ld.splitlines()
                if "libcuda.so.1 " in line]
    conf = " ".join(Path(p).read_text() for p in glob.glob("/etc/ld.so.conf.d/*.conf"))
    return {"files": found, "resolved": resolved, "wsl_lib_configured": WSL_LIB in conf}


def probe_build_info() -> tuple[dict | None, str | None]:
    from ternary import _ext

    info = _ext.build_info()
    err = _ext.load_error()
    return info, (str(err) if err else None)


def probe_host_compiler() -> tuple[str, int] | None:
    from ternary._build import checks

    try:
        return checks.gcc_version()
    except checks.ToolchainError:
        return None


def probe_vllm() -> str | None:
    try:
        from ternary.vllm.version import vllm_version

        return vllm_version()
    except Exception:  # noqa: BLE001 - no vLLM (or no ternary.vllm): reported as absent
        return None


def probe_plugin() -> str:
    """How the vLLM plugin registered ("api", "dict", "already"); raises why it did not."""
    from ternary.vllm import plugin

    how = plugin.register()
    return how if isinstance(how, str) else "registered"


def probe_kernel() -> str:
    """The kernel ternary.kernels' policy picks for a typical layer (4096 x 4096, bf16 on a
    GPU, per-channel scale) on GPU 0; raises ImportError where that module is absent and the
    chooser's own error (every kernel's reason) when nothing fits."""
    import importlib

    import torch

    kernels = importlib.import_module("ternary.kernels")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    platform = kernels.detect_platform(device)
    chosen = kernels.choose(platform, n=4096, k=4096, group_size=0, device=device,
                            dtype=torch.bfloat16 if cuda else torch.float32)
    name = getattr(chosen, "name", None) or type(chosen).__name__
    return (f"{name} on this {platform.label} machine (4096x4096 layer, TERNARY_KERNEL "
            f"overrides); activation none: float x into it; int8_per_token: "
            f"{activation_quantizer(cuda)}, then {a8_kernels(chosen, cuda)}")


def a8_kernels(chosen, cuda: bool) -> str:
    """What an int8_per_token layer of 4096 x 4096 runs on the chosen kernel, by M."""
    route_a8 = getattr(chosen, "route_a8", None)
    if route_a8 is None:  # (an older ternary.kernels)
        return "the same GEMM on the integer-valued x"
    import torch

    from ternary.kernels import a8_routes

    dtype = torch.bfloat16 if cuda else torch.float32
    return f"{a8_routes(chosen, 4096, 4096, dtype)} (gemm_a8's result at every M)"


def activation_quantizer(cuda: bool) -> str:
    """Which implementation of ternary::quantize_act_int8 runs for a layer whose activation
    mode is int8_per_token (the checkpoint's quantization_config says which mode a model has)."""
    import torch

    import ternary.ops  # noqa: F401 (defines the op)

    if cuda and torch._C._dispatch_has_kernel_for_dispatch_key("ternary::quantize_act_int8",
                                                               "CUDA"):
        return "per-token int8 quantize by ternary._C's CUDA kernel"
    return "per-token int8 quantize by the PyTorch reference"


def probe_wsl() -> bool:
    return is_wsl()


# A fresh interpreter with the driver's JIT cache off runs the kernels a 4096 x 4096 layer
# takes at M = 1, 16 and 128 (and the int8 activation path) twice: with CUDA's lazy module
# loading each kernel is JIT-compiled at its first launch, so the first round's extra time
# over the second is what a process with a cold cache pays (~/.nv/ComputeCache keeps the
# result for the next one).
_JIT_CODE = """
import time, torch
from ternary import ops
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
n = k = 4096
codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")
packed = ops.pack(codes); repacked = ops.repack(packed)
scale = torch.rand(n, device="cuda") + 0.5
xs = [torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for m in (1, 16, 128)]
def calls():
    for x in xs:
        ops.gemm_fused(x, repacked, scale, 0, n)
        q, s = ops.quantize_act_int8(x, torch.int8)
        ops.gemm_a8(q, s, packed, scale)
    torch.cuda.synchronize()
t0 = time.perf_counter(); calls(); t1 = time.perf_counter(); calls(); t2 = time.perf_counter()
print((t1 - t0) - (t2 - t1))
"""


def probe_jit_seconds() -> float | None:
    """Seconds the driver takes to JIT-compile the kernels of a typical layer on GPU 0 with a
    cold cache, None where it cannot be measured."""
    import subprocess
    import sys

    env = {**os.environ, "CUDA_MODULE_LOADING": "LAZY", "CUDA_CACHE_DISABLE": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", _JIT_CODE], env=env, capture_output=True,
                             text=True, timeout=900)
        return max(0.0, float(out.stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


@dataclasses.dataclass
class Probes:
    driver: Callable[[], dict | None] = probe_driver
    torch: Callable[[], dict] = probe_torch
    nvcc: Callable[[], tuple[str, str] | None] = probe_nvcc
    libcuda: Callable[[], dict] = probe_libcuda
    build_info: Callable[[], tuple[dict | None, str | None]] = probe_build_info
    host_compiler: Callable[[], tuple[str, int] | None] = probe_host_compiler
    vllm: Callable[[], str | None] = probe_vllm
    plugin: Callable[[], str] = probe_plugin
    kernel: Callable[[], str] = probe_kernel
    wsl: Callable[[], bool] = probe_wsl
    jit_seconds: Callable[[], float | None] = probe_jit_seconds
    os_name: Callable[[], str] = lambda: os.name
    env: Callable[[], dict] = lambda: dict(os.environ)


# ---------------------------------------------------------------------------- checks ----

def _targets_for(cap: str) -> list[str]:
    from ternary._build import matrix

    return [t.name for t in matrix.load().values()
            if any(arch_covers(a, cap) for a in t.arch_list)]


def check_driver(p: Probes, torch_info: dict | None) -> Check:
    d = p.driver()
    if d is None:
        return Check("driver", WARN, "no NVIDIA driver (nvidia-smi not found): CPU only",
                     "install the NVIDIA driver for GPU use (on WSL2: the Windows driver; "
                     "nothing inside Linux); the reference ops run without one")
    detail = f"driver {d['driver']}, supports CUDA {d['cuda']}, {len(d['gpus'])} GPU(s)"
    t_cuda = (torch_info or {}).get("cuda")
    if d["cuda"] and t_cuda:
        (dm, dn), (tm, tn) = major_minor(d["cuda"]), major_minor(t_cuda)
        if dm < tm:
            return Check("driver", FAIL, f"{detail}; torch needs CUDA {t_cuda}",
                         f"update the NVIDIA driver to one supporting CUDA {tm}.x")
        if (dm, dn) < (tm, tn):
            return Check("driver", WARN, f"{detail}; torch is built for CUDA {t_cuda}",
                         "works through minor-version compatibility (no PTX JIT); update the "
                         f"driver to one supporting CUDA {t_cuda} to be safe")
    return Check("driver", OK, detail)


def check_torch(p: Probes, has_gpu: bool) -> tuple[Check, dict | None]:
    try:
        t = p.torch()
    except ImportError as e:
        return Check("torch", FAIL, f"torch does not import: {e}",
                     "install the target's locked environment (nox -s build-<target>)"), None
    if t["cuda"] is None:
        if has_gpu:
            return Check("torch", FAIL, f"torch {t['version']} is a CPU build but a GPU is "
                         "present", "install the CUDA torch of your target "
                         "(envs/<target>/requirements.lock)"), t
        return Check("torch", OK, f"torch {t['version']} (CPU build; reference ops)"), t
    if not t["available"]:
        return Check("torch", FAIL, f"torch {t['version']} (CUDA {t['cuda']}) sees no GPU",
                     "check the driver check above; in a container pass --gpus all; "
                     "CUDA_VISIBLE_DEVICES may hide every GPU"), t
    return Check("torch", OK, f"torch {t['version']}, CUDA {t['cuda']}, "
                 f"{len(t['devices'])} GPU(s) visible"), t


def check_nvcc(p: Probes, torch_info: dict | None) -> Check:
    from ternary._build import checks

    try:
        n = p.nvcc()
    except checks.ToolchainError as e:
        return Check("nvcc", WARN, f"no working CUDA toolkit: {e}",
                     "point CUDA_HOME at a CUDA toolkit's root (the directory holding "
                     "bin/nvcc) or unset it; needed only to build ternary._C")
    if n is None:
        return Check("nvcc", WARN, "no CUDA toolkit (CUDA_HOME unset, no nvcc on PATH)",
                     "needed only to build ternary._C: nox -s build-<target> pins one")
    home, ver = n
    t_cuda = (torch_info or {}).get("cuda")
    if not t_cuda:
        return Check("nvcc", OK, f"nvcc {ver} at {home} (torch is a CPU build)")
    (nm, nn), (tm, tn) = major_minor(ver), major_minor(t_cuda)
    if nm != tm:
        return Check("nvcc", FAIL, f"nvcc {ver} at {home}, torch built with CUDA {t_cuda}",
                     f"set CUDA_HOME to a CUDA {tm}.x toolkit (-- --toolchain deb gives 12.4, "
                     "pip gives 13.0)")
    if nn != tn:
        return Check("nvcc", WARN, f"nvcc {ver} at {home}, torch built with CUDA {t_cuda}",
                     "builds need --allow-cuda-minor-mismatch; use a CUDA "
                     f"{t_cuda} toolkit to avoid it")
    return Check("nvcc", OK, f"nvcc {ver} at {home} matches torch's CUDA {t_cuda}")


def check_libcuda(p: Probes, wsl: bool, has_gpu: bool) -> Check:
    if p.os_name() == "nt":
        return Check("libcuda", OK, "Windows: nvcuda.dll comes with the driver")
    lc = p.libcuda()
    files, resolved = lc["files"], lc["resolved"]
    if wsl:
        stub = [f for f in files if f.startswith(WSL_LIB)]
        linux = [f for f in files if not f.startswith(WSL_LIB)]
        if linux:
            return Check("libcuda", FAIL, f"a Linux driver's libcuda is installed inside WSL2: "
                         f"{', '.join(linux)}", "remove it (apt purge the nvidia driver "
                         "packages): on WSL2 libcuda must be the Windows driver's stub in "
                         f"{WSL_LIB}")
        if not stub:
            return Check("libcuda", FAIL, f"no libcuda in {WSL_LIB}",
                         "update the Windows NVIDIA driver (it provides the WSL2 stub) and "
                         "run `wsl --update`")
        if not lc["wsl_lib_configured"] and not any(r.startswith(WSL_LIB) for r in resolved):
            return Check("libcuda", FAIL, f"{stub[0]} exists but the loader does not search "
                         f"{WSL_LIB}", f"echo {WSL_LIB} > /etc/ld.so.conf.d/ld.so.wsl.conf "
                         "&& ldconfig")
        return Check("libcuda", OK, f"WSL2 stub {stub[0]}")
    if not files and not resolved:
        verdict = FAIL if has_gpu else WARN
        return Check("libcuda", verdict, "no libcuda.so.1 found",
                     "install the NVIDIA driver (in containers: the NVIDIA container toolkit "
                     "mounts it)")
    return Check("libcuda", OK, (resolved or files)[0])


def check_archs(p: Probes, gpus: list[tuple[str, str]]) -> list[Check]:
    info, err = p.build_info()
    if info is None:
        if err:
            return [Check("ternary._C", FAIL, f"present but fails to load: {err}",
                          "rebuild for this torch: nox -s build-<target>")]
        return [Check("ternary._C", WARN, "not built: the PyTorch reference ops run",
                      "nox -s build-<target> for the CUDA kernels")]
    from ternary import _ext

    archs = _ext.arch_list(info)
    out = [Check("ternary._C", OK, f"built with CUDA {info.get('cuda_version')} for "
                 f"{';'.join(archs)} ({info.get('git_revision', '?')})")]
    jit: list[float | None] = []  # measured once, for the first GPU that needs it
    for i, (name, cap) in enumerate(gpus):
        code = device_code(archs, cap)
        if code and code[0] == "ptx":
            if not jit:
                jit.append(p.jit_seconds())
            took = (f"the first calls of a 4096 x 4096 layer at M 1/16/128 took {jit[0]:.1f} s "
                    "longer than the next with a cold cache" if jit[0] is not None
                    else "the JIT's time could not be measured")
            out.append(Check(f"gpu{i} arch", OK, f"{name} (sm_{cap.replace('.', '')}) runs "
                             f"{code[1]} PTX: the driver JIT-compiles each kernel at its first launch "
                             f"({took}; ~/.nv/ComputeCache keeps the result), so this GPU runs "
                             f"the code path of {code[1]}, not its own SASS"))
        elif code:
            out.append(Check(f"gpu{i} arch", OK, f"{name} (sm_{cap.replace('.', '')}) is in "
                             f"the compiled arch list {';'.join(archs)}"))
        elif ptx_floor(archs):
            out.append(Check(f"gpu{i} arch", FAIL,
                             f"{name} is compute capability {cap}; ternary._C is "
                             f"{';'.join(archs)} PTX only, which needs {ptx_floor(archs)} or later",
                             f"rebuild with --ptx-arch {cap} or lower, or for this GPU's SASS: "
                             + ", ".join(f"nox -s build-{t}" for t in _targets_for(cap))))
        else:
            fits = _targets_for(cap)
            out.append(Check(f"gpu{i} arch", FAIL,
                             f"{name} is compute capability {cap}; ternary._C has SASS for "
                             f"{';'.join(archs)} only",
                             f"build a matching target: {', '.join(f'nox -s build-{t}' for t in fits)}"
                             if fits else f"no target in envs/targets.toml covers {cap}: add "
                             "its arch to a target's arch_list"))
    return out


def check_host_compiler(p: Probes, nvcc_ver: str | None) -> Check:
    if p.os_name() == "nt":
        return Check("host compiler", OK, "MSVC: chosen by ternary._build.windows.plan_msvc")
    hc = p.host_compiler()
    if hc is None:
        return Check("host compiler", WARN, "no C++ compiler (c++/CXX) found",
                     "needed only to build: apt install g++ (or set CXX)")
    path, major = hc
    if nvcc_ver:
        from ternary._build import matrix

        cuda = matrix.cuda_versions().get("%d.%d" % major_minor(nvcc_ver))
        if cuda and major > cuda.max_gcc:
            return Check("host compiler", FAIL, f"{path} is gcc {major}; CUDA {cuda.version} "
                         f"accepts at most gcc {cuda.max_gcc}",
                         f"set CXX=g++-{cuda.max_gcc} CC=gcc-{cuda.max_gcc}")
    return Check("host compiler", OK, f"{path} (gcc {major})")


def check_vllm(p: Probes) -> list[Check]:
    version = p.vllm()
    if version is None:
        return [Check("vllm", WARN, "vLLM is not installed", "install the target's locked "
                      "environment to serve (the windows target has no vLLM)")]
    out = [Check("vllm", OK, f"vLLM {version}")]
    try:
        how = p.plugin()
    except ImportError as e:
        # the plugin imports vLLM's modules: a package missing under vLLM is vLLM's problem
        ours = (e.name or "").split(".")[0] in ("ternary", "")
        out.append(Check("vllm plugin", WARN, f"ternary.vllm.plugin not importable: {e}",
                         "reinstall vllm-ternary (the plugin ships with it)" if ours else
                         f"vLLM {version} cannot import {e.name}: install the target's locked "
                         "environment (nox -s build-<target> uses it), which pins vLLM's "
                         "dependencies"))
    except Exception as e:  # noqa: BLE001 - any refusal of vLLM is the check's finding
        out.append(Check("vllm plugin", FAIL, f"registration with vLLM {version} failed: "
                         f"{type(e).__name__}: {e}", "use the vLLM version of your target "
                         "(envs/targets.toml)"))
    else:
        out.append(Check("vllm plugin", OK, f"quant_method 'ternary' registered ({how})"))
    return out


def check_kernel(p: Probes) -> Check:
    try:
        path = p.kernel()
    except (ImportError, AttributeError, TypeError) as e:  # absent, or an older policy API
        return Check("kernel path", WARN, f"ternary.kernels unavailable ({type(e).__name__}: "
                     f"{e}): the PyTorch reference runs",
                     "install a vllm-ternary whose ternary.kernels has detect_platform/choose")
    except Exception as e:  # noqa: BLE001 - the chooser's error lists every reason
        return Check("kernel path", FAIL, f"no kernel fits: {e}",
                     "TERNARY_KERNEL=reference forces the reference path")
    return Check("kernel path", OK, path)


def check_platform(p: Probes, wsl: bool) -> list[Check]:
    from ternary._build import windows

    out = []
    env = p.env()
    if wsl:
        pin = settings.raw("TERNARY_PIN_MEMORY", env)
        out.append(Check("wsl2", OK if pin in ("", "0") else WARN,
                         "WSL2: GEMM path " + windows.gemm_path("linux", True)
                         + ("" if pin in ("", "0") else f"; TERNARY_PIN_MEMORY={pin}"),
                         "" if pin in ("", "0") else
                         "unset TERNARY_PIN_MEMORY: pinned memory is capped under WSL2"))
    if p.os_name() == "nt":
        dirs = windows.dll_directories(env)
        if not dirs:
            out.append(Check("windows", FAIL, "no CUDA DLL directory (CUDA_PATH / CONDA_PREFIX "
                             "unset or without bin)", "set CUDA_PATH to the CUDA toolkit or "
                             "activate the conda environment"))
        else:
            out.append(Check("windows", OK, f"DLL directories {'; '.join(dirs)}; GEMM path "
                             + windows.gemm_path("windows", False)))
    return out


def _guard(name: str, fn, *args) -> list[Check]:
    try:
        r = fn(*args)
    except Exception as e:  # noqa: BLE001 - a broken probe is a finding, not a crash
        return [Check(name, FAIL, f"probe failed: {type(e).__name__}: {e}",
                      "report this with `ternary doctor --json`")]
    return r if isinstance(r, list) else [r]


def run_checks(p: Probes | None = None) -> list[Check]:
    p = p or Probes()
    wsl = p.wsl()
    driver = None
    try:
        driver = p.driver()
    except Exception:  # noqa: BLE001 - check_driver reports it
        pass
    t_check, t_info = check_torch(p, has_gpu=bool(driver and driver["gpus"]))
    gpus = (t_info or {}).get("devices") or (driver or {}).get("gpus") or []
    checks = _guard("driver", check_driver, p, t_info) + [t_check]
    checks += _guard("nvcc", check_nvcc, p, t_info)
    checks += _guard("libcuda", check_libcuda, p, wsl, bool(gpus))
    checks += _guard("ternary._C", check_archs, p, gpus)
    nv = None
    try:
        nv = p.nvcc()
    except Exception:  # noqa: BLE001 - check_nvcc reports it
        pass
    checks += _guard("host compiler", check_host_compiler, p, nv[1] if nv else None)
    checks += _guard("vllm", check_vllm, p)
    checks += _guard("kernel path", check_kernel, p)
    checks += _guard("platform", check_platform, p, wsl)
    return checks


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.verdict == FAIL for c in checks) else 0
