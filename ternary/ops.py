"""The `ternary` torch library: schemas, fake kernels and the pure PyTorch reference.

Every op is declared here once. The reference implementation is registered for
CompositeExplicitAutograd, so it serves every device; ternary._C registers CUDA kernels for
the same ops through TORCH_LIBRARY_IMPL(ternary, CUDA, ...). The fake (meta) kernels let
torch.compile and CUDA-graph capture trace the ops without running them.

Canonical layout (docs/formats.md): packed uint8 [N, K/4], four 2-bit codes per byte
along K, LSB first, code = w + 1; scale float32 [N] (channel), [1] (tensor) or
[N, ceil(K/group_size)] (group).
"""

from __future__ import annotations


import math

import torch

from ternary import _ext, settings

LIB = torch.library.Library("ternary", "DEF")  # noqa: TOR901 (we own the namespace)

LIB.define("pack(Tensor codes) -> Tensor")
LIB.define("unpack(Tensor packed) -> Tensor")
LIB.define("dequantize(Tensor packed, Tensor scale, int group_size, ScalarType dtype) -> Tensor")
LIB.define("gemm(Tensor x, Tensor packed, Tensor scale, int group_size, Tensor? bias) -> Tensor")
# The fused kernel's own weight layout (csrc/common/layout.cuh explains it), made once at load time.
LIB.define("repack(Tensor packed) -> Tensor")
LIB.define("unrepack(Tensor repacked, int n, int k) -> Tensor")
# dequantize's output straight from the tiles: the large-M route needs no canonical copy
LIB.define("dequantize_repacked(Tensor repacked, Tensor scale, int group_size, int n, int k, "
           "ScalarType dtype) -> Tensor")
LIB.define("gemm_fused(Tensor x, Tensor repacked, Tensor scale, int group_size, int n, "
           "Tensor? bias) -> Tensor")
# gemm_fused up to max_m rows of x (every M when max_m < 0), dequantize + mm above: one op, so
# the choice is made per call. Routed in Python, torch.compile traces one branch at one M
# and vLLM (which drops shape guards) replays it at every M: on the H200 decode then ran the
# dequantize route at M=1 (0.24 ms a Llama-2-7B layer measured in serving, where ternary
# bench times the fused kernel's four GEMMs at 0.06 ms).
LIB.define("linear_fused(Tensor x, Tensor repacked, Tensor? packed, Tensor scale, int group_size, "
           "int n, int max_m, Tensor? bias) -> Tensor")
# Activation int8_per_token (docs/formats.md): x -> (x_q, s) with x ~= x_q / s per row; x_q in
# out_dtype (int8, or x's float dtype for the float kernels, where |x_q| <= 128 is exact).
LIB.define("quantize_act_int8(Tensor x, ScalarType out_dtype) -> (Tensor, Tensor)")
# W1.58A8 on int8 tensor cores: the integer sum xq . w (int32, exact) times scale, over s, plus
# bias, one float32 epilogue into out_dtype; int32 out_dtype returns the raw sums.
LIB.define("gemm_a8(Tensor xq, Tensor s, Tensor packed, Tensor scale, Tensor? bias, "
           "ScalarType out_dtype) -> Tensor")
# The same from the fused kernels' repacked weight (the copy linear_fused reads), n channels.
LIB.define("gemm_a8_repacked(Tensor xq, Tensor s, Tensor repacked, int n, Tensor scale, "
           "Tensor? bias, ScalarType out_dtype) -> Tensor")
# gemm_a8_repacked's Hopper kernel (int8 wgmma, sm_90a builds) at every M; gemm_a8_repacked
# takes it from M = 128 where it is compiled.
LIB.define("gemm_a8_wgmma(Tensor xq, Tensor s, Tensor repacked, int n, Tensor scale, "
           "Tensor? bias, ScalarType out_dtype) -> Tensor")
# An int8_per_token layer in one op: x quantized per token, then gemm_a8's result on the
# repacked weight, y in x's dtype; the kernel is chosen inside by M (csrc/kernels.h,
# kLinearA8FloatMaxM), for the reason linear_fused is one op. With s given, x is x_q already.
LIB.define("linear_a8(Tensor x, Tensor repacked, int n, Tensor scale, Tensor? bias, "
           "Tensor? s) -> Tensor")

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# What the fused kernel's mma.sync instructions take; the group scale is applied per 64-wide
# K tile, so a group must cover whole tiles.
FUSED_DTYPES = (torch.float16, torch.bfloat16)
FUSED_TILE_N, FUSED_TILE_K, FUSED_TILE_BYTES = 32, 64, 512

_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract


# ---------------------------------------------------------------------------------------
# Argument checks shared by the reference and the fake kernels (the CUDA kernels repeat
# them as TORCH_CHECKs, because they can be called without Python).


