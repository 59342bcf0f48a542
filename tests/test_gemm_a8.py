"""ternary::gemm_a8, gemm_a8_repacked and gemm_a8_wgmma, W1.58A8 on int8 tensor cores
(csrc/gemm_a8.cu from the canonical packed weight, csrc/gemm_a8_tc.cu from the fused kernels'
repacked tiles, csrc/fused/wgmma_a8.cu the same tiles on Hopper's int8 wgmma, which
gemm_a8_repacked takes from M = 128 on an sm_90a build).

CPU: the PyTorch reference's integer sums against int64 arithmetic written here, its
epilogue against float64, the fake kernel and the argument errors.
GPU (`-m gpu`): the CUDA kernel's int32 sums bit for bit against int64, its epilogue bit for
bit against the reference's float32 order and within rounding of float64, on fresh random
inputs of odd shapes (K not a multiple of the 64-wide tile, odd N, M from 1 to 16384),
every element written (poisoned outputs), under CUDA graphs and torch.compile.

    python -m pytest tests/test_gemm_a8.py -m gpu -q
"""

from __future__ import annotations

import random

import pytest
import torch

from ternary import ops

OUT = (torch.bfloat16, torch.float16, torch.float32)
# the output's rounding, relative to the result (2^-8, 2^-11, 2^-24); the float32 epilogue's
# three roundings add EPI relative to its terms (the product and the bias: they can cancel)
REL = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-24}
EPI = 2**-22
# ... and below the output's normal range its rounding is half its subnormal step, whatever
# the result (float16: 2^-25, which a bias cancelling the product reaches)
SUB = {d: torch.finfo(d).smallest_normal * torch.finfo(d).eps / 2 for d in REL}
SHAPES = ((1, 1, 4), (1, 37, 68), (3, 64, 64), (5, 65, 132), (16, 129, 260), (17, 96, 1000),
          (64, 2560, 2560), (100, 3840, 2560), (257, 63, 6912), (1024, 131, 516),
          (4096, 200, 128), (16384, 72, 96), (300, 600, 1000), (640, 1100, 1088))


IMPLS = ("canonical", "repacked", "wgmma")


def _need(impl):
    """Skips the wgmma kernel where it does not run (not an sm_90a image on a 9.0 GPU)."""
    if impl == "wgmma":
        from ternary import _ext

        if not _ext.a8_wgmma_compiled(torch.cuda.current_device()):
            pytest.skip("gemm_a8_wgmma needs an sm_90a build on a 9.0 GPU")


def _weight(impl, packed):
    """What `impl` reads: the canonical packed weight, or repack(packed) (made before the
    output is poisoned, so that the output, not the tiles, takes the poisoned block)."""
    return packed if impl == "canonical" else ops.repack(packed)


def _gemm(impl, xq, s, packed, scale, bias=None, out_dtype=torch.bfloat16, weight=None):
    """gemm_a8 on the canonical packed weight, or gemm_a8_repacked on repack(packed)."""
    weight = _weight(impl, packed) if weight is None else weight
    if impl == "canonical":
        return ops.gemm_a8(xq, s, weight, scale, bias, out_dtype)
    if impl == "wgmma":
        return ops.gemm_a8_wgmma(xq, s, weight, packed.shape[0], scale, bias, out_dtype)
    return ops.gemm_a8_repacked(xq, s, weight, packed.shape[0], scale, bias, out_dtype)


def _rng(extra: int = 0) -> random.Random:
    seed = random.randrange(2**31) + extra
    print(f"seed {seed}")
    torch.manual_seed(seed)
    return random.Random(seed)


def _case(m, n, k, device, per_tensor=False, bias_dtype=None):
    xq = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    s = (torch.rand(m, 1) * 100 + 0.5).to(torch.float32)
    scale = torch.rand(1 if per_tensor else n) + 0.25
    bias = torch.randn(n).to(bias_dtype) if bias_dtype is not None else None
    packed = ops.pack(codes)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return [to(t) for t in (xq, s, packed, scale, bias)], codes


def _int64(xq: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The sums in int64, block by block (CPU integer matmul)."""
    return xq.cpu().to(torch.int64) @ codes.to(torch.int64).T


def _float64(acc: torch.Tensor, s, scale, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float64 result, the size of its terms)."""
    y = acc.to(torch.float64) * scale.cpu().double().view(1, -1) / s.cpu().double().view(-1, 1)
    if bias is None:
        return y, y.abs()
    b = bias.cpu().double()
    return y + b, y.abs() + b.abs()


def _within_rounding(y: torch.Tensor, ref_terms, dtype, what: str) -> None:
    ref, terms = ref_terms
    y = y.cpu().double()
    assert torch.isfinite(y).all(), f"{what}: {int((~torch.isfinite(y)).sum())} unwritten/NaN"
    bound = ref.abs() * REL[dtype] + terms * EPI + SUB[dtype]
    bad = (y - ref).abs() > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {y.numel()} outputs beyond float "
                           f"rounding; first at {bad.nonzero()[0].tolist()}")


