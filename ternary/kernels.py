"""Which algorithm computes a ternary linear layer: the policy, kept apart from the ops.

Each kernel class answers `can_implement(platform, n, k, dtype, group_size, device)` with
(bool, reason), `prepare(packed, scale, group_size)` once at load time (repacking into the
layout it wants) and `apply(x, prepared, bias)` per call. `choose` walks them in priority
order, honours TERNARY_KERNEL=fused|cublas|reference (auto: the same as unset; read when a
layer is loaded, so set it before vLLM starts), and when nothing fits raises one error listing
every kernel's reason. The platform is a value (`detect_platform()` reads it), so
tests can inject WSL2, Windows or a machine without a GPU.

- fused: ternary::gemm_fused (csrc/fused.cu), one pass over the 2-bit weight. Above
  FUSED_MAX_M rows it hands the call to dequantize + cuBLAS, which is faster there
  (docs/kernels.md) (the weight is read once per call either way; at large M the time is matrix
  work, where cuBLAS beats the mma.sync kernels), except on Hopper where the grid of the
  wgmma_big kernel fills the GPU: that one beats dequantize + cuBLAS and keeps the call.
- cublas: dequantize to the activation dtype, then torch.mm with the bias added separately
  (no addmm: its bias epilogue goes through cublasLt, which the Windows target lacks).
  Runs without ternary._C too (the reference dequantize serves CUDA tensors).
- reference: ternary::gemm (the simple CUDA kernel, or PyTorch where ternary._C is absent).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ternary import _ext, ops, settings
from ternary.platform import Platform, detect_platform

ENV = "TERNARY_KERNEL"  # ternary.settings

# Largest M that the fused kernel serves itself; above it, dequantize + cuBLAS (measured:
# bench/results-h200.json as of commit c6270ca, H200, every shape of the benchmark: at M = 128
# the fused kernel took 19-78 us against the dequantize route's 29-122, at M = 256 38-173
# against 30-133),
# except where the Hopper wgmma_big kernel's grid fills the GPU (csrc/fused.cu, pick_route).
FUSED_MAX_M = 128


@dataclass
class Prepared:
    """What a kernel keeps per layer after load: the weight in its layout, the scale."""

    n: int
    k: int
    scale: torch.Tensor
    group_size: int
    packed: torch.Tensor | None = None  # canonical [N, K/4]
    repacked: torch.Tensor | None = None  # fused layout


class Kernel:
    name = ""

    def can_implement(self, platform: Platform, n: int, k: int, dtype: torch.dtype,
                      group_size: int, device: torch.device) -> tuple[bool, str]:
        raise NotImplementedError

    def prepare(self, packed: torch.Tensor, scale: torch.Tensor, group_size: int) -> Prepared:
        n, k = ops.check_packed(packed)
        ops.check_scale(scale, n, k, group_size)
        ops.check_same_device(packed=packed, scale=scale)
        check_values(packed, scale)
        return Prepared(n=n, k=k, scale=scale, group_size=group_size, packed=packed)

    def apply(self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None):
        raise NotImplementedError

    def route(self, m: int, n: int | None = None, k: int | None = None) -> str:
        """The algorithm a call with M rows (of an [n, k] weight, where it matters) takes, for
        reports."""
        return self.name

    def apply_a8(self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None,
                 amax: torch.Tensor | None = None) -> torch.Tensor:
        """The layer for activation int8_per_token (docs/formats.md): x quantized per token,
        then y = (x_q . codes) * scale / s (+ bias), gemm_a8's result bit for bit. This base:
        ternary::gemm_a8 on the canonical codes (group scales: ops.linear_a8_float on this
        kernel's apply). `amax`: a row-parallel slice's whole-row max
        (ternary.vllm.linear.split_row_amax)."""
        if prepared.group_size:
            return ops.linear_a8_float(x, lambda q: self.apply(q, prepared, None), bias, amax)
        check_x(x, prepared)
        xq, s = _quantize_a8(x, amax)
        y = ops.gemm_a8(xq, s, prepared.packed, prepared.scale, bias, x.dtype)
        return y.view(*x.shape[:-1], prepared.n)

    def route_a8(self, m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> str:
        """route() for an int8_per_token layer's call of M rows."""
        return "gemm_a8"


def _quantize_a8(x: torch.Tensor, amax: torch.Tensor | None):
    """(x_q int8 [M, K], s float32 [M, 1]) of x [..., K], against `amax` where given."""
    xq, s = ops.quantize_act_int8(x, torch.int8, amax=amax)
    return xq.reshape(-1, x.shape[-1]), s.reshape(-1, 1)


def check_values(packed: torch.Tensor, scale: torch.Tensor) -> None:
    """Once per layer at load: a NaN, inf or zero scale, or a code 3 (no kernel decodes it:
    the CUDA ones read it as +2), would otherwise give silently wrong outputs."""
    if packed.device.type == "meta":
        return
    why = ops.bad_scale_values(scale)
    if why:
        raise ValueError(f"scale {list(scale.shape)}: {why}; re-quantize the layer")
    code3 = (packed & (packed >> 1) & 0x55) != 0
    if bool(code3.any()):
        first = code3.nonzero()[0].tolist()
        raise ValueError(f"packed {list(packed.shape)} holds code 3 in {int(code3.sum())} bytes "
                         f"(first at [n, byte] = {first}: {int(packed[tuple(first)])}); only "
                         "0, 1, 2 encode -1, 0, +1: the weight is corrupt or was never loaded "
                         "(vLLM's load_format=dummy leaves integer weights as they were "
                         "allocated; ternary.tools.synthetic.bigmodel writes random valid ones)")


def check_x(x: torch.Tensor, prepared: Prepared) -> None:
    if x.dim() < 1 or x.shape[-1] != prepared.k:
        raise ValueError(f"x has K={x.shape[-1] if x.dim() else None} but the layer's weight "
                         f"has K={prepared.k} (x shape {list(x.shape)})")
    if x.device != prepared.scale.device:
        raise ValueError(f"x is on {x.device} but the layer's weight is on "
                         f"{prepared.scale.device}; move x there")
    if x.dtype not in ops.ACTIVATION_DTYPES:
        raise ValueError(f"x is {x.dtype}; the layer takes {ops.ACTIVATION_DTYPES} activations")


def _needs_cuda(platform: Platform, device: torch.device, what: str) -> str | None:
    if device.type != "cuda":
        return f"{what} runs on CUDA tensors; the weight is on {device}"
    if not platform.cuda:
        return f"{what} needs a CUDA GPU; none is visible on this {platform.label} machine"
    return _build_misses_gpu(platform)


def _build_misses_gpu(platform: Platform) -> str | None:
    """ternary._C holds SASS for its arch list only, and once loaded it serves every ternary
    op on CUDA tensors (the reference ones too): on a GPU it has no code for, each op would
    fail at launch with "no kernel image is available"."""
    if not (platform.extension and platform.extension_archs and platform.capability):
        return None
    from ternary.platform import arch_covers, ptx_floor

    cap = ".".join(map(str, platform.capability))
    if any(arch_covers(arch, cap) for arch in platform.extension_archs):
        return None  # SASS, or PTX the driver JIT-compiles (Platform.jit_ptx)
    floor = ptx_floor(platform.extension_archs)
    if floor:
        return (f"ternary._C was built as {';'.join(platform.extension_archs)} PTX only, which "
                f"runs on compute capability {floor} or later; this GPU is {cap}: rebuild "
                f"with a --ptx-arch of at most {cap}, or for this GPU's SASS (`ternary "
                "doctor` names the targets that cover it)")
    return (f"ternary._C was built for {';'.join(platform.extension_archs)}, which has no code "
            f"for this GPU (compute capability {cap}); rebuild it for this GPU: `ternary "
            "doctor` names the targets that cover it, then `nox -s build-<target>`")


class FusedKernel(Kernel):
    name = "fused"
    MIN_CAPABILITY = (8, 0)  # mma.sync m16n8k16 with bf16 operands

    def __init__(self, max_m: int = FUSED_MAX_M):
        self.max_m = max_m

    def can_implement(self, platform, n, k, dtype, group_size, device):
        why = _needs_cuda(platform, device, "the fused kernel")
        if why:
            return False, why
        if not platform.extension:
            detail = f" ({platform.extension_error})" if platform.extension_error else ""
            return False, (f"ternary._C is not loaded on this {platform.label} machine{detail}; "
                           "build it with `nox -s build-<target>`")
        if platform.capability is not None and platform.capability < self.MIN_CAPABILITY:
            return False, (f"the fused kernel needs compute capability >= "
                           f"{'.'.join(map(str, self.MIN_CAPABILITY))}; this GPU has "
                           f"{'.'.join(map(str, platform.capability))}")
        if dtype not in ops.FUSED_DTYPES:
            return False, f"the fused kernel takes {ops.FUSED_DTYPES} activations, not {dtype}"
        if group_size % ops.FUSED_TILE_K:
            return False, (f"the fused kernel needs group_size 0 or a multiple of "
                           f"{ops.FUSED_TILE_K}; this layer has {group_size}")
        return True, "ok"

    def prepare(self, packed, scale, group_size):
        p = super().prepare(packed, scale, group_size)
        p.repacked = ops.repack(packed)
        # One copy, 2 bits a weight: the large-M route dequantizes the tiles themselves
        # (ops.dequantize_repacked reads each tile once, coalesced). The canonical copy it
        # replaces doubled weight memory (3.54 GiB against bf16's 12.55 on Llama-2-7B, H200).
        p.packed = None
        return p

    def route(self, m, n=None, k=None):
        if self.max_m is None or m <= self.max_m:
            return self.name
        cap = ops.large_m_cap()
        if cap is not None and m > cap:
            return "fused>cublas"
        # above max_m linear_fused keeps only the large-M Hopper kernel (csrc/ops.cpp); the
        # route of a channel-scale layer (group scales never take it)
        if n is None or k is None or _ext.load() is None or not torch.cuda.is_available():
            return "fused>cublas"
        big = _ext.fused_route(m, n, k, 0, torch.cuda.current_device()).startswith("wgmma_big")
        return self.name if big else "fused>cublas"

    def apply(self, x, prepared, bias=None):
        # (the repacked shape cannot tell K apart inside the last 64-wide tile; the op checks
        # the rest)
        check_x(x, prepared)
        # one op routes by M at run time (ops.linear_fused says why not here)
        return ops.linear_fused(x, prepared.repacked, prepared.packed, prepared.scale,
                                prepared.group_size, prepared.n,
                                -1 if self.max_m is None else self.max_m, bias)

    def apply_a8(self, x, prepared, bias=None, amax=None):
        if prepared.group_size:
            return super().apply_a8(x, prepared, bias, amax)
        check_x(x, prepared)
        # one op: the quantize and the kernel chosen by M inside (csrc/ops.cpp, linear_a8)
        return ops.linear_a8(x, prepared.repacked, prepared.n, prepared.scale, bias, amax)

    def route_a8(self, m, n, k, dtype=torch.bfloat16):
        if _ext.load() is None or not torch.cuda.is_available():
            return "linear_a8"
        return _ext.linear_a8_route(m, n, k, dtype, torch.cuda.current_device())


class CublasKernel(Kernel):
    name = "cublas"

    def can_implement(self, platform, n, k, dtype, group_size, device):
        why = _needs_cuda(platform, device, "the cuBLAS path")
        if why:
            return False, why
        if dtype not in ops.ACTIVATION_DTYPES:
            return False, f"the cuBLAS path takes {ops.ACTIVATION_DTYPES} activations, not {dtype}"
        return True, "ok"

    def apply(self, x, prepared, bias=None):
        # the fused route's contract (csrc/ops.cpp), so a bad call fails the same way on
        # either path instead of in torch's broadcasting
        check_x(x, prepared)
        ops.check_bias(bias, x, prepared.n)
        ops.check_same_device(x=x, bias=bias)
        return self.matmul(x, prepared.packed, prepared, bias)

    def apply_a8(self, x, prepared, bias=None, amax=None):
        """The integer sums as a float32 torch.mm of x_q and the codes (exact: integers below
        2^24 while K * 128 < 2^24, and torch keeps TF32 off for float32 matmuls by default),
        then gemm_a8's epilogue: no ternary._C needed."""
        if prepared.group_size or prepared.k * 128 >= 2**24 or \
                torch.backends.cuda.matmul.allow_tf32:
            return super().apply_a8(x, prepared, bias, amax)
        check_x(x, prepared)
        ops.check_bias(bias, x, prepared.n)
        xq, s = _quantize_a8(x, amax)
        ones = torch.ones(1, dtype=torch.float32, device=prepared.scale.device)
        codes = ops.dequantize(prepared.packed, ones, 0, torch.float32)
        acc = torch.mm(xq.to(torch.float32), codes.t())
        y = ops.a8_epilogue(acc, prepared.scale.view(1, -1), s, bias, x.dtype)
        return y.view(*x.shape[:-1], prepared.n)

    def route_a8(self, m, n, k, dtype=torch.bfloat16):
        return "cublas_a8"

    @staticmethod
    def matmul(x, packed, prepared, bias=None):
        """Dequantize to x's dtype, then torch.mm (cuBLAS); the bias is added apart, as an
        addmm epilogue would go through cublasLt."""
        w = ops.dequantize(packed, prepared.scale, prepared.group_size, x.dtype)
        y = torch.mm(x.reshape(-1, prepared.k), w.t())
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], prepared.n)


