"""ternary::linear_a8: an int8_per_token layer in one op (csrc/ops.cpp, linear_a8_cuda), and
Kernel.apply_a8, which the vLLM plugin calls for such layers.

The op quantizes x per token and returns gemm_a8's result (the exact integer sums, then
sum * scale / s + bias in float32, rounded once), whichever kernel it picks by M: the float
kernels with gemm_a8's epilogue up to 128 rows (the decode kernels, wgmma_big split or not,
fused_gemm_nt) and up to 256 where gemm_fused takes wgmma_big, the int8 kernels elsewhere.
So every route is checked bit for bit against ternary::gemm_a8 on quantize_act_int8's x_q, itself checked
against int64 (tests/test_gemm_a8.py), on fresh random activations with outlier channels and a
row of zeros, odd N and K, under CUDA graphs and torch.compile.

    python -m pytest tests/test_linear_a8.py -m gpu -q
"""

from __future__ import annotations

import random

import pytest
import torch

from ternary import kernels, ops


def _x(m, k, dtype, device="cpu", seed=None):
    """Activations as trained models have them: a few channels far larger than the rest, and
    a row of zeros (the 1e-5 clamp)."""
    g = torch.Generator().manual_seed(random.randrange(2**31) if seed is None else seed)
    x = torch.randn(m, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:3]] *= 40
    x[0] = 0
    return x.to(dtype).to(device)


def _layer(n, k, device="cpu", per_tensor=False, bias_dtype=None, seed=None):
    g = torch.Generator().manual_seed(random.randrange(2**31) if seed is None else seed)
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, generator=g)
    scale = torch.rand(1 if per_tensor else n, generator=g) + 0.25
    bias = None if bias_dtype is None else torch.randn(n, generator=g).to(bias_dtype)
    packed = ops.pack(codes.to(device))
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return packed, ops.repack(packed), to(scale), to(bias)


def _want(x, packed, scale, bias):
    """gemm_a8 on quantize_act_int8's int8 x_q: the result the op must give bit for bit."""
    k = x.shape[-1]
    xq, s = ops.quantize_act_int8(x.reshape(-1, k), torch.int8)
    y = ops.gemm_a8(xq, s, packed, scale, bias, x.dtype)
    return y.view(*x.shape[:-1], packed.shape[0])


def _same_bits(y, want, what):
    """torch.equal plus the bits (-0.0 against 0.0 and NaN patterns count)."""
    assert y.dtype == want.dtype and y.shape == want.shape, what
    iview = {torch.float32: torch.int32}.get(y.dtype, torch.int16)
    same = y.view(iview) == want.view(iview)
    if not bool(same.all()):
        bad = (~same).nonzero()[0].tolist()
        pytest.fail(f"{what}: {int((~same).sum())} of {y.numel()} outputs differ from gemm_a8; "
                    f"first at {bad}: {y[tuple(bad)].item()} against {want[tuple(bad)].item()}")


# ---------------------------------------------------------------------------------------
# CPU: the reference, the fake kernel, the errors, Kernel.apply_a8 and the route summary.


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16))
@pytest.mark.parametrize("m,n,k", [(1, 5, 4), (9, 40, 256), (4, 33, 132)])
def test_reference_is_gemm_a8_of_the_quantized_x(m, n, k, dtype):
    packed, repacked, scale, bias = _layer(n, k, bias_dtype=dtype)
    x = _x(m, k, dtype)
    _same_bits(ops.linear_a8(x, repacked, n, scale, bias), _want(x, packed, scale, bias),
               f"reference m={m} n={n} k={k} {dtype}")
    # and the integer sums are int64's: sum * scale / s + bias within float32 rounding
    xq, s = ops.quantize_act_int8(x.float(), torch.int8)
    acc = (xq.long() @ ops.unpack(packed).long().t()).double()
    want = acc * scale.double() / s.double() + bias.double()
    y = ops.linear_a8(x.float(), repacked, n, scale, bias.float())
    assert float((y.double() - want).abs().max()) <= 2**-21 * float(want.abs().max() + 1)