# ---------------------------------------------------------------------------------------
# CPU: the reference


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m,n,k", [(1, 5, 4), (7, 33, 132), (20, 64, 1000)])
def test_reference_sums_are_the_int64_sums(m, n, k, impl):
    _rng(m)
    (xq, s, packed, scale, _), codes = _case(m, n, k, "cpu")
    got = _gemm(impl, xq, s, packed, scale, out_dtype=torch.int32)
    assert got.dtype == torch.int32 and torch.equal(got.to(torch.int64), _int64(xq, codes))


@pytest.mark.parametrize("dtype", OUT)
def test_reference_epilogue_within_rounding_of_float64(dtype):
    _rng()
    for per_tensor in (False, True):
        (xq, s, packed, scale, bias), codes = _case(9, 70, 260, "cpu", per_tensor, dtype)
        y = ops.gemm_a8(xq, s, packed, scale, bias, dtype)
        assert y.dtype == dtype and y.shape == (9, 70)
        _within_rounding(y, _float64(_int64(xq, codes), s, scale, bias), dtype, "reference")


def test_fake_kernel_gives_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    (xq, s, packed, scale, _), _ = _case(3, 10, 16, "cpu")
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(t) for t in (xq, s, packed, scale)]
        y = ops.gemm_a8(*args, out_dtype=torch.float16)
    assert y.shape == (3, 10) and y.dtype == torch.float16


def _bad_calls(device):
    (xq, s, packed, scale, _), _ = _case(4, 8, 16, device)
    bf = torch.zeros(8, dtype=torch.bfloat16, device=device)
    return [
        ((xq.float(), s, packed, scale, None, torch.bfloat16), "xq int8 \\[M, K\\] with K=16"),
        ((xq[:, :12], s, packed, scale, None, torch.bfloat16), "with K=16"),
        ((xq, s[:3], packed, scale, None, torch.bfloat16), "s float32 \\[M, 1\\] or \\[M\\] with M=4"),
        ((xq, s, packed, scale.view(8, 1).expand(8, 2).contiguous(), None, torch.bfloat16),
         "group scales"),
        ((xq, s, packed, scale, None, torch.int8), "out_dtype=torch.int8"),
        ((xq, s, packed, scale, bf, torch.int32), "none with int32 sums"),
        ((xq, s, packed, scale, bf, torch.float16), "of out_dtype torch.float16"),
    ]


@pytest.mark.parametrize("i", range(7))
def test_bad_arguments_are_refused_by_name(i):
    args, pattern = _bad_calls("cpu")[i]
    with pytest.raises(ValueError, match=pattern):
        ops.gemm_a8(*args)


# ---------------------------------------------------------------------------------------
# GPU: the CUDA kernel


def _poison(shape, dtype):
    fill = -(2**31) if dtype == torch.int32 else float("nan")
    t = torch.full(shape, fill, dtype=dtype, device="cuda")
    del t  # the op's output of this size takes the same block from the caching allocator


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_cuda_int32_sums_bit_exact(m, n, k, impl):
    _need(impl)
    _rng(m * 7 + n)
    (xq, s, packed, scale, _), codes = _case(m, n, k, "cuda")
    weight = _weight(impl, packed)
    _poison((m, n), torch.int32)
    got = _gemm(impl, xq, s, packed, scale, out_dtype=torch.int32, weight=weight)
    torch.cuda.synchronize()
    ref = _int64(xq, codes)
    diff = got.cpu().to(torch.int64) != ref
    assert not diff.any(), (f"m={m} n={n} k={k}: {int(diff.sum())} of {m * n} sums differ; "
                            f"first at {diff.nonzero()[0].tolist()}")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", OUT)
@pytest.mark.parametrize("m,n,k", SHAPES[::2] + SHAPES[1::4])
def test_cuda_epilogue(m, n, k, dtype, impl):
    _need(impl)
    rng = _rng(m + k)
    per_tensor = rng.random() < 0.3
    with_bias = rng.random() < 0.6
    (xq, s, packed, scale, bias), codes = _case(m, n, k, "cuda", per_tensor,
                                                dtype if with_bias else None)
    weight = _weight(impl, packed)
    _poison((m, n), dtype)
    y = _gemm(impl, xq, s, packed, scale, bias, dtype, weight=weight)
    torch.cuda.synchronize()
    what = f"{impl} m={m} n={n} k={k} {dtype} per_tensor={per_tensor} bias={with_bias}"
    _within_rounding(y, _float64(_int64(xq, codes), s, scale, bias), dtype, what)
    cpu = ops._gemm_a8_ref(*(t.cpu() if t is not None else None for t in (xq, s, packed, scale, bias)),
                           dtype)
    same = y.cpu().view(torch.int16 if dtype != torch.float32 else torch.int32) == cpu.view(
        torch.int16 if dtype != torch.float32 else torch.int32)
    assert same.all(), f"{what}: {int((~same).sum())} outputs differ from the float32 reference"