def check_packed(packed: torch.Tensor, name: str = "packed") -> tuple[int, int]:
    """Returns (N, K) of a canonical packed weight."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(
            f"{name} must be a uint8 [N, K/4] tensor (four 2-bit codes per byte along K); "
            f"got {packed.dtype} {list(packed.shape)}"
        )
    return packed.shape[0], packed.shape[1] * 4


def check_scale(scale: torch.Tensor, n: int, k: int, group_size: int) -> None:
    if scale.dtype != torch.float32:
        raise ValueError(f"scale must be float32, got {scale.dtype} {list(scale.shape)}")
    if group_size < 0:
        raise ValueError(f"group_size must be 0 (channel/tensor scale) or positive, got {group_size}")
    if group_size == 0:
        if scale.dim() != 1 or scale.shape[0] not in (1, n):
            raise ValueError(
                f"with group_size=0 scale must be [N]={[n]} (per channel) or [1] (per tensor); "
                f"got {list(scale.shape)}"
            )
    else:
        groups = -(-k // group_size)
        if list(scale.shape) != [n, groups]:
            raise ValueError(
                f"with group_size={group_size} and K={k} scale must be [N, ceil(K/group_size)]="
                f"{[n, groups]}; got {list(scale.shape)}"
            )


def check_gemm(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group_size: int,
               bias: torch.Tensor | None) -> tuple[int, int]:
    n, k = check_packed(packed)
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x must be one of {ACTIVATION_DTYPES}, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(
            f"x has shape {list(x.shape)} but the packed weight {list(packed.shape)} holds "
            f"K={k} inputs per row (K = 4 * packed.shape[1])"
        )
    check_scale(scale, n, k, group_size)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias must be [N]={[n]}, got {list(bias.shape)}")
    check_same_device(x=x, packed=packed, scale=scale, bias=bias)
    return n, k


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Every given tensor on the device of the first (fake kernels run on meta inputs, and a
    scale left there would hand back uninitialised memory on the weight's device)."""
    named = [(name, t) for name, t in tensors.items() if t is not None]
    first, where = named[0][0], named[0][1].device
    for name, t in named[1:]:
        if t.device != where:
            raise ValueError(f"{name} is on {t.device} but {first} is on {where}; move them to "
                             "one device")


def check_bias(bias: torch.Tensor | None, x: torch.Tensor, n: int) -> None:
    """The fused route's bias: [N] of x's dtype (csrc/ops.cpp check_bias; the cublas kernel
    takes the same)."""
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [N]={[n]} of x's dtype {x.dtype}; got "
                         f"{bias.dtype} {list(bias.shape)}")


def check_out_dtype(dtype: torch.dtype) -> None:
    if not dtype.is_floating_point:
        raise ValueError(f"dequantize writes a floating-point weight; got dtype={dtype} "
                         "(use float16, bfloat16 or float32)")