def test_reference_takes_leading_dimensions_and_a_given_s():
    packed, repacked, scale, _ = _layer(24, 64)
    x = _x(6, 64, torch.bfloat16).view(2, 3, 64)
    y = ops.linear_a8(x, repacked, 24, scale)
    assert y.shape == (2, 3, 24)
    _same_bits(y, _want(x, packed, scale, None), "x [2, 3, 64]")
    # a row-parallel slice quantized against its whole row's max (amax): the same as
    # quantizing the slice with that max and multiplying by the slice's weight
    amax = x.float().abs().amax(-1, keepdim=True)
    half_packed, half_repacked = packed[:, 8:], ops.repack(packed[:, 8:].contiguous())
    y = ops.linear_a8(x[..., 32:], half_repacked, 24, scale, amax=amax)
    xq, s = ops.quantize_act_int8(x[..., 32:], torch.int8, amax=amax)
    want = ops.gemm_a8(xq.reshape(6, 32), s.reshape(6, 1), half_packed.contiguous(), scale,
                       None, x.dtype)
    _same_bits(y, want.view(2, 3, 24), "amax slice")


def test_fake_kernel_gives_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 128, dtype=torch.bfloat16)
        y = ops.linear_a8(x, torch.empty(ops.repacked_shape(70, 128), dtype=torch.uint8), 70,
                          torch.empty(70))
        assert y.shape == (3, 5, 70) and y.dtype == torch.bfloat16


def _bad_calls(device):
    x = torch.zeros(3, 64, dtype=torch.bfloat16, device=device)
    rp = torch.zeros(ops.repacked_shape(40, 64), dtype=torch.uint8, device=device)
    sc = torch.ones(40, device=device)
    return [
        ((x.to(torch.int8), rp, 40, sc, None, None),
         r"float16, bfloat16 or float32 activations; got x (torch.int8|Char)"),
        ((x, rp, 70, sc, None, None), r"repacked must be uint8 \[3, 1, 512\] for n=70"),
        ((torch.zeros(3, 128, dtype=torch.bfloat16, device=device), rp, 40, sc, None, None),
         r"for n=40 and x's K=128"),
        ((x, rp, 40, torch.ones(40, 1, device=device), None, None),
         r"channel scale float32 \[40\] or a tensor scale \[1\].*\[40, 1\].*group scales: "
         r"ternary\.ops\.linear_a8_float"),
        ((x, rp, 40, sc, torch.zeros(40, device=device), None),
         r"bias must be \[40\] of x's dtype"),
        ((x, rp, 40, sc, None, torch.ones(2, device=device)),
         r"s float32 with one value a row of x \(3 rows"),
        ((torch.zeros((), dtype=torch.bfloat16, device=device), rp, 40, sc, None, None),
         r"x must have at least one dimension; got \[\]"),
    ]


@pytest.mark.parametrize("i", range(7))
def test_bad_arguments_are_refused_by_name(i):
    args, match = _bad_calls("cpu")[i]
    with pytest.raises(ValueError, match=match):
        torch.ops.ternary.linear_a8(*args)


def test_compiles_in_one_graph():
    packed, repacked, scale, bias = _layer(32, 128, bias_dtype=torch.float32, seed=1)
    f = torch.compile(lambda x: ops.linear_a8(x, repacked, 32, scale, bias), fullgraph=True)
    x = _x(5, 128, torch.float32, seed=2)
    _same_bits(f(x), _want(x, packed, scale, bias), "compiled")


