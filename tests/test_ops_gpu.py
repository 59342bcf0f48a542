"""The CUDA kernels of ternary._C against a float64 reference, on fresh random inputs.

Outputs are allocated inside the ops, so poisoning works through the caching allocator: a
NaN-filled block of the output's size is freed right before the call, which hands the same
block out again; an element the kernel forgot stays NaN and fails the finite check.
"""

from __future__ import annotations

import random

import pytest
import torch

from ternary import ops

pytestmark = pytest.mark.gpu

# bf16 output rounding alone is 2^-9 relative; fp16 2^-12 (METHOD: bf16 operands land between
# 1e-3 and 1e-2).
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
M_VALUES = (1, 2, 5, 16, 17, 33, 64, 100, 256, 1000, 4096)


def _rng(seed_extra: int = 0) -> random.Random:
    # Fresh inputs every run (METHOD: the kernel must compute the function on any input), but
    # the seed is printed so a failure can be replayed.
    seed = random.randrange(2**31) + seed_extra
    print(f"seed {seed}")
    torch.manual_seed(seed)
    return random.Random(seed)


def _weights(n: int, k: int, mode: str, group_size: int, device="cuda"):
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device=device)
    if mode == "channel":
        scale = torch.rand(n, device=device) + 0.5
    elif mode == "tensor":
        scale = torch.rand(1, device=device) + 0.5
    else:
        scale = torch.rand(n, -(-k // group_size), device=device) + 0.5
    return codes, scale


def _dense64(codes: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    w = codes.double()
    if group_size:
        return w * scale.double().repeat_interleave(group_size, dim=1)[:, : codes.shape[1]]
    return w * scale.double().view(-1, 1)


def _poison(shape, dtype):
    t = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del t  # the next allocation of this size reuses the NaN block


def _check(y: torch.Tensor, ref: torch.Tensor, dtype, what: str) -> None:
    assert torch.isfinite(y).all(), f"{what}: {int((~torch.isfinite(y)).sum())} outputs unwritten/NaN"
    err = ((y.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], f"{what}: relative error {err:.3g} >= {TOL[dtype]}"


def _random_case(rng: random.Random, fused: bool):
    mode = rng.choice(["channel", "tensor", "group"])
    if mode == "group":
        group_size = rng.choice([64, 128, 256]) if fused else rng.choice([32, 48, 64, 100, 128])
    else:
        group_size = 0
    k = 4 * rng.randint(1, 800)  # mostly not a multiple of 64
    n = rng.randint(1, 700) | 1  # odd
    return mode, group_size, n, k


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", M_VALUES)
def test_gemm_fused_matches_float64(m, dtype):
    rng = _rng(m)
    for _ in range(3):
        mode, group_size, n, k = _random_case(rng, fused=True)
        codes, scale = _weights(n, k, mode, group_size)
        x = torch.randn(m, k, dtype=dtype, device="cuda")
        bias = torch.randn(n, dtype=dtype, device="cuda") if rng.random() < 0.5 else None
        repacked = ops.repack(ops.pack(codes))
        _poison((m, n), dtype)
        y = ops.gemm_fused(x, repacked, scale, group_size, n, bias)
        ref = x.double() @ _dense64(codes, scale, group_size).t()
        if bias is not None:
            ref = ref + bias.double()
        _check(y, ref, dtype, f"gemm_fused m={m} n={n} k={k} {mode} g={group_size} {dtype}")


def test_gemm_fused_large_shapes():
    """The benchmark shapes, where split and grid choices differ from small ones."""
    rng = _rng()
    for k, n in ((4096, 22016), (11008, 4096)):
        codes, scale = _weights(n, k, "channel", 0)
        repacked = ops.repack(ops.pack(codes))
        for m in (1, 16, rng.randint(17, 300)):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            _poison((m, n), torch.bfloat16)
            y = ops.gemm_fused(x, repacked, scale, 0, n)
            _check(y, x.double() @ _dense64(codes, scale, 0).t(), torch.bfloat16,
                   f"gemm_fused m={m} n={n} k={k}")


# Llama-2-7B's linear layers at tensor parallel 2, per rank (K, N): qkv, o_proj, gate_up,
# down_proj: the shapes of a large-M hang once fixed in the persistent kernel (docs/kernels.md).
TP2_LLAMA7B = ((4096, 6144), (2048, 4096), (4096, 11008), (5504, 4096))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("k, n", TP2_LLAMA7B)
def test_linear_fused_tensor_parallel_2_shapes(k, n):
    """linear_fused (the op the plugin calls, max_m 128) on each rank's shapes, at the M the
    bench drives (decode 1 / 16 / 64, prefill 128 / 129 / 2048), the profiling runs' M
    (vLLM 0.26 on an H200: 8192 tokens for a server, 16384 for the LLM class) and a random M,
    directly and replayed from a CUDA graph with new x, against float64; K = 5504 splits its
    86 k tiles unevenly (21 / 22) where the route splits K 4 ways, and its persistent
    256-token tiles (M >= 2048) pad the last round of the x ring."""
    from ternary import _ext

    rng = _rng(k + n)
    codes, scale = _weights(n, k, "channel", 0)
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    bias = None
    for m in (1, 16, 64, 128, 129, 2048, 8192, 16384, rng.randint(2, 300)):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        _poison((m, n), torch.bfloat16)
        y = ops.linear_fused(x, repacked, packed, scale, 0, n, 128, bias)
        torch.cuda.synchronize()
        route = _ext.fused_route(m, n, k, 0, 0)
        ref = x.double() @ _dense64(codes, scale, 0).t()
        _check(y, ref, torch.bfloat16, f"linear_fused m={m} n={n} k={k} route {route}")
        static = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.linear_fused(static, repacked, packed, scale, 0, n, 128, bias)
        static.copy_(torch.randn_like(static))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, static.double() @ _dense64(codes, scale, 0).t(), torch.bfloat16,
               f"linear_fused in a CUDA graph m={m} n={n} k={k} route {route}")


def test_gemm_fused_strided_and_3d_input():
    n, k = 96, 200
    codes, scale = _weights(n, k, "channel", 0)
    repacked = ops.repack(ops.pack(codes))
    big = torch.randn(2, 3, k + 6, dtype=torch.bfloat16, device="cuda")
    x = big[..., 3 : 3 + k]  # rows not 16-byte aligned: the scalar load path
    y = ops.gemm_fused(x, repacked, scale, 0, n)
    assert y.shape == (2, 3, n)
    _check(y, x.double() @ _dense64(codes, scale, 0).t(), torch.bfloat16, "strided x")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m", (1, 16, 257, 4096))
def test_gemm_matches_float64(m, dtype):
    rng = _rng(m)
    mode, group_size, n, k = _random_case(rng, fused=False)
    codes, scale = _weights(n, k, mode, group_size)
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    _poison((m, n), dtype)
    y = ops.gemm(x, ops.pack(codes), scale, group_size)
    _check(y, x.double() @ _dense64(codes, scale, group_size).t(), dtype,
           f"gemm m={m} n={n} k={k} {mode} g={group_size}")


def test_pack_unpack_repack_round_trip():
    _rng()
    for n, k in ((1, 4), (33, 68), (700, 4 * 333), (4096, 4096)):
        codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")
        packed = ops.pack(codes)
        assert torch.equal(packed.cpu(), ops._pack_ref(codes.cpu()))
        assert torch.equal(ops.unpack(packed), codes)
        repacked = ops.repack(packed)
        assert torch.equal(repacked.cpu(), ops._repack_ref(packed.cpu())), (n, k)
        assert torch.equal(ops.unrepack(repacked, n, k), packed)


@pytest.mark.parametrize("n,k", [(77, 260), (64, 512)])  # scalar and 16-byte-store paths
@pytest.mark.parametrize("mode,group_size", [("channel", 0), ("group", 64), ("group", 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_reference(n, k, mode, group_size, dtype):
    _rng()
    codes, scale = _weights(n, k, mode, group_size)
    _poison((n, k), dtype)
    w = ops.dequantize(ops.pack(codes), scale, group_size, dtype)
    ref = _dense64(codes, scale, group_size).to(dtype)
    assert torch.equal(w, ref), f"dequantize n={n} k={k} {mode} g={group_size} {dtype}"


@pytest.mark.parametrize("name", ["fused", "cublas", "reference"])
def test_kernel_classes_on_gpu(name):
    """The policy's kernels end to end, M on both sides of FUSED_MAX_M."""
    from ternary import kernels

    _rng()
    n, k = 300, 1028
    codes, scale = _weights(n, k, "channel", 0)
    kernel = kernels.KERNELS[name]()
    prepared = kernel.prepare(ops.pack(codes), scale, 0)
    for m in (1, kernels.FUSED_MAX_M + 36):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
        y = kernel.apply(x, prepared, bias)
        ref = x.double() @ _dense64(codes, scale, 0).t() + bias.double()
        _check(y, ref, torch.bfloat16, f"{name} m={m}")


def _samples():
    n, k = 40, 136
    codes, scale = _weights(n, k, "channel", 0)
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    gcodes, gscale = _weights(n, k, "group", 64)
    grepacked = ops.repack(ops.pack(gcodes))
    x = torch.randn(3, k, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    return [
        ("pack", (codes,)),
        ("unpack", (packed,)),
        ("dequantize", (packed, scale, 0, torch.bfloat16)),
        ("gemm", (x, packed, scale, 0, bias)),
        ("repack", (packed,)),
        ("unrepack", (repacked, n, k)),
        ("gemm_fused", (x, repacked, scale, 0, n, bias)),
        ("gemm_fused", (x.half(), grepacked, gscale, 64, n, None)),
        ("dequantize_repacked", (grepacked, gscale, 64, n, k, torch.float16)),
        ("linear_fused", (x, repacked, packed, scale, 0, n, 64, bias)),  # fused route
        ("linear_fused", (x, repacked, packed, scale, 0, n, 2, bias)),  # dequantize + mm
        ("linear_fused", (x.half(), grepacked, None, gscale, 64, n, 1, None)),  # via unrepack
    ]


@pytest.mark.parametrize("i", range(12))
def test_opcheck(i):
    name, args = _samples()[i]
    torch.library.opcheck(getattr(torch.ops.ternary, name), args)


def test_cuda_errors_carry_values():
    n, k = 32, 64
    codes, scale = _weights(n, k, "channel", 0)
    repacked = ops.repack(ops.pack(codes))
    x = torch.randn(2, k, device="cuda")
    with pytest.raises(RuntimeError, match="float16 or bfloat16"):
        torch.ops.ternary.gemm_fused(x, repacked, scale, 0, n, None)
    with pytest.raises(RuntimeError, match=r"\[2, 1, 512\]"):
        torch.ops.ternary.gemm_fused(x.bfloat16(), repacked, scale, 0, n + 32, None)


def test_linear_fused_cuda_refusals_carry_values():
    n, k = 32, 64
    codes, scale = _weights(n, k, "channel", 0)
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    x = torch.randn(2, k, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match=r"packed must be uint8 \[n, K/4\] = \[32, 16\]"):
        torch.ops.ternary.linear_fused(x, repacked, packed[:, :8], scale, 0, n, 1, None)
    with pytest.raises(RuntimeError, match="float16 or bfloat16 activations; got x Float"):
        torch.ops.ternary.linear_fused(x.float(), repacked, packed, scale, 0, n, 1, None)


def test_cuda_ops_refuse_a_repacked_weight_of_another_shape():
    """The C++ ops behind ternary.ops (reached directly, past its Python checks) name the
    shape they expect and the one they got."""
    n, k = 40, 128
    codes, scale = _weights(n, k, "channel", 0)
    wrong = ops.repack(ops.pack(codes))[:, :1]  # K=64's tiles for a K=128 layer
    x = torch.randn(3, k, dtype=torch.bfloat16, device="cuda")
    want = r"repacked must be uint8 \[ceil\(n/32\), ceil\(K/64\), 512\] = \[2, 2, 512\]"
    with pytest.raises(RuntimeError, match=want + r" for n=40 and x's K=128; got Byte \[2, 1, 512\]"):
        torch.ops.ternary.gemm_fused(x, wrong, scale, 0, n, None)
    with pytest.raises(RuntimeError, match=want + r" for n=40 and the given K=128; got Byte"):
        torch.ops.ternary.dequantize_repacked(wrong, scale, 0, n, k, torch.bfloat16)
    with pytest.raises(RuntimeError, match=want + r" for n=40 and the given K=128; got Byte"):
        torch.ops.ternary.unrepack(wrong, n, k)


def test_cuda_graph_capture_and_replay():
    _rng()
    n, k, m = 300, 1028, 7
    codes, scale = _weights(n, k, "channel", 0)
    repacked = ops.repack(ops.pack(codes))
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    ops.gemm_fused(x, repacked, scale, 0, n)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.gemm_fused(x, repacked, scale, 0, n)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x.double() @ _dense64(codes, scale, 0).t(), torch.bfloat16, "graph replay")


@pytest.mark.parametrize("group_size", [0, 64])
def test_reference_ops_capture_in_a_cuda_graph(group_size):
    """Where ternary._C is absent (the WSL2 / Windows fallback) the cuBLAS and reference paths
    run the PyTorch reference ops on CUDA tensors, and vLLM captures them in CUDA graphs: no
    host-to-device copy or sync may hide in them. Called directly, as _C overrides them here."""
    _rng()
    n, k, m = 40, 200, 5
    codes, scale = _weights(n, k, "group" if group_size else "channel", group_size)
    packed = ops._pack_ref(codes)
    repacked = ops._repack_ref(packed)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    calls = {
        "dequantize + mm": lambda: torch.mm(x, ops._dequantize_ref(packed, scale, group_size,
                                                                   x.dtype).t()),
        "gemm": lambda: ops._gemm_ref(x, packed, scale, group_size, None),
        "gemm_fused": lambda: ops._gemm_fused_ref(x, repacked, scale, group_size, n, None),
        "linear_fused, dequantize route": lambda: ops._linear_fused_ref(
            x, repacked, None, scale, group_size, n, 0, None),
    }
    for what, call in calls.items():
        call()  # warm-up outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = call()
        x.copy_(torch.randn_like(x))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(y, x.double() @ _dense64(codes, scale, group_size).t(), torch.bfloat16,
               f"{what} replayed, group_size {group_size}")


def test_torch_compile_reduce_overhead():
    _rng()
    n, k = 96, 256
    codes, scale = _weights(n, k, "channel", 0)
    repacked = ops.repack(ops.pack(codes))

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def f(x):
        return ops.gemm_fused(x, repacked, scale, 0, n) * 2

    for _ in range(3):  # the third call replays the captured graph
        x = torch.randn(4, k, dtype=torch.bfloat16, device="cuda")
        y = f(x).clone()
        _check(y, 2 * (x.double() @ _dense64(codes, scale, 0).t()), torch.bfloat16, "compile")


@pytest.mark.parametrize("one_copy", [False, True])
def test_linear_fused_routes_by_m_at_run_time(one_copy):
    """At most max_m rows: gemm_fused's bits exactly; above: dequantize + mm's bits exactly
    (from the canonical copy, or from the unrepacked fused layout without one)."""
    _rng()
    n, k, max_m = 300, 1028, 8
    codes, scale = _weights(n, k, "channel", 0)
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    for m in (1, max_m, max_m + 1, 77):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        y = ops.linear_fused(x, repacked, None if one_copy else packed, scale, 0, n, max_m, bias)
        _check(y, x.double() @ _dense64(codes, scale, 0).t() + bias.double(), torch.bfloat16,
               f"linear_fused m={m}")
        if m <= max_m:
            want = ops.gemm_fused(x, repacked, scale, 0, n, bias)
        else:
            want = x @ ops.dequantize(packed, scale, 0, torch.bfloat16).t() + bias
        assert torch.equal(y, want), f"m={m}: not the {'fused' if m <= max_m else 'dequantize'} route"
    x = torch.randn(3, k, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(ops.linear_fused(x, repacked, packed, scale, 0, n, -1, None),
                       ops.gemm_fused(x, repacked, scale, 0, n, None))


def test_compiled_once_then_replayed_at_every_m_keeps_the_fused_route():
    """vLLM compiles one graph for all batch sizes (shape guards off): traced at M=128, the
    graph must still take the fused kernel at M=1 (bit-identical to gemm_fused)."""
    from ternary import kernels

    _rng()
    n, k = 256, 512
    codes, scale = _weights(n, k, "channel", 0)
    kernel = kernels.FusedKernel()
    prepared = kernel.prepare(ops.pack(codes), scale, 0)
    f = torch.compile(lambda x: kernel.apply(x, prepared), dynamic=True, fullgraph=True)
    f(torch.randn(128, k, dtype=torch.bfloat16, device="cuda"))
    x = torch.randn(3, k, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(f(x), ops.gemm_fused(x, prepared.repacked, scale, 0, n))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_repacked_matches_dequantize_bit_for_bit(dtype):
    """Random shapes (partial tiles in n and K, K % 8 != 0 for the scalar stores), every scale
    mode: the same bits as dequantize from the canonical copy."""
    rng = _rng(17)
    for _ in range(12):
        n, k = rng.randint(1, 300), 4 * rng.randint(1, 300)
        mode = rng.choice(["channel", "tensor", "group"])
        gs = 64 * rng.randint(1, 3) if mode == "group" else 0
        codes, scale = _weights(n, k, mode, gs)
        packed = ops.pack(codes)
        got = ops.dequantize_repacked(ops.repack(packed), scale, gs, n, k, dtype)
        assert torch.equal(got, ops.dequantize(packed, scale, gs, dtype)), (n, k, mode, gs)


@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 12, 16])
def test_decode_kernel_every_warp_count_and_scale(m):
    """fused_decode_kernel (M <= 8: one batch block, M <= 16: two): 4, 8 and 16 warps a block
    (K 8192 with few tiles of N gives 16), channel and tensor scale, ragged N, bias, against
    float64. At M <= 8 the first four N stage x in shared memory where it fits (decode_kernel.cuh,
    launch_decode: 32 KB a block, two blocks an SM; K of 13 tiles leaves the warps unequal
    steps), the last two (three blocks an SM) do not. At M > 8 (launch_fused_typed) more tiles
    than SMs take two n tiles a warp step, with an odd last tile here, except grids of 2-3
    one-n-tile blocks an SM, which keep one n tile with 4 warps (N of 80 x SMs + 8, K of 11
    tiles); grids of 4 or more blocks an SM at M <= 8 take two n tiles (the two N of
    4 x SMs x 32 + 8 and + 40, in both dtypes). At M > 8, 3-4 tiles an SM take two n tiles
    with 8 warps (N of 112 x SMs + 8, K of 11 tiles), more take 4 (4 x SMs x 32 + 8). Grids
    of 0.5-1.5 one-n-tile blocks an SM at M <= 8 take 16 warps, a 2-deep ring and x from
    global (N of 24 x SMs + 8: fewer blocks than SMs; 32 x SMs + 8: one more, two 16-warp
    blocks on some SMs at 64 registers)."""
    from ternary import _ext

    _rng(m)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bf16, f16 = torch.bfloat16, torch.float16
    # each shape with the instance it must take at M <= 8 and at M 9-16 (so a routing change
    # that leaves one of them unexercised fails here)
    for n, k, mode, dtype, routes in (
            (45, 196, "channel", bf16, ("decode", "decode_nt2")),
            (45, 832, "tensor", bf16, ("decode", "decode_nt2")),
            (33, 8192, "tensor", bf16, ("decode", "decode_nt2")),
            (700, 4096, "channel", bf16, ("decode", "decode_nt2")),
            (2 * sms * 32 + 8, 128, "tensor", bf16, ("decode", "decode_nt2_w4")),
            (4 * sms * 32 + 8, 128, "channel", bf16, ("decode_pair", "decode_wide")),
            (4 * sms * 32 + 40, 704, "tensor", f16, ("decode_pair", "decode_wide")),
            (80 * sms + 8, 704, "channel", f16, ("decode", "decode_nt2_w4")),
            (112 * sms + 8, 704, "tensor", bf16, ("decode", "decode_wide")),
            (24 * sms + 8, 832, "channel", f16, ("decode_shallow", "decode_nt2")),
            (32 * sms + 8, 704, "tensor", bf16, ("decode_shallow", "decode_wide"))):
        want = routes[m > 8]
        assert _ext.fused_route(m, n, k, 0, 0) == want, (m, n, k, sms, want)
        _fused_with_bias_matches(m, n, k, mode, dtype, "decode")


def _fused_with_bias_matches(m: int, n: int, k: int, mode: str, dtype, what: str) -> None:
    """gemm_fused with a bias (channel or tensor scale) against float64 on fresh inputs."""
    codes, scale = _weights(n, k, mode, 0)
    x = torch.randn(m, k, dtype=dtype, device="cuda")
    bias = torch.randn(n, dtype=dtype, device="cuda")
    _poison((m, n), dtype)
    y = ops.gemm_fused(x, ops.repack(ops.pack(codes)), scale, 0, n, bias)
    ref = x.double() @ _dense64(codes, scale, 0).t() + bias.double()
    _check(y, ref, dtype, f"{what} m={m} n={n} k={k} {mode} {dtype}")


def _hopper_route_expected() -> bool:
    """The Hopper route exists on a 9.0 GPU when the extension holds sm_90a code."""
    from ternary import _ext

    info = _ext.build_info() or {}
    return torch.cuda.get_device_capability(0) == (9, 0) and "9.0a" in str(info.get("arch_list"))


@pytest.mark.parametrize("m", [33, 40, 49, 64, 65, 97, 100, 128])
def test_mid_m_routes_match_float64(m):
    """M 33-128 on Hopper (csrc/fused/route.cu, pick_route): wgmma_big with 64-token tiles to
    M = 64 and 128-token tiles above, where its grid (K split 2 or 4 ways to get there) makes
    half a wave: unsplit, split, and the tiles of a partial last wave split (M 33-48 too).
    Grids under half a wave keep wgmma_rs (M 65-128:
    128 tokens with K split, or unsplit 64/128-token blocks at M >= 97) or fused_gemm_nt.
    Ragged N inside a block, K of one tile, channel and tensor scale, bias, both dtypes,
    against float64."""
    from ternary import _ext

    _rng(m)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper = _hopper_route_expected()
    small = "wgmma_rs" if m >= 97 else "fused_gemm_nt"  # one 128-channel block, K of one tile
    cases = (  # n, k, mode, dtype, route on Hopper
        # one block past a wave, 16 k tiles (too few to split the last wave)
        (128 * sms + 40, 1000, "channel", torch.bfloat16, "wgmma_big"),
        # 3 blocks: even split 4 ways they make no half wave
        (300, 4096, "tensor", torch.float16, "wgmma_rs_splitk" if m >= 65 else "fused_gemm_nt"),
        # a third of a wave: split 2 ways
        (128 * (sms // 3), 2048, "channel", torch.bfloat16, "wgmma_big_splitk"),
        # three quarters of a wave and a ragged block: unsplit
        (128 * (3 * sms // 4) + 5, 704, "channel", torch.float16, "wgmma_big"),
        (77, 64, "channel", torch.bfloat16, small),
        # a wave and two blocks, 32 k tiles: the last two split 4 ways
        (128 * (sms + 2) - 50, 2048, "tensor", torch.bfloat16, "wgmma_big_tail"),
    )
    for n, k, mode, dtype, route in cases:
        got = _ext.fused_route(m, n, k, 0, 0)
        if hopper:
            assert got == route, f"m={m} n={n} k={k}: route {got}, expected {route}"
        _fused_with_bias_matches(m, n, k, mode, dtype, got)


@pytest.mark.parametrize("m", [129, 300, 1000])
def test_wgmma_big_route_matches_float64(m):
    """M > 128 on Hopper where the 256-token x 128-channel blocks make half a wave: the TMA
    kernel (csrc/fused/wgmma_big_kernel.cuh). A ragged last row block, N off a multiple
    of 128 (partial channel block), K padded to a tile and K of one tile; where the 256-token
    blocks alone make an eighth of a wave (K split 4 ways would make half), 128-token tiles
    with K split 2 or 4 ways; K split only for the tiles past a whole wave,
    channel and tensor scale, bias, both dtypes, against float64; a grid under an eighth of a
    wave takes fused_gemm_nt. Past a wave without a tail split, 256-token tiles run on the
    persistent kernel, a block taking several. linear_fused above its max_m keeps this route (the same bits as
    gemm_fused), also replayed from a CUDA graph with new x (the TMA descriptor holds x's
    address)."""
    from ternary import _ext

    _rng(m)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hopper = _hopper_route_expected()
    half_wave, row_blocks = -(-sms // 2), -(-m // 256)
    cols = -(-half_wave // row_blocks)  # the fewest 128-channel blocks that make half a wave
    # K split 4 ways (16 k tiles) brings an eighth of a wave to half of one
    eighth = -(-sms // 8)
    cols4 = -(-eighth // row_blocks)
    cases = (  # n, k, mode, dtype, route on Hopper
        (128 * cols + 40, 1000, "channel", torch.bfloat16, "wgmma_big"),
        (128 * cols - 100, 320, "tensor", torch.float16, "wgmma_big"),
        (128 * cols, 64, "channel", torch.float16, "wgmma_big"),
        (128 * cols4 - 60, 1000, "channel", torch.float16, "wgmma_big_splitk"),
        (128 * (cols4 - 1), 1000, "channel", torch.bfloat16, "fused_gemm_nt"),
        # a wave and a few tiles, K of 129 tiles (K above 8192 keeps 256-token tiles): the
        # last tiles split 4 ways
        (128 * (sms // row_blocks + 2) - 50, 8256, "tensor", torch.bfloat16, "wgmma_big_tail"),
        # 1.75 waves, the last round too full to split, K of 129 tiles: the persistent kernel,
        # each block taking one or two tiles, N % 8 != 0 (the scalar stores)
        (128 * -(-(7 * sms // 4) // row_blocks) - 76, 8256, "tensor", torch.bfloat16,
         "wgmma_big"),
    )
    for n, k, mode, dtype, route in cases:
        got = _ext.fused_route(m, n, k, 0, 0)
        if hopper:
            assert got == route, f"m={m} n={n} k={k}: route {got}, expected {route}"
            # a grid that 256-token tiles make only with a K split takes 128-token tiles
            want = 0 if not got.startswith("wgmma_big") else 128 if got.endswith("splitk") else 256
            tokens = _ext.fused_plan(m, n, k, 0, 0)["tokens"]
            assert tokens == want, f"m={m} n={n} k={k}: {tokens}-token tiles, expected {want}"
        _fused_with_bias_matches(m, n, k, mode, dtype, got)
    # The same grid with K of 32 tiles: 256-token tiles take two rounds, 128-token tiles at
    # most three (1.5 x), so it takes 128 (pick_route); the tiles past a wave split where they
    # make under half of one.
    n, k = 128 * (sms // row_blocks + 2) - 50, 2048
    blocks128 = -(-m // 128) * -(-n // 128)
    rest, ts = blocks128 % sms, 1
    while ts < 4 and rest * ts * 2 <= sms:
        ts *= 2
    route = "wgmma_big_tail" if blocks128 > sms and rest and ts > 1 else "wgmma_big"
    if hopper:
        plan = _ext.fused_plan(m, n, k, 0, 0)
        splits = ts if route == "wgmma_big_tail" else 1
        assert plan == {"route": route, "tokens": 128, "splits": splits, "persistent": False}, \
            f"m={m} n={n} k={k}: plan {plan}"
    _fused_with_bias_matches(m, n, k, "channel", torch.float16, route)
    n, k = cases[0][:2]
    codes, scale = _weights(n, k, "channel", 0)
    repacked = ops.repack(ops.pack(codes))
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    y = ops.linear_fused(x, repacked, None, scale, 0, n, 128, bias)
    if hopper:
        assert torch.equal(y, ops.gemm_fused(x, repacked, scale, 0, n, bias)), \
            f"m={m} n={n}: linear_fused above max_m left the wgmma_big route"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = ops.linear_fused(x, repacked, None, scale, 0, n, 128, bias)
    x.copy_(torch.randn(m, k, dtype=torch.bfloat16, device="cuda"))
    graph.replay()
    _check(yg, x.double() @ _dense64(codes, scale, 0).t() + bias.double(), torch.bfloat16,
           f"graph replay m={m} n={n}")


@pytest.mark.parametrize("route", ["wgmma_big_splitk", "wgmma_big_tail"])
def test_dependent_launches_wait_for_their_inputs(route):
    """The split and tail routes launch their second kernels (the split tiles after the whole
    ones, the finish kernel after its split parts) as programmatic dependents: each may start
    before the kernel ahead of it ends and must wait (pdl_wait) before it reads x or the parts,
    or writes. Two ops in a row inside a CUDA graph, the second reading the first's output
    through a torch op, fresh x at every replay: both outputs against float64. (With the
    finish kernels' waits removed on the H200, the split case failed; the tail case passed,
    so the split case is the one that guards the waits.)"""
    from ternary import _ext

    _rng()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m, k1 = 64, 2048
    # route "wgmma_big_splitk": a third of a wave of 64-token blocks, K split; tail: a wave
    # and two blocks, the last two split
    n1 = 128 * (sms // 3) if route == "wgmma_big_splitk" else 128 * (sms + 2) - 48
    if _hopper_route_expected():
        assert _ext.fused_route(m, n1, k1, 0, 0) == route
    c1, s1 = _weights(n1, k1, "channel", 0)
    c2, s2 = _weights(1000, n1, "tensor", 0)
    w1, w2 = ops.repack(ops.pack(c1)), ops.repack(ops.pack(c2))
    src = torch.randn(m, k1, dtype=torch.bfloat16, device="cuda")
    x = torch.empty_like(src)

    def chain():
        x.copy_(src)
        y1 = ops.gemm_fused(x, w1, s1, 0, n1)
        x2 = torch.tanh(y1 * 0.05)
        return y1, x2, ops.gemm_fused(x2, w2, s2, 0, 1000)

    chain()  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1, x2, y2 = chain()
    for i in range(3):
        src.copy_(torch.randn_like(src))
        y1.fill_(float("nan"))
        y2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(y1, src.double() @ _dense64(c1, s1, 0).t(), torch.bfloat16, f"{route} op 1, replay {i}")
        _check(y2, x2.double() @ _dense64(c2, s2, 0).t(), torch.bfloat16, f"{route} op 2, replay {i}")


def test_fused_route_outside_the_hopper_range():
    """The Hopper routes take M > 32 with channel or tensor scale only; a bad size is
    refused with its value."""
    from ternary import _ext

    assert _ext.fused_route(1, 4096, 4096, 0, 0).startswith("decode")
    assert _ext.fused_route(16, 4096, 4096, 0, 0).startswith("decode")
    assert _ext.fused_route(32, 4096, 4096, 0, 0) == "fused_gemm_nt"
    assert _ext.fused_route(100, 4096, 4096, 128, 0) == "fused_gemm"
    # (an exception thrown through pybind11 with the integers streamed into TORCH_CHECK's
    # message killed the interpreter on the H200 image: this must be a clean RuntimeError)
    with pytest.raises(RuntimeError, match="m=-1 n=4096"):
        _ext.fused_route(-1, 4096, 4096, 0, 0)
    with pytest.raises(RuntimeError, match="device=99"):
        _ext.fused_route(1, 4096, 4096, 0, 99)
    if _hopper_route_expected():
        assert _ext.fused_route(64, 4096, 4096, 0, 0) == "wgmma_big_splitk"  # 32 blocks x 4
        assert _ext.fused_route(128, 4096, 4096, 0, 0) == "wgmma_big_splitk"
        assert _ext.fused_route(128, 512, 4096, 0, 0) == "wgmma_rs_splitk"  # 4 blocks
        assert _ext.fused_route(1024, 4096, 4096, 0, 0) == "wgmma_big"
        assert _ext.fused_plan(256, 4096, 4096, 0, 0) == {  # 64 blocks of 128 tokens x 2
            "route": "wgmma_big_splitk", "tokens": 128, "splits": 2, "persistent": False}
        assert _ext.fused_route(256, 1024, 4096, 0, 0) == "fused_gemm_nt"  # 8 blocks
        assert _ext.fused_route(1024, 4096, 4096, 64, 0) == "fused_gemm"  # group scales
        assert _ext.fused_plan(64, 4096, 4096, 0, 0) == {"route": "wgmma_big_splitk",
                                                          "tokens": 64, "splits": 4,
                                                          "persistent": False}
        assert _ext.fused_plan(1024, 4096, 4096, 0, 0)["tokens"] == 256  # under a wave
    assert _ext.fused_plan(1, 1024, 4096, 0, 0) == {"route": "decode", "tokens": 0, "splits": 1,
                                                    "persistent": False}
    with pytest.raises(RuntimeError, match="m=-1 n=4096"):
        _ext.fused_plan(-1, 4096, 4096, 0, 0)


@pytest.mark.parametrize("k_tiles", [7, 9, 10, 11, 12, 43])
def test_persistent_large_m_kernel_over_every_ring_residue(k_tiles):
    """The persistent wgmma_big kernel rounds each tile's k tiles up to whole rounds of its
    6-stage ring (pad stages) and holds a tile's last two stages for its output. K of 7, 9,
    10, 11, 12 and 43 k tiles (43: Llama-2-7B's down_proj at TP=4) cover every remainder mod
    6. One more than whole rounds (7, 43) is the case where the last pad's previous round is a
    held stage, released only after the store (csrc/fused/): waiting for it before the store
    deadlocked. Each takes the persistent kernel, must finish and match float64, a block
    taking several tiles."""
    from ternary import _ext

    if not _hopper_route_expected():
        pytest.skip("the persistent kernel is Hopper's (sm_90a)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m, k = 4096, 64 * k_tiles
    n = 128 * -(-(5 * sms // 2) // (m // 256))  # 2.5 waves of 256 x 128 tiles
    plan = _ext.fused_plan(m, n, k, 0, 0)
    assert plan["route"] == "wgmma_big" and plan["tokens"] == 256, plan
    assert plan["persistent"], plan
    _rng(k_tiles)
    _fused_with_bias_matches(m, n, k, "channel", torch.bfloat16,
                             f"persistent={plan['persistent']}")


@pytest.mark.parametrize("m", [17, 31, 33, 64, 100, 128])
def test_gemm_nt_kernel_pairs_and_edges(m):
    """fused_gemm_nt_kernel (M 17-128, two n tiles a warp step): an odd number of n tiles (the
    last pair's second tile past N), N inside a tile, K long enough that the ring wraps and K
    of one tile (fewer tiles than warps), M that leaves rows of the last m16 tile empty;
    channel and tensor scale, bias, fp16 too, against float64."""
    _rng(m)
    for n, k, mode, dtype in ((3 * 32 + 5, 1000, "channel", torch.bfloat16),
                              (40, 4096, "tensor", torch.float16),
                              (33, 64, "channel", torch.bfloat16),
                              (7 * 32, 2048, "channel", torch.float16)):
        _fused_with_bias_matches(m, n, k, mode, dtype, "gemm_nt")


def test_cuda_refusals_of_bad_values_devices_and_sizes():
    """What the C++ ops refuse (or handle) that once ran a kernel on bad data or crashed in
    torch: codes outside -1..1, K not a multiple of 4, x on another device above max_m,
    integer output dtypes, a scale on meta."""
    n, k = 40, 128
    codes, scale = _weights(n, k, "channel", 0)
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    x = torch.randn(3, k, dtype=torch.bfloat16, device="cuda")
    for bad, found in ((2, r"\[-1, 2\]"), (-2, r"\[-2, 1\]")):
        c = codes.clone()
        c[1, 5] = bad
        with pytest.raises(RuntimeError, match="codes must hold -1, 0 or \\+1 only; found "
                                               "values in " + found):
            torch.ops.ternary.pack(c)
    x130 = torch.randn(3, 132, dtype=torch.bfloat16, device="cuda")[:, :130]
    with pytest.raises(RuntimeError, match=r"x has K=130 inputs per row .* not a multiple of 4"):
        torch.ops.ternary.gemm_fused(x130, repacked, scale, 0, n, None)
    with pytest.raises(RuntimeError, match="x, repacked and scale must be on one CUDA device; "
                                           "got cpu, cuda:0, cuda:0"):
        torch.ops.ternary.linear_fused(x.cpu().repeat(100, 1), repacked, None, scale, 0, n, 1,
                                       None)
    with pytest.raises(RuntimeError, match="dtype must be float16, bfloat16 or float32; got Char"):
        torch.ops.ternary.dequantize(packed, scale, 0, torch.int8)
    with pytest.raises(ValueError, match="scale is on meta but packed is on cuda:0"):
        ops.dequantize(packed, scale.to("meta"))


def test_cuda_ops_with_k_zero_return_the_bias():
    n = 40
    packed = torch.empty(n, 0, dtype=torch.uint8, device="cuda")
    scale = torch.rand(n, device="cuda")
    bias = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(2, 3, 0, dtype=torch.bfloat16, device="cuda")
    y = ops.gemm(x, packed, scale, 0, bias)
    assert y.shape == (2, 3, n) and torch.equal(y, bias.expand(2, 3, n))
    repacked = ops.repack(packed)
    for call in (lambda: torch.ops.ternary.gemm_fused(x, repacked, scale, 0, n, bias),
                 lambda: torch.ops.ternary.linear_fused(x, repacked, None, scale, 0, n, 1, bias)):
        y = call()
        assert y.shape == (2, 3, n) and torch.equal(y, bias.expand(2, 3, n))


def test_dequantize_repacked_takes_an_unaligned_copy():
    n, k = 40, 128
    codes, scale = _weights(n, k, "channel", 0)
    repacked = ops.repack(ops.pack(codes))
    buf = torch.empty(repacked.numel() + 1, dtype=torch.uint8, device="cuda")
    shifted = buf[1:].view(repacked.shape)
    shifted.copy_(repacked)
    assert shifted.data_ptr() % 16
    want = ops.dequantize_repacked(repacked, scale, 0, n, k, torch.float32)
    assert torch.equal(ops.dequantize_repacked(shifted, scale, 0, n, k, torch.float32), want)


def test_large_m_limit_sends_larger_steps_to_dequantize(monkeypatch):
    """TERNARY_LARGE_M_MAX (a user's switch, unset by default): above it linear_fused
    runs dequantize + cuBLAS instead of the large-M kernel, with the same numbers."""
    from torch.profiler import ProfilerActivity, profile

    from ternary import _ext, kernels

    n, k, m = 4096, 4096, 2048
    if not _ext.fused_route(m, n, k, 0, 0).startswith("wgmma_big"):
        pytest.skip(f"no large-M fused kernel on this GPU ({_ext.fused_route(m, n, k, 0, 0)})")
    _rng()
    codes, scale = _weights(n, k, "channel", 0)
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    ref = x.double() @ _dense64(codes, scale, 0).t()

    def run():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = ops.linear_fused(x, repacked, None, scale, 0, n, 128)
            torch.cuda.synchronize()
        return y, [e.key for e in prof.key_averages()]

    monkeypatch.delenv(ops.LARGE_M_ENV, raising=False)
    y, names = run()
    _check(y, ref, torch.bfloat16, "no limit")
    assert any("wgmma_big" in s for s in names), names
    assert kernels.FusedKernel().route(m, n, k) == "fused"
    monkeypatch.setenv(ops.LARGE_M_ENV, str(m - 1))
    y, names = run()
    _check(y, ref, torch.bfloat16, f"limit {m - 1}")
    assert not any("wgmma_big" in s for s in names), names
    assert any("dequantize" in s for s in names), names
    assert kernels.FusedKernel().route(m, n, k) == "fused>cublas"
    monkeypatch.setenv(ops.LARGE_M_ENV, str(m))  # the limit itself still takes the kernel
    y, names = run()
    assert any("wgmma_big" in s for s in names), names
    monkeypatch.setenv(ops.LARGE_M_ENV, "many")
    with pytest.raises(RuntimeError, match="TERNARY_LARGE_M_MAX must be a row count"):
        ops.linear_fused(x, repacked, None, scale, 0, n, 128)


@pytest.mark.parametrize("switch", ["TERNARY_PDL", "TERNARY_PERSISTENT"])
def test_bisect_switches_keep_the_numbers(switch):
    """TERNARY_PDL=0 / TERNARY_PERSISTENT=0 (read once a process, so in a child): the
    persistent large-M kernel (M = 2048) and a K split with its finish kernel (M = 64)
    still match float64."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\nfrom ternary import ops\ntorch.manual_seed(0)\n"
        "for m, n, k in ((2048, 4096, 4096), (64, 4096, 11008)):\n"
        "    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device='cuda')\n"
        "    scale = torch.rand(n, device='cuda') + 0.5\n"
        "    p = ops.pack(codes)\n"
        "    x = torch.randn(m, k, dtype=torch.bfloat16, device='cuda')\n"
        "    y = ops.linear_fused(x, ops.repack(p), None, scale, 0, n, 128)\n"
        "    ref = x.double() @ (codes.double() * scale.double()[:, None]).t()\n"
        "    err = ((y.double() - ref).norm() / ref.norm()).item()\n"
        "    assert err < 1e-2, (m, n, k, err)\n"
        "    print(m, n, k, err)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, switch: "0"},
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("\n") == 2, r.stdout