@pytest.mark.gpu
def test_cuda_errors_name_the_argument():
    for args, pattern in _bad_calls("cuda"):
        with pytest.raises((ValueError, RuntimeError), match=pattern):
            ops.gemm_a8(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m", (33, 300))
def test_cuda_graph_capture_replay(impl, m):
    _need(impl)
    _rng()
    n, k = 130, 2564
    (xq, s, packed, scale, bias), codes = _case(m, n, k, "cuda", False, torch.bfloat16)
    repacked = ops.repack(packed)

    def call():
        return _gemm(impl, xq, s, packed, scale, bias, torch.bfloat16, weight=repacked
                     if impl != "canonical" else packed)

    call()  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = call()
    for _ in range(3):
        fresh = torch.randint(-128, 128, (m, k), dtype=torch.int8)
        xq.copy_(fresh)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _within_rounding(y, _float64(_int64(fresh, codes), s, scale, bias), torch.bfloat16,
                         "graph replay")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
def test_cuda_torch_compile_quantize_then_gemm(impl):
    _need(impl)
    _rng()
    n, k = 96, 1028
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed, scale = ops.pack(codes).cuda(), (torch.rand(n) + 0.5).cuda()
    repacked = ops.repack(packed)

    def layer(x):
        xq, s = ops.quantize_act_int8(x, torch.int8)
        if impl == "canonical":
            return ops.gemm_a8(xq, s, packed, scale, None, torch.bfloat16)
        if impl == "wgmma":
            return ops.gemm_a8_wgmma(xq, s, repacked, n, scale, None, torch.bfloat16)
        return ops.gemm_a8_repacked(xq, s, repacked, n, scale, None, torch.bfloat16)

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for m in (1, 7, 300):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        torch.testing.assert_close(compiled(x), layer(x), rtol=0, atol=0)


@pytest.mark.gpu
def test_cuda_op_checks_its_arguments_without_the_python_wrapper():
    """torch.ops.ternary.gemm_a8 called directly (C++ callers, other wrappers): csrc/ops.cpp's
    own checks, by name."""
    (xq, s, packed, scale, _), _ = _case(4, 8, 16, "cuda")
    op = torch.ops.ternary.gemm_a8
    bf = torch.zeros(8, dtype=torch.bfloat16, device="cuda")
    for args, pattern in [
        ((xq.float(), s, packed, scale, None, torch.bfloat16), "xq int8 \\[M, K\\] with K=16"),
        ((xq, s[:3], packed, scale, None, torch.bfloat16), "s float32 \\[M, 1\\] or \\[M\\] with M=4"),
        ((xq, s, packed, scale.view(8, 1), None, torch.bfloat16), "channel scale float32 \\[8\\]"),
        ((xq, s, packed, scale, None, torch.int8), "out_dtype="),
        ((xq, s, packed, scale, bf, torch.int32), "none with int32"),
    ]:
        with pytest.raises((ValueError, RuntimeError), match=pattern):
            op(*args)


@pytest.mark.gpu
def test_cuda_empty_k_gives_the_bias():
    """K = 0: every sum is empty, so y is the bias (zero without one), as in the reference."""
    xq = torch.zeros(3, 0, dtype=torch.int8, device="cuda")
    s = torch.ones(3, 1, device="cuda")
    packed = torch.zeros(5, 0, dtype=torch.uint8, device="cuda")
    scale = torch.ones(5, device="cuda")
    bias = torch.randn(5, device="cuda").to(torch.bfloat16)
    from ternary import _ext

    for impl in IMPLS:
        if impl == "wgmma" and not _ext.a8_wgmma_compiled(torch.cuda.current_device()):
            continue
        assert torch.equal(_gemm(impl, xq, s, packed, scale, bias, torch.bfloat16),
                           bias.expand(3, 5)), impl
        assert not _gemm(impl, xq, s, packed, scale, None, torch.float32).any(), impl
def test_repacked_reference_is_the_canonical_one_bit_for_bit():
    _rng()
    for m, n, k, dtype in ((3, 37, 68, torch.bfloat16), (9, 70, 260, torch.float16),
                           (5, 33, 132, torch.float32), (4, 64, 128, torch.int32)):
        (xq, s, packed, scale, bias), _ = _case(m, n, k, "cpu", False,
                                                None if dtype == torch.int32 else dtype)
        want = ops.gemm_a8(xq, s, packed, scale, bias, dtype)
        got = ops.gemm_a8_repacked(xq, s, ops.repack(packed), n, scale, bias, dtype)
        assert torch.equal(got, want), (m, n, k, dtype)


def test_repacked_refuses_tiles_of_another_shape_by_name():
    (xq, s, packed, scale, _), _ = _case(4, 40, 132, "cpu")
    rep = ops.repack(packed)  # [2, 3, 512] for n=40, k=132
    with pytest.raises(ValueError, match="n=70"):
        ops.gemm_a8_repacked(xq, s, rep, 70, torch.ones(70))
    with pytest.raises(ValueError, match="K=128"):
        ops.gemm_a8_repacked(xq[:, :128].contiguous(), s, rep, 40, scale)
    with pytest.raises(ValueError, match="xq int8"):
        ops.gemm_a8_repacked(xq.float(), s, rep, 40, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (70, 200))
def test_cuda_repacked_takes_strided_and_offset_x(m):
    """x rows that are a column slice of a wider tensor, and a start past 16-byte alignment:
    the op copies them to the aligned, k-padded rows the kernel reads (m = 200: the wgmma
    kernel's permute pass reads them where it runs)."""
    _rng()
    n, k = 96, 260
    (xq, s, packed, scale, _), codes = _case(m, n, k, "cuda")
    wide = torch.randint(-128, 128, (m, k + 12), dtype=torch.int8, device="cuda")
    wide[:, 4:4 + k] = xq
    got = ops.gemm_a8_repacked(wide[:, 4:4 + k], s, ops.repack(packed), n, scale,
                               out_dtype=torch.int32)
    assert torch.equal(got.cpu().to(torch.int64), _int64(xq, codes))
    # k a multiple of 16 (no padding copy), rows from a start 4 bytes past alignment
    k = 256
    (xq, s, packed, scale, _), codes = _case(m, n, k, "cuda")
    flat = torch.zeros(m * k + 4, dtype=torch.int8, device="cuda")
    flat[4:].copy_(xq.reshape(-1))
    assert flat[4:].data_ptr() % 16
    got = ops.gemm_a8_repacked(flat[4:].view(m, k), s, ops.repack(packed), n, scale,
                               out_dtype=torch.int32)
    assert torch.equal(got.cpu().to(torch.int64), _int64(xq, codes))


@pytest.mark.gpu
def test_cuda_repacked_op_checks_its_arguments_without_the_python_wrapper():
    (xq, s, packed, scale, _), _ = _case(4, 40, 132, "cuda")
    op = torch.ops.ternary.gemm_a8_repacked
    rep = ops.repack(packed)
    bf = torch.zeros(40, dtype=torch.bfloat16, device="cuda")
    for args, pattern in [
        ((xq.float(), s, rep, 40, scale, None, torch.bfloat16), "xq int8 \\[M, K\\]"),
        ((xq, s, rep, 70, scale, None, torch.bfloat16), "repacked must be uint8 \\[3, 3, 512\\]"),
        ((xq, s[:3], rep, 40, scale, None, torch.bfloat16), "gemm_a8_repacked takes s float32"),
        ((xq, s, rep, 40, scale, bf, torch.int32), "none with int32"),
    ]:
        with pytest.raises((ValueError, RuntimeError), match=pattern):
            op(*args)


@pytest.mark.gpu
def test_cuda_a8_route_and_wgmma_refusal():
    """gemm_a8_repacked's route: mma.sync below M = 128, the wgmma kernel from there where it
    is compiled; gemm_a8_wgmma elsewhere is refused by name, not run on the wrong image."""
    from ternary import _ext

    dev = torch.cuda.current_device()
    compiled = _ext.a8_wgmma_compiled(dev)
    assert _ext.a8_route(1, dev) == "mma_a8" and _ext.a8_route(127, dev) == "mma_a8"
    assert _ext.a8_route(128, dev) == ("wgmma_a8" if compiled else "mma_a8")
    with pytest.raises(RuntimeError, match="a8_route takes m >= 0 .* got m=-1"):
        _ext.a8_route(-1, dev)
    with pytest.raises(RuntimeError, match="a8_wgmma_compiled takes a device index below"):
        _ext.a8_wgmma_compiled(torch.cuda.device_count())
    if not compiled:
        (xq, s, packed, scale, _), _ = _case(4, 40, 132, "cuda")
        with pytest.raises(RuntimeError, match="gemm_a8_wgmma runs only where ternary._C has sm_90a"):
            ops.gemm_a8_wgmma(xq, s, ops.repack(packed), 40, scale)