def repacked_shape(n: int, k: int) -> list[int]:
    """Shape of ternary::repack's output for an [N, K] weight."""
    return [-(-n // FUSED_TILE_N), -(-k // FUSED_TILE_K), FUSED_TILE_BYTES]


def check_repacked(repacked: torch.Tensor, n: int, k: int) -> None:
    if n < 0 or k < 0 or k % 4:
        raise ValueError(f"n={n} and k={k} must be >= 0 and k a multiple of 4 (the packed format)")
    want = repacked_shape(n, k)
    if repacked.dtype != torch.uint8 or list(repacked.shape) != want:
        raise ValueError(
            f"repacked must be uint8 {want} (ceil(n/32), ceil(K/64), 512) for n={n}, K={k}; got "
            f"{repacked.dtype} {list(repacked.shape)}. Make it with ternary.ops.repack(packed)"
        )


def check_gemm_fused(x: torch.Tensor, repacked: torch.Tensor, scale: torch.Tensor,
                     group_size: int, n: int, bias: torch.Tensor | None) -> int:
    """Returns K. The same contract on every device, so the reference refuses what the
    kernel refuses."""
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dimension; got {list(x.shape)}")
    k = x.shape[-1]
    check_repacked(repacked, n, k)
    if x.dtype not in FUSED_DTYPES:
        raise ValueError(
            f"gemm_fused takes {FUSED_DTYPES} activations; got x {x.dtype} "
            "(use ternary.ops.gemm or TERNARY_KERNEL=cublas for other dtypes)"
        )
    if group_size % FUSED_TILE_K:
        raise ValueError(
            f"gemm_fused needs group_size 0 or a multiple of {FUSED_TILE_K}; got {group_size} "
            "(use ternary.ops.gemm or TERNARY_KERNEL=cublas for this checkpoint)"
        )
    check_scale(scale, n, k, group_size)
    check_bias(bias, x, n)
    check_same_device(x=x, repacked=repacked, scale=scale, bias=bias)
    return k


def check_linear_fused(x: torch.Tensor, repacked: torch.Tensor, packed: torch.Tensor | None,
                       scale: torch.Tensor, group_size: int, n: int,
                       bias: torch.Tensor | None) -> int:
    """gemm_fused's contract, plus the optional canonical copy: [n, K/4] on x's device."""
    k = check_gemm_fused(x, repacked, scale, group_size, n, bias)
    if packed is not None:
        check_packed(packed)
        if list(packed.shape) != [n, k // 4] or k % 4:
            raise ValueError(f"packed must be uint8 [n, K/4] = {[n, k // 4]} for n={n} and x's "
                             f"K={k}; got {list(packed.shape)}")
        check_same_device(x=x, packed=packed)
    return k


ACT_QMAX, ACT_QMIN, ACT_EPS = 127, -128, 1e-5


def check_quantize_act(x: torch.Tensor, out_dtype: torch.dtype) -> None:
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"quantize_act_int8 takes {ACTIVATION_DTYPES} activations; got x "
                         f"{x.dtype} {list(x.shape)}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"quantize_act_int8 needs x with a non-empty last dimension; got "
                         f"{list(x.shape)}")
    if out_dtype not in (torch.int8, x.dtype):
        raise ValueError(f"quantize_act_int8 writes x_q as int8 or as x's dtype {x.dtype}; got "
                         f"out_dtype={out_dtype}")


A8_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32)


def check_gemm_a8(xq: torch.Tensor, s: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None, out_dtype: torch.dtype) -> tuple[int, int, int]:
    """(M, N, K) of a gemm_a8 call, or a ValueError naming the argument."""
    n, k = check_packed(packed)
    if xq.dtype != torch.int8 or xq.dim() != 2 or xq.shape[1] != k:
        raise ValueError(f"gemm_a8 takes xq int8 [M, K] with K={k} (the packed weight "
                         f"{list(packed.shape)}); got {xq.dtype} {list(xq.shape)}: quantize x "
                         "with quantize_act_int8(x, torch.int8) first")
    _check_a8_rest(xq, s, scale, bias, out_dtype, n)
    check_same_device(xq=xq, s=s, packed=packed, scale=scale, bias=bias)
    return xq.shape[0], n, k


def check_gemm_a8_repacked(xq: torch.Tensor, s: torch.Tensor, repacked: torch.Tensor, n: int,
                           scale: torch.Tensor, bias: torch.Tensor | None,
                           out_dtype: torch.dtype) -> tuple[int, int, int]:
    """(M, N, K) of a gemm_a8_repacked call (K from xq), or a ValueError naming the argument."""
    if xq.dtype != torch.int8 or xq.dim() != 2:
        raise ValueError(f"gemm_a8_repacked takes xq int8 [M, K]; got {xq.dtype} "
                         f"{list(xq.shape)}: quantize x with quantize_act_int8(x, torch.int8) first")
    k = xq.shape[1]
    check_repacked(repacked, n, k)
    _check_a8_rest(xq, s, scale, bias, out_dtype, n)
    check_same_device(xq=xq, s=s, repacked=repacked, scale=scale, bias=bias)
    return xq.shape[0], n, k


def _check_a8_rest(xq, s, scale, bias, out_dtype, n: int) -> None:
    m = xq.shape[0]
    if s.dtype != torch.float32 or s.numel() != m or s.dim() not in (1, 2):
        raise ValueError(f"gemm_a8 takes s float32 [M, 1] or [M] with M={m} (quantize_act_int8's "
                         f"scale); got {s.dtype} {list(s.shape)}")
    if scale.dtype != torch.float32 or scale.dim() != 1 or scale.shape[0] not in (1, n):
        raise ValueError(f"gemm_a8 takes a channel scale float32 [N]={[n]} or a tensor scale [1]; "
                         f"got {scale.dtype} {list(scale.shape)} (group scales run through "
                         "linear_a8's float path)")
    if out_dtype not in A8_OUT_DTYPES:
        raise ValueError(f"gemm_a8 writes {A8_OUT_DTYPES}; got out_dtype={out_dtype}")
    if bias is not None and (out_dtype == torch.int32 or bias.dtype != out_dtype
                             or list(bias.shape) != [n]):
        raise ValueError(f"gemm_a8's bias must be [N]={[n]} of out_dtype {out_dtype} (none with "
                         f"int32 sums); got {bias.dtype} {list(bias.shape)}")


def check_linear_a8(x: torch.Tensor, repacked: torch.Tensor, n: int, scale: torch.Tensor,
                    bias: torch.Tensor | None, s: torch.Tensor | None) -> int:
    """K of a linear_a8 call, or a ValueError naming the argument (csrc/ops.cpp's wording)."""
    if x.dim() < 1:
        raise ValueError(f"linear_a8: x must have at least one dimension; got {list(x.shape)}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"linear_a8 takes float16, bfloat16 or float32 activations; got x "
                         f"{x.dtype} {list(x.shape)}")
    k = x.shape[-1]
    if n < 0 or k % 4 or repacked.dtype != torch.uint8 or list(repacked.shape) != \
            repacked_shape(n, k):
        raise ValueError(f"linear_a8: repacked must be uint8 {repacked_shape(max(n, 0), k)} "
                         f"for n={n} and x's K={k} (a multiple of 4); got {repacked.dtype} "
                         f"{list(repacked.shape)} (x {list(x.shape)})")
    if scale.dtype != torch.float32 or scale.dim() != 1 or scale.shape[0] not in (n, 1):
        raise ValueError(f"linear_a8 takes a channel scale float32 [{n}] or a tensor scale "
                         f"[1]; got {scale.dtype} {list(scale.shape)} (group scales: "
                         "ternary.ops.linear_a8_float)")
    if bias is not None and (bias.dtype != x.dtype or list(bias.shape) != [n]):
        raise ValueError(f"linear_a8's bias must be [{n}] of x's dtype {x.dtype}; got "
                         f"{bias.dtype} {list(bias.shape)}")
    m = math.prod(x.shape[:-1])
    if s is not None and (s.dtype != torch.float32 or s.numel() != m):
        raise ValueError(f"linear_a8 takes s float32 with one value a row of x ({m} rows, x "
                         f"{list(x.shape)}); got {s.dtype} {list(s.shape)}")
    check_same_device(x=x, repacked=repacked, scale=scale, bias=bias, s=s)
    return k


def bad_scale_values(scale: torch.Tensor) -> str | None:
    """What is wrong with a scale's values (NaN, inf or zero; every reader and the kernels'
    prepare refuse them), or None."""
    s = scale.to(torch.float32)
    bad = ~torch.isfinite(s) | (s == 0)
    if not bool(bad.any()):
        return None
    first = bad.nonzero()[0].tolist()
    kinds = [k for k, m in (("NaN", torch.isnan(s)), ("inf", torch.isinf(s)), ("zero", s == 0))
             if m.any()]
    return (f"{int(bad.sum())} of {s.numel()} scale values are {'/'.join(kinds)} (first at "
            f"index {first}: {s[tuple(first)].item()}); every scale must be finite and non-zero")


# ---------------------------------------------------------------------------------------
# Reference implementation (every device).


def _quantize_act_int8_ref(x: torch.Tensor, out_dtype: torch.dtype
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' bitnet activation quantization, in float32 (ActQuant's arithmetic, and
    BitLinear's for float32 x): s = 127 * (1 / max(max|x|, 1e-5)) (Python's `127 / t` is
    t.reciprocal() * 127), x_q = round_half_even(x * s) clamped to [-128, 127]."""
    check_quantize_act(x, out_dtype)
    xf = x.to(torch.float32)
    return _quantize_rows(xf, xf.abs().amax(dim=-1, keepdim=True), out_dtype)


def _quantize_rows(xf: torch.Tensor, amax: torch.Tensor, out_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    s = amax.clamp(min=ACT_EPS).reciprocal() * ACT_QMAX
    q = (xf * s).round().clamp(ACT_QMIN, ACT_QMAX)
    return q.to(out_dtype), s


def _gemm_a8_repacked_ref(xq, s, repacked, n, scale, bias, out_dtype):
    _, _, k = check_gemm_a8_repacked(xq, s, repacked, n, scale, bias, out_dtype)
    return _gemm_a8_ref(xq, s, _unrepack_ref(repacked, n, k), scale, bias, out_dtype)


def _gemm_a8_ref(xq, s, packed, scale, bias, out_dtype):
    """The integer sums in float64 (exact while |sum| < 2^53; 128 * K is far below), then the
    kernel's float32 epilogue in its order: sum * scale, / s, + bias, rounded to out_dtype."""
    m, n, _ = check_gemm_a8(xq, s, packed, scale, bias, out_dtype)
    w = _unpack_ref(packed).to(torch.float64)
    acc = xq.to(torch.float64) @ w.T
    if out_dtype == torch.int32:
        return acc.to(torch.int32)
    y = acc.to(torch.float32) * scale.view(1, -1) / s.reshape(m, 1)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


def _linear_a8_ref(x, repacked, n, scale, bias, s):
    """quantize_act_int8 (unless s is given), then gemm_a8 on the unrepacked codes."""
    k = check_linear_a8(x, repacked, n, scale, bias, s)
    m = math.prod(x.shape[:-1])
    if m == 0 or n == 0 or k == 0:  # empty sums: 0 + bias (as the CUDA op)
        y = x.new_zeros((m, n)) if bias is None else bias.expand(m, n).clone()
        return y.view(*x.shape[:-1], n)
    x2 = x.reshape(m, k)
    if s is None:
        xq, s2 = _quantize_act_int8_ref(x2, torch.int8)
    else:
        xq, s2 = x2.to(torch.int8), s.reshape(-1, 1)
    y = _gemm_a8_ref(xq, s2, _unrepack_ref(repacked, n, k), scale, bias, x.dtype)
    return y.view(*x.shape[:-1], n)


def _pack_ref(codes: torch.Tensor) -> torch.Tensor:
    if codes.dtype != torch.int8 or codes.dim() != 2 or codes.shape[1] % 4:
        raise ValueError(
            f"codes must be an int8 [N, K] tensor with K a multiple of 4; "
            f"got {codes.dtype} {list(codes.shape)}"
        )
    if codes.numel() and (codes.min() < -1 or codes.max() > 1):
        raise ValueError(
            f"codes must hold -1, 0 or +1 only; found values in [{int(codes.min())}, {int(codes.max())}]"
        )
    c = (codes + 1).to(torch.uint8).reshape(codes.shape[0], codes.shape[1] // 4, 4)
    return (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).contiguous()


def _fields(packed: torch.Tensor) -> torch.Tensor:
    """[..., 4] the four 2-bit fields of each byte, LSB first. Shifts by Python ints, not a
    tensor of shifts: building one is a host-to-device copy, which CUDA graph capture refuses
    (the cuBLAS and reference paths capture these ops where ternary._C is absent)."""
    return torch.stack([packed & 3, (packed >> 2) & 3, (packed >> 4) & 3, packed >> 6], dim=-1)


def _unpack_ref(packed: torch.Tensor) -> torch.Tensor:
    n, k = check_packed(packed)
    codes = _fields(packed.contiguous())
    return (codes.to(torch.int8) - 1).view(n, k)


def _dequantize_ref(packed: torch.Tensor, scale: torch.Tensor, group_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    n, k = check_packed(packed)
    check_scale(scale, n, k, group_size)
    check_same_device(packed=packed, scale=scale)
    check_out_dtype(dtype)
    w = _unpack_ref(packed).to(torch.float32)
    if group_size:
        s = scale.repeat_interleave(group_size, dim=1)[:, :k]
    else:
        s = scale.view(-1, 1)
    return (w * s).to(dtype)


def _gemm_ref(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group_size: int,
              bias: torch.Tensor | None) -> torch.Tensor:
    check_gemm(x, packed, scale, group_size, bias)
    w = _dequantize_ref(packed, scale, group_size, torch.float32)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


# Index order of the repacked tile (csrc/common/layout.cuh): n = 32 nt + 8 f + g,
# k = 64 kt + 16 t + 4 w + 2 r + h; bytes ordered [nt, kt, g, t, w, h, f // 2], four codes per
# byte ordered [f % 2, r], LSB first.
_CODES_DIMS = "nt f g kt t w r h"
_TILE_DIMS = "nt kt g t w h f r"


def _repack_ref(packed: torch.Tensor) -> torch.Tensor:
    n, k = check_packed(packed)
    packed = packed.contiguous()
    nt, kt = repacked_shape(n, k)[:2]
    codes = _fields(packed).view(n, k)
    full = torch.ones((nt * FUSED_TILE_N, kt * FUSED_TILE_K), dtype=torch.uint8,
                      device=packed.device)
    full[:n, :k] = codes
    c = full.view(nt, 4, 8, kt, 4, 4, 2, 2)
    order = [_CODES_DIMS.split().index(d) for d in _TILE_DIMS.split()]
    c = c.permute(order).reshape(nt, kt, 8, 4, 4, 2, 2, 4)
    b = c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)
    return b.reshape(nt, kt, FUSED_TILE_BYTES).contiguous()


def _unrepack_ref(repacked: torch.Tensor, n: int, k: int) -> torch.Tensor:
    check_repacked(repacked, n, k)
    repacked = repacked.contiguous()
    nt, kt = repacked.shape[:2]
    c = _fields(repacked).view(nt, kt, 8, 4, 4, 2, 4, 2)
    order = [_TILE_DIMS.split().index(d) for d in _CODES_DIMS.split()]
    codes = c.permute(order).reshape(nt * FUSED_TILE_N, kt * FUSED_TILE_K)[:n, :k]
    q = codes.reshape(n, k // 4, 4)
    return (q[..., 0] | (q[..., 1] << 2) | (q[..., 2] << 4) | (q[..., 3] << 6)).contiguous()


def _dequantize_repacked_ref(repacked: torch.Tensor, scale: torch.Tensor, group_size: int,
                             n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    if group_size % FUSED_TILE_K:
        raise ValueError(f"dequantize_repacked needs group_size 0 or a multiple of "
                         f"{FUSED_TILE_K}; got {group_size}")
    return _dequantize_ref(_unrepack_ref(repacked, n, k), scale, group_size, dtype)


def _gemm_fused_ref(x: torch.Tensor, repacked: torch.Tensor, scale: torch.Tensor,
                    group_size: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    k = check_gemm_fused(x, repacked, scale, group_size, n, bias)
    return _gemm_ref(x, _unrepack_ref(repacked, n, k), scale, group_size, bias)


def fused_rows(x: torch.Tensor) -> int:
    """M as linear_fused counts it: the rows of x flattened to [M, K]."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _linear_fused_ref(x: torch.Tensor, repacked: torch.Tensor, packed: torch.Tensor | None,
                      scale: torch.Tensor, group_size: int, n: int, max_m: int,
                      bias: torch.Tensor | None) -> torch.Tensor:
    k = check_linear_fused(x, repacked, packed, scale, group_size, n, bias)
    if max_m < 0 or fused_rows(x) <= max_m:
        return _gemm_fused_ref(x, repacked, scale, group_size, n, bias)
    w = (_dequantize_ref(packed, scale, group_size, x.dtype) if packed is not None
         else _dequantize_repacked_ref(repacked, scale, group_size, n, k, x.dtype))
    y = torch.mm(x.reshape(-1, k), w.t())
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], n)


LIB.impl("pack", _pack_ref, "CompositeExplicitAutograd")
LIB.impl("unpack", _unpack_ref, "CompositeExplicitAutograd")
LIB.impl("dequantize", _dequantize_ref, "CompositeExplicitAutograd")
LIB.impl("gemm", _gemm_ref, "CompositeExplicitAutograd")
LIB.impl("repack", _repack_ref, "CompositeExplicitAutograd")
LIB.impl("unrepack", _unrepack_ref, "CompositeExplicitAutograd")
LIB.impl("dequantize_repacked", _dequantize_repacked_ref, "CompositeExplicitAutograd")
LIB.impl("gemm_fused", _gemm_fused_ref, "CompositeExplicitAutograd")
LIB.impl("linear_fused", _linear_fused_ref, "CompositeExplicitAutograd")
LIB.impl("quantize_act_int8", _quantize_act_int8_ref, "CompositeExplicitAutograd")
LIB.impl("gemm_a8", _gemm_a8_ref, "CompositeExplicitAutograd")
LIB.impl("gemm_a8_repacked", _gemm_a8_repacked_ref, "CompositeExplicitAutograd")
LIB.impl("gemm_a8_wgmma", _gemm_a8_repacked_ref, "CompositeExplicitAutograd")
LIB.impl("linear_a8", _linear_a8_ref, "CompositeExplicitAutograd")


# ---------------------------------------------------------------------------------------
# Fake kernels: shapes and dtypes only, so torch.compile can trace through the ops.


@_register_fake("ternary::pack")
def _pack_fake(codes):
    if codes.dim() != 2 or codes.shape[1] % 4:
        raise ValueError(f"codes must be [N, K] with K a multiple of 4; got {list(codes.shape)}")
    return codes.new_empty((codes.shape[0], codes.shape[1] // 4), dtype=torch.uint8)


@_register_fake("ternary::unpack")
def _unpack_fake(packed):
    n, k = check_packed(packed)
    return packed.new_empty((n, k), dtype=torch.int8)


@_register_fake("ternary::dequantize")
def _dequantize_fake(packed, scale, group_size, dtype):
    n, k = check_packed(packed)
    check_scale(scale, n, k, group_size)
    check_same_device(packed=packed, scale=scale)
    check_out_dtype(dtype)
    return packed.new_empty((n, k), dtype=dtype)


@_register_fake("ternary::gemm")
def _gemm_fake(x, packed, scale, group_size, bias):
    n, _ = check_gemm(x, packed, scale, group_size, bias)
    return x.new_empty((*x.shape[:-1], n))


@_register_fake("ternary::repack")
def _repack_fake(packed):
    n, k = check_packed(packed)
    return packed.new_empty(repacked_shape(n, k), dtype=torch.uint8)


@_register_fake("ternary::unrepack")
def _unrepack_fake(repacked, n, k):
    check_repacked(repacked, n, k)
    return repacked.new_empty((n, k // 4), dtype=torch.uint8)


@_register_fake("ternary::dequantize_repacked")
def _dequantize_repacked_fake(repacked, scale, group_size, n, k, dtype):
    check_repacked(repacked, n, k)
    check_scale(scale, n, k, group_size)
    check_same_device(repacked=repacked, scale=scale)
    check_out_dtype(dtype)
    return repacked.new_empty((n, k), dtype=dtype)


@_register_fake("ternary::gemm_fused")
def _gemm_fused_fake(x, repacked, scale, group_size, n, bias):
    check_gemm_fused(x, repacked, scale, group_size, n, bias)
    return x.new_empty((*x.shape[:-1], n))


@_register_fake("ternary::linear_fused")
def _linear_fused_fake(x, repacked, packed, scale, group_size, n, max_m, bias):
    check_linear_fused(x, repacked, packed, scale, group_size, n, bias)
    return x.new_empty((*x.shape[:-1], n))


@_register_fake("ternary::gemm_a8")
def _gemm_a8_fake(xq, s, packed, scale, bias, out_dtype):
    m, n, _ = check_gemm_a8(xq, s, packed, scale, bias, out_dtype)
    return xq.new_empty((m, n), dtype=out_dtype)


@_register_fake("ternary::gemm_a8_repacked")
def _gemm_a8_repacked_fake(xq, s, repacked, n, scale, bias, out_dtype):
    m, n, _ = check_gemm_a8_repacked(xq, s, repacked, n, scale, bias, out_dtype)
    return xq.new_empty((m, n), dtype=out_dtype)


@_register_fake("ternary::gemm_a8_wgmma")
def _gemm_a8_wgmma_fake(xq, s, repacked, n, scale, bias, out_dtype):
    m, n, _ = check_gemm_a8_repacked(xq, s, repacked, n, scale, bias, out_dtype)
    return xq.new_empty((m, n), dtype=out_dtype)


@_register_fake("ternary::linear_a8")
def _linear_a8_fake(x, repacked, n, scale, bias, s):
    check_linear_a8(x, repacked, n, scale, bias, s)
    return x.new_empty((*x.shape[:-1], n))


@_register_fake("ternary::quantize_act_int8")
def _quantize_act_int8_fake(x, out_dtype):
    check_quantize_act(x, out_dtype)
    return (x.new_empty(x.shape, dtype=out_dtype),
            x.new_empty((*x.shape[:-1], 1), dtype=torch.float32))


# Load the compiled CUDA kernels (if built) after the schemas exist.
_ext.load()


# ---------------------------------------------------------------------------------------
# Typed wrappers.


def pack(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes in {-1, 0, 1}, [N, K] -> canonical packed uint8 [N, K/4]."""
    return torch.ops.ternary.pack(codes)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Canonical packed uint8 [N, K/4] -> int8 codes in {-1, 0, 1}, [N, K]."""
    return torch.ops.ternary.unpack(packed)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, group_size: int = 0,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense weight [N, K] in `dtype`: w * scale (per channel, tensor or group)."""
    return torch.ops.ternary.dequantize(packed, scale, group_size, dtype)


def gemm(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group_size: int = 0,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) for the dense weight W that packed and scale define."""
    return torch.ops.ternary.gemm(x, packed, scale, group_size, bias)


def gemm_a8(xq: torch.Tensor, s: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
            bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16
            ) -> torch.Tensor:
    """y = (xq . w) * scale / s (+ bias) on int8 tensor cores (CUDA; the reference elsewhere):
    xq int8 [M, K] and s float32 [M, 1] from quantize_act_int8(x, torch.int8), the canonical
    packed weight and its channel or tensor scale. The integer sum is exact (int32); the
    epilogue is one float32 pass. out_dtype torch.int32 returns the raw sums."""
    check_gemm_a8(xq, s, packed, scale, bias, out_dtype)  # one wording on every device
    return torch.ops.ternary.gemm_a8(xq, s, packed, scale, bias, out_dtype)


def gemm_a8_repacked(xq: torch.Tensor, s: torch.Tensor, repacked: torch.Tensor, n: int,
                     scale: torch.Tensor, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """gemm_a8 from the fused kernels' repacked weight of n channels (repack(packed)), the
    copy a layer already holds for linear_fused: bit for bit the same result. CUDA: from M = 128
    on Hopper with an sm_90a build, gemm_a8_wgmma; otherwise mma.sync in 128 x 128 tiles, x
    through a cp.async ring (csrc/gemm_a8_tc.cu); _ext.a8_route names the one a call takes."""
    check_gemm_a8_repacked(xq, s, repacked, n, scale, bias, out_dtype)
    return torch.ops.ternary.gemm_a8_repacked(xq, s, repacked, n, scale, bias, out_dtype)


def gemm_a8_wgmma(xq: torch.Tensor, s: torch.Tensor, repacked: torch.Tensor, n: int,
                  scale: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """gemm_a8_repacked on Hopper's int8 wgmma at every M (csrc/fused/wgmma_a8.cu): the same
    result bit for bit. CUDA only where ternary._C's sm_90a image runs (a 9.0 GPU;
    _ext.a8_wgmma_compiled), refused by name elsewhere; the PyTorch reference on the CPU."""
    check_gemm_a8_repacked(xq, s, repacked, n, scale, bias, out_dtype)
    return torch.ops.ternary.gemm_a8_wgmma(xq, s, repacked, n, scale, bias, out_dtype)


def repack(packed: torch.Tensor) -> torch.Tensor:
    """Canonical packed uint8 [N, K/4] -> the fused kernel's layout [ceil(N/32), ceil(K/64), 512]."""
    return torch.ops.ternary.repack(packed)


def unrepack(repacked: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of repack: the canonical packed uint8 [N, K/4] of an [N, K] weight."""
    return torch.ops.ternary.unrepack(repacked, n, k)


def dequantize_repacked(repacked: torch.Tensor, scale: torch.Tensor, group_size: int, n: int,
                        k: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """dequantize(unrepack(repacked, n, k), scale, group_size, dtype) in one pass over the
    tiles, bit for bit; group_size 0 or a multiple of 64."""
    return torch.ops.ternary.dequantize_repacked(repacked, scale, group_size, n, k, dtype)


def gemm_fused(x: torch.Tensor, repacked: torch.Tensor, scale: torch.Tensor, group_size: int,
               n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """gemm on a repacked weight of n output features: float16/bfloat16 x, group_size 0 or a
    multiple of 64. K comes from x: the repacked shape fixes it only to a multiple of 64,
    so callers keep the true K (kernels.Prepared does and checks it)."""
    return torch.ops.ternary.gemm_fused(x, repacked, scale, group_size, n, bias)


# Above max_m, linear_fused takes the large-M fused kernel only up to this many rows (unset or
# 0: no limit; csrc/ops.cpp reads it at each such call): a user's switch to send very large
# steps to dequantize + cuBLAS (ternary.settings)
LARGE_M_ENV = "TERNARY_LARGE_M_MAX"


def large_m_cap() -> int | None:
    """TERNARY_LARGE_M_MAX as linear_fused reads it: None where there is no limit."""
    v = settings.raw(LARGE_M_ENV)
    if not v:
        return None
    if not (v.isascii() and v.isdigit()) or len(v) > 18:  # as csrc/ops.cpp reads it
        raise ValueError(f"{LARGE_M_ENV} must be a row count >= 0 (0: no limit); got {v!r}. "
                         "Unset it or set e.g. 8192")
    return int(v) or None


def linear_fused(x: torch.Tensor, repacked: torch.Tensor, packed: torch.Tensor | None,
                 scale: torch.Tensor, group_size: int, n: int, max_m: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """gemm_fused while x has at most max_m rows (always when max_m < 0), and above that where
    gemm_fused has its large-M kernel for the shape (Hopper: _ext.fused_route names a
    "wgmma_big" route) and x has at most TERNARY_LARGE_M_MAX rows (large_m_cap); otherwise
    dequantize `packed` (or, when it is None, the tiles with dequantize_repacked) to x's dtype
    and torch.mm. The choice happens inside the op at run time, so compiled graphs keep both
    routes."""
    return torch.ops.ternary.linear_fused(x, repacked, packed, scale, group_size, n, max_m, bias)


def quantize_act_int8(x: torch.Tensor, out_dtype: torch.dtype | None = None,
                      amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token int8 quantization of activations exactly as transformers' bitnet layers do
    it (docs/formats.md, activation int8_per_token): returns (x_q, s), x_q integer-valued in
    [-128, 127] as `out_dtype` (default x's dtype; int8 also), s float32 [..., 1] with
    x ~= x_q / s. One pass over each row on CUDA.

    `amax` (float32 [..., 1]): each row's max |x| when x is only a slice of the row, as in a
    row-parallel layer under tensor parallelism, where the token's scale must come from the
    whole row (all ranks); then the element-wise reference arithmetic runs."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if amax is None:
        return torch.ops.ternary.quantize_act_int8(x, out_dtype)
    check_quantize_act(x, out_dtype)
    if amax.dtype != torch.float32 or list(amax.shape) != [*x.shape[:-1], 1]:
        raise ValueError(f"amax must be float32 {[*x.shape[:-1], 1]} (one value a row of x "
                         f"{list(x.shape)}); got {amax.dtype} {list(amax.shape)}")
    return _quantize_rows(x.to(torch.float32), amax, out_dtype)


def linear_a8(x: torch.Tensor, repacked: torch.Tensor, n: int, scale: torch.Tensor,
              bias: torch.Tensor | None = None, amax: torch.Tensor | None = None
              ) -> torch.Tensor:
    """An int8_per_token layer (docs/formats.md): y = (x_q . codes) * scale / s (+ bias) with
    (x_q, s) = quantize_act_int8(x), in x's dtype, from the repacked weight of n channels and
    its channel or tensor scale: gemm_a8's result bit for bit, one op on CUDA that picks its
    kernel by M inside (_ext.linear_a8_route names it). `amax`: as in quantize_act_int8, for x
    that is a slice of each row (then x is quantized here against it)."""
    if amax is None:
        return torch.ops.ternary.linear_a8(x, repacked, n, scale, bias, None)
    xq, s = quantize_act_int8(x, amax=amax)
    return torch.ops.ternary.linear_a8(xq, repacked, n, scale, bias, s)


def linear_a8_float(x: torch.Tensor, linear, bias: torch.Tensor | None = None,
                    amax: torch.Tensor | None = None) -> torch.Tensor:
    """An int8_per_token layer on a float GEMM, for the weights no int8 route takes (group
    scales): `linear(x_q)` is the layer's ternary GEMM without bias, fed the integer-valued
    x_q in x's dtype; its result (rounded to x's dtype) is divided by s in float32, rounded
    again, and the bias added. The integer sums are exact in the kernels' float32
    accumulators while K * 256 < 2^24; with group scales (applied per K tile) they round as
    for any float input. `amax`: as in quantize_act_int8."""
    xq, s = quantize_act_int8(x, amax=amax)
    y = (linear(xq).to(torch.float32) / s).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y


def a8_epilogue(acc: torch.Tensor, scale: torch.Tensor, s: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """gemm_a8's float32 epilogue on exact integer sums `acc` (float32 [..., N]): acc * scale,
    / s, + bias, rounded once to dtype."""
    y = acc * scale / s
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(dtype)