class ReferenceKernel(Kernel):
    name = "reference"

    def can_implement(self, platform, n, k, dtype, group_size, device):
        if dtype not in ops.ACTIVATION_DTYPES:
            return False, f"ternary::gemm takes {ops.ACTIVATION_DTYPES} activations, not {dtype}"
        why = torch.device(device).type == "cuda" and _build_misses_gpu(platform)
        if why:
            return False, why
        return True, "ok"

    def apply(self, x, prepared, bias=None):
        return ops.gemm(x, prepared.packed, prepared.scale, prepared.group_size, bias)


# the M at which an int8_per_token layer's kernel is sampled for its log line: each M of the
# decode kernels, then the points where the route may change (csrc/kernels.h)
_A8_PROBE_M = [*range(1, 18), 32, 33, 64, 65, 128, 129, 256, 257, 1024, 16384]


def a8_routes(kernel, n: int, k: int, dtype: torch.dtype) -> str:
    """Which kernel an int8_per_token layer's calls take over M (Kernel.route_a8), as ranges:
    "decode M 1-8, decode_nt2 M 9-16, fused_gemm_nt M 17-128, wgmma_a8 from M 129"."""
    spans: list[list] = []  # [name, first M, last M]
    for m in _A8_PROBE_M:
        name = kernel.route_a8(m, n, k, dtype)
        if spans and spans[-1][0] == name:
            spans[-1][2] = m
        else:
            spans.append([name, m, m])
    parts = []
    for i, (name, lo, hi) in enumerate(spans):
        if i == len(spans) - 1:
            parts.append(name if lo == 1 else f"{name} from M {lo}")
        else:
            parts.append(f"{name} M {lo}" if lo == hi else f"{name} M {lo}-{hi}")
    return ", ".join(parts)