def test_reference_kernel_apply_a8_is_gemm_a8_and_group_scales_take_the_float_path():
    n, k = 40, 256
    packed, _, scale, bias = _layer(n, k, bias_dtype=torch.float32)
    x = _x(9, k, torch.float32)
    kern = kernels.ReferenceKernel()
    prepared = kern.prepare(packed, scale, 0)
    _same_bits(kern.apply_a8(x, prepared, bias), _want(x, packed, scale, bias), "reference")
    # group scales: linear_a8_float, the integer sums exact per group, float32 roundings
    gscale = torch.rand(n, k // 64) + 0.1
    prepared = kern.prepare(packed, gscale, 64)
    y = kern.apply_a8(x, prepared, bias)
    q, s = ops.quantize_act_int8(x, torch.int8)
    codes = ops.unpack(packed)
    acc = torch.einsum("mgk,ngk->mng", q.long().view(9, -1, 64), codes.long().view(n, -1, 64))
    want = (acc.double() * gscale.double()).sum(-1) / s.double() + bias.double()
    err = float((y.double() - want).norm() / want.norm())
    assert err < 1e-6, err
    assert torch.allclose(y[0].double(), bias.double())  # the row of zeros: the bias alone


def test_route_summary_merges_the_sampled_m_into_ranges():
    class Stub(kernels.Kernel):
        name = "stub"

        def route_a8(self, m, n, k, dtype=torch.bfloat16):
            return "decode" if m <= 8 else "decode_nt2" if m <= 16 else \
                "fused_gemm_nt" if m <= 128 else "wgmma_a8"

    assert kernels.a8_routes(Stub(), 64, 64, torch.bfloat16) == \
        "decode M 1-8, decode_nt2 M 9-16, fused_gemm_nt M 17-128, wgmma_a8 from M 129"
    assert kernels.a8_routes(kernels.ReferenceKernel(), 64, 64, torch.float32) == "gemm_a8"


# ---------------------------------------------------------------------------------------
# GPU: every route bit for bit against gemm_a8.

# (on the H200's 132 SMs: 2560 x 2560 takes wgmma_big split 4 ways at M 33-256, 8500 x 512
# unsplit, 17900 x 2048 unsplit with its last partial wave split, 6144 x 4096 unsplit at
# M 129-256 too (two 128-token row blocks), 29500 x 640 wgmma_a8 from M 129: its int8 grid
# fills more than half the SMs there)
LAYERS = ((37, 68), (129, 260), (600, 1000), (2560, 2560), (8500, 512), (17900, 2048),
          (6144, 4096), (29500, 640))
MS = (1, 3, 8, 9, 16, 17, 33, 64, 100, 128, 129, 200, 256, 257, 300, 1024)


def _expect_route(m, n, k, dtype):
    """linear_a8's kernel: gemm_fused's at M <= 16 (the decode kernels) and where that is
    wgmma_big up to M = 128, else fused_gemm_nt; up to M = 256 wgmma_big where wgmma_a8's
    128 x 256 tiles would fill under half the SMs; the int8 kernels above."""
    from ternary import _ext

    dev = torch.cuda.current_device()
    if m <= 256 and dtype != torch.float32 and k < 65536:
        fused = _ext.fused_route(m, n, -(-k // 64) * 64, 0, dev)
        if m <= 16:
            assert fused.startswith("decode"), fused
            return fused
        a8_tiles = -(-m // 128) * -(-n // 256)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        if fused.startswith("wgmma_big") and (m <= 128 or 2 * a8_tiles < sms):
            return fused
        if m <= 128:
            return "fused_gemm_nt"
    wg = _ext.a8_wgmma_compiled(dev) and m >= 128
    return "wgmma_a8" if wg else "mma_a8"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("n,k", LAYERS)
@pytest.mark.parametrize("m", MS)
def test_cuda_every_route_is_gemm_a8_bit_for_bit(m, n, k, dtype):
    from ternary import _ext

    rng = random.Random()
    per_tensor, with_bias = rng.random() < 0.3, rng.random() < 0.7
    packed, repacked, scale, bias = _layer(n, k, "cuda", per_tensor,
                                           dtype if with_bias else None)
    x = _x(m, k, dtype, "cuda")
    route = _ext.linear_a8_route(m, n, k, dtype, torch.cuda.current_device())
    assert route == _expect_route(m, n, k, dtype), route
    y = ops.linear_a8(x, repacked, n, scale, bias)
    _same_bits(y, _want(x, packed, scale, bias),
               f"m={m} n={n} k={k} {dtype} route {route} per_tensor={per_tensor} "
               f"bias={with_bias}")


@pytest.mark.gpu
def test_cuda_hopper_takes_wgmma_big_split_unsplit_and_tail():
    """On the H200 (sm_90a image, 132 SMs) the layers above reach each wgmma_big launch, and
    M 129-256 takes it only while wgmma_a8's grid would fill under half the SMs."""
    from ternary import _ext

    dev = torch.cuda.current_device()
    if not _ext.a8_wgmma_compiled(dev) or \
            torch.cuda.get_device_properties(dev).multi_processor_count != 132:
        pytest.skip("needs an sm_90a build on a 132-SM Hopper (the H200, H100 SXM)")
    for m, (n, k), want in ((64, (2560, 2560), "wgmma_big_splitk"),
                            (64, (8500, 512), "wgmma_big"), (64, (17900, 2048), "wgmma_big_tail"),
                            (250, (6144, 4096), "wgmma_big"),
                            (250, (4096, 11008), "wgmma_big_splitk"),
                            (250, (8200, 4096), "wgmma_a8"),  # 2 x 33 tiles: 66 of 132 SMs
                            (250, (12288, 4096), "wgmma_a8"), (257, (6144, 4096), "wgmma_a8")):
        assert _ext.linear_a8_route(m, n, k, torch.bfloat16, dev) == want, (m, n, k)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype", [(5, 40, 256, torch.float32),
                                         (200, 40, 256, torch.float32),
                                         (4, 40, 65536, torch.bfloat16)])
def test_cuda_float32_x_and_long_k_take_the_int8_kernels(m, n, k, dtype):
    """float32 x (no float kernel takes it) and K >= 65536 (the float kernels' sums would pass
    2^24) go to the int8 kernels, still gemm_a8's result."""
    from ternary import _ext

    packed, repacked, scale, bias = _layer(n, k, "cuda", bias_dtype=dtype)
    x = _x(m, k, dtype, "cuda")
    assert _ext.linear_a8_route(m, n, k, dtype, 0) in ("mma_a8", "wgmma_a8")
    _same_bits(ops.linear_a8(x, repacked, n, scale, bias), _want(x, packed, scale, bias),
               f"m={m} k={k} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 12, 64, 300))
def test_cuda_given_s_and_strided_x(m):
    """A row-parallel slice quantized against the whole row's max (s given), and x that is a
    strided view."""
    n, k = 96, 512
    packed, repacked, scale, bias = _layer(n, k, "cuda", bias_dtype=torch.bfloat16)
    whole = _x(m, 2 * k, torch.bfloat16, "cuda")
    amax = whole.float().abs().amax(-1, keepdim=True)
    part = whole[:, k:]  # rows 2k apart
    y = ops.linear_a8(part, repacked, n, scale, bias, amax=amax)
    xq, s = ops.quantize_act_int8(part, torch.int8, amax=amax)
    _same_bits(y, ops.gemm_a8(xq, s, packed, scale, bias, torch.bfloat16), f"amax m={m}")
    _same_bits(ops.linear_a8(part, repacked, n, scale, bias),
               _want(part.contiguous(), packed, scale, bias), f"strided m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 64, 300))
def test_cuda_graph_capture_replay(m):
    n, k = 200, 1000
    packed, repacked, scale, bias = _layer(n, k, "cuda", bias_dtype=torch.bfloat16)
    x = _x(m, k, torch.bfloat16, "cuda")
    ops.linear_a8(x, repacked, n, scale, bias)  # (warm-up outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.linear_a8(x, repacked, n, scale, bias)
    for _ in range(2):
        x.copy_(_x(m, k, torch.bfloat16, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        _same_bits(y, _want(x, packed, scale, bias), f"replay m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 4, 16, 64, 200))
def test_cuda_chained_layers_each_read_their_own_quantize(m):
    """Layer after layer, each x the output of the one before, as in a model. On Hopper the
    float kernels launch before linear_a8's quantize ends (programmatic launches,
    csrc/fused/decode_kernel.cuh) and must still read that quantize's x_q, not what its
    block held from the layer before (the allocator hands the same block back); eager and
    replayed from a CUDA graph."""
    n = k = 2560
    layers = [_layer(n, k, "cuda", bias_dtype=torch.bfloat16) for _ in range(6)]

    def chain(x):
        outs = []
        for _, repacked, scale, bias in layers:
            x = ops.linear_a8(x, repacked, n, scale, bias)
            outs.append(x)
        return outs

    def check(x, outs, what):
        for i, (packed, _, scale, bias) in enumerate(layers):
            _same_bits(outs[i], _want(x if i == 0 else outs[i - 1], packed, scale, bias),
                       f"{what} m={m} layer {i}")

    x = _x(m, k, torch.bfloat16, "cuda")
    check(x, chain(x), "eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain(x)
    for _ in range(2):
        x.copy_(_x(m, k, torch.bfloat16, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        check(x, outs, "replay")


@pytest.mark.gpu
def test_cuda_torch_compile_keeps_every_route():
    """One compiled graph at three M (dynamic): the route is chosen inside the op per call."""
    n, k = 128, 640
    packed, repacked, scale, bias = _layer(n, k, "cuda", bias_dtype=torch.bfloat16)
    f = torch.compile(lambda x: ops.linear_a8(x, repacked, n, scale, bias) * 2, fullgraph=True,
                      dynamic=True)
    for m in (1, 7, 40, 300):
        x = _x(m, k, torch.bfloat16, "cuda")
        _same_bits(f(x), _want(x, packed, scale, bias) * 2, f"compiled m={m}")


@pytest.mark.gpu
def test_cuda_kernels_apply_a8_agree_bit_for_bit():
    """The fused kernel's op, the cuBLAS path (float32 mm of x_q and the codes) and the
    reference kernel's gemm_a8 give one result."""
    n, k = 300, 1088
    packed, _, scale, bias = _layer(n, k, "cuda", bias_dtype=torch.bfloat16)
    for m in (1, 20, 200):
        x = _x(m, k, torch.bfloat16, "cuda").view(1, m, k)
        want = _want(x, packed, scale, bias)
        for kern in (kernels.FusedKernel(), kernels.CublasKernel(), kernels.ReferenceKernel()):
            prepared = kern.prepare(packed, scale, 0)
            _same_bits(kern.apply_a8(x, prepared, bias), want, f"{kern.name} m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(7))
def test_cuda_op_refuses_bad_arguments_by_name(i):
    args, match = _bad_calls("cuda")[i]
    with pytest.raises(ValueError, match=match):
        torch.ops.ternary.linear_a8(*args)


@pytest.mark.gpu
def test_cuda_op_refuses_tensors_on_other_devices_and_route_refuses_bad_arguments():
    from ternary import _ext

    packed, repacked, scale, bias = _layer(40, 64, "cuda", bias_dtype=torch.bfloat16)
    x = _x(3, 64, torch.bfloat16, "cuda")
    with pytest.raises(RuntimeError, match=r"x, repacked and scale must be on one device"):
        torch.ops.ternary.linear_a8(x, repacked.cpu(), 40, scale, bias, None)
    with pytest.raises(RuntimeError, match=r"bias and s must be on x's device"):
        torch.ops.ternary.linear_a8(x, repacked, 40, scale, bias.cpu(), None)
    for args in ((-1, 40, 64, "bfloat16", 0), (3, 40, 64, "int8", 0),
                 (3, 40, 64, "bfloat16", torch.cuda.device_count())):
        with pytest.raises(RuntimeError, match=r"linear_a8_route takes m, n, k >= 0"):
            _ext.require().linear_a8_route(*args)


@pytest.mark.parametrize("device", ("cpu", pytest.param("cuda", marks=pytest.mark.gpu)))
def test_empty_calls_are_the_bias(device):
    """M = 0 and K = 0 (empty sums): zeros plus the bias, on the reference and the CUDA op."""
    _, _, scale, bias = _layer(40, 64, device, bias_dtype=torch.float32)
    empty = torch.zeros(ops.repacked_shape(40, 0), dtype=torch.uint8, device=device)
    y = ops.linear_a8(torch.zeros(2, 3, 0, device=device), empty, 40, scale, bias)
    assert torch.equal(y, bias.expand(2, 3, 40))
    assert torch.equal(ops.linear_a8(torch.zeros(3, 0, device=device), empty, 40, scale),
                       torch.zeros(3, 40, device=device))


@pytest.mark.gpu
def test_cuda_empty_calls():
    packed, repacked, scale, bias = _layer(40, 64, "cuda", bias_dtype=torch.bfloat16)
    y = ops.linear_a8(torch.zeros(0, 64, dtype=torch.bfloat16, device="cuda"), repacked, 40,
                      scale, bias)
    assert y.shape == (0, 40)
    empty = torch.zeros(ops.repacked_shape(40, 0), dtype=torch.uint8, device="cuda")
    y = ops.linear_a8(torch.zeros(3, 0, dtype=torch.bfloat16, device="cuda"), empty, 40, scale,
                      bias)
    assert torch.equal(y, bias.expand(3, 40))