KERNELS: dict[str, type[Kernel]] = {
    "fused": FusedKernel,
    "cublas": CublasKernel,
    "reference": ReferenceKernel,
}


class NoKernelError(RuntimeError):
    """No kernel can run this layer here; the message lists each kernel's reason."""


def priority(platform: Platform) -> list[str]:
    """Kernel names to try, best first. Every platform tries fused first; where it is
    unavailable (WSL2 and native Windows builds often lack ternary._C) the cuBLAS path is the
    default, and the reference is the last resort."""
    return ["fused", "cublas", "reference"]


def choose(platform: Platform, *, n: int, k: int, dtype: torch.dtype, group_size: int,
           device: torch.device | str, m: int | None = None,
           env: dict[str, str] | None = None) -> Kernel:
    """The kernel for a layer of n outputs x k inputs. `m` is informational: the fused
    kernel routes large M itself (FusedKernel.route)."""
    device = torch.device(device)
    shape = f"layer n={n} k={k} dtype={dtype} group_size={group_size} on {device}"
    forced = settings.raw(ENV, env).strip().lower()
    if forced and forced != "auto":  # (auto: the same as unset)
        if forced not in KERNELS:
            raise NoKernelError(f"{ENV}={forced!r} is not a kernel; use one of "
                                f"{', '.join(KERNELS)}, or auto (or unset) for the "
                                "automatic choice")
        kernel = KERNELS[forced]()
        ok, why = kernel.can_implement(platform, n, k, dtype, group_size, device)
        if not ok:
            raise NoKernelError(f"{ENV}={forced} cannot run {shape}: {why}. Unset {ENV} to let "
                                "the policy choose")
        return kernel
    reasons = []
    for name in priority(platform):
        kernel = KERNELS[name]()
        ok, why = kernel.can_implement(platform, n, k, dtype, group_size, device)
        if ok:
            return kernel
        reasons.append(f"  {name}: {why}")
    raise NoKernelError(f"no ternary kernel can run {shape} on this {platform.label} machine:\n"
                        + "\n".join(reasons))
