"""ternary::quantize_act_int8, per-token int8 activation quantization (docs/formats.md,
Activations: int8_per_token; transformers' bitnet ActQuant in float32).

CPU: the PyTorch reference against an independent float64/int64 emulation written here, the
fake kernel (FakeTensorMode, torch.compile fullgraph) and the argument errors.
GPU (`-m gpu`; skipped without CUDA or without ternary._C): the CUDA kernel of csrc/act_quant.cu
bit for bit against the reference on fresh random inputs, every element written (poisoned
outputs), CUDA graph capture/replay and torch.compile. The single GPU command:

    python -m pytest tests/test_act_quant.py -m gpu -q
"""

from __future__ import annotations

import random

import pytest
import torch

from ternary import ops

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DT_IDS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int8: "int8"}
EPS32 = torch.tensor(1e-5, dtype=torch.float32).item()  # float(1e-5) as torch.clamp applies it
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _rng(extra: int = 0) -> random.Random:
    # fresh inputs every run; the seed is printed so that a failure can be replayed
    seed = random.randrange(2**31) + extra
    print(f"seed {seed}")
    torch.manual_seed(seed)
    return random.Random(seed)


def _out_dtypes(dtype):
    return (torch.int8, dtype)


# ---------------------------------------------------------------------------------------
# Inputs


def make_x(shape, dtype, rng: random.Random, device="cpu", special_rows: bool = True):
    """Normal values at a random magnitude per row, a few outlier channels (x30..x100, as
    BitNet's activations have), and with enough rows: a zero row (amax clamps to 1e-5), a row
    below 1e-5 (clamped, still nonzero codes), a row of exact ties (amax 127 * 2^j gives
    s = 2^-j exactly; values (n + 1/2) * 2^j), and negative zeros."""
    k = shape[-1]
    x = torch.randn(shape, device=device, dtype=torch.float32)
    x2 = x.view(-1, k)
    m = x2.shape[0]
    if m:
        x2 *= torch.logspace(-3, 2, m, device=device)[torch.randperm(m, device=device)].view(-1, 1)
    n_out = max(1, k // 256)
    cols = torch.randint(0, k, (n_out,), device=device)
    x2[:, cols] *= rng.uniform(30.0, 100.0)
    if special_rows and m >= 4:
        rows = rng.sample(range(m), 4)
        x2[rows[0]] = 0.0
        x2[rows[1]] = torch.randn(k, device=device) * 1e-7
        j = rng.randint(-6, 4)
        ties = torch.randint(-127, 127, (k,), device=device).to(torch.float32) + 0.5
        ties[rng.randrange(k)] = 127.0
        x2[rows[2]] = ties * 2.0**j
        x2[rows[3], torch.randint(0, k, (max(1, k // 8),), device=device)] = -0.0
    if dtype == torch.float16:
        x = x.clamp(-60000, 60000)
    return x.to(dtype)


# ---------------------------------------------------------------------------------------
# The independent emulation and bitwise comparison


def _f32(t: torch.Tensor) -> torch.Tensor:
    """Round float64 values to float32 (one rounding), back in float64."""
    return t.to(torch.float32).to(torch.float64)


def emulate(x: torch.Tensor, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 arithmetic of the op in float64 and int64: each float32 operation
    (1/amax, * 127, x * s) is computed in float64 and rounded to float32 once, which is the
    correctly rounded float32 result (53 >= 2 * 24 + 2 bits: double rounding is innocuous for
    +, *, /); the max is exact; round half to even is done on integers. Finite x only."""
    x64 = x.to(torch.float64)
    amax = x64.abs().amax(dim=-1, keepdim=True)
    amax = torch.where(amax < EPS32, torch.full_like(amax, EPS32), amax)
    s = _f32(_f32(1.0 / amax) * 127.0)
    p = _f32(x64 * s)
    fl = torch.floor(p)
    frac = p - fl  # exact: |p| < 2^8, p has 24 significant bits
    n = fl.to(torch.int64)
    n = n + ((frac > 0.5) | ((frac == 0.5) & (n % 2 != 0))).to(torch.int64)
    n = n.clamp(-128, 127)
    if out_dtype == torch.int8:
        q = n.to(torch.int8)
    else:  # torch.round keeps the sign of a zero: -0.3 -> -0.0
        qf = torch.where((n == 0) & torch.signbit(p), torch.full_like(p, -0.0), n.to(torch.float64))
        q = qf.to(out_dtype)
    return q, s.to(torch.float32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int8 else t.view(BITS[t.dtype])


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str, nan_equal: bool = False) -> None:
    """Bit for bit (so -0.0 != 0.0); with nan_equal, any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}")
    if got.device != want.device:
        got, want = got.cpu(), want.cpu()
    same = _bits(got) == _bits(want)
    if nan_equal and got.is_floating_point():
        same |= torch.isnan(got) & torch.isnan(want)
    if not bool(same.all()):
        bad = (~same).nonzero()
        i = tuple(bad[0].tolist())
        got, want = got.cpu(), want.cpu()
        raise AssertionError(
            f"{what}: {bad.shape[0]} of {same.numel()} elements differ; first at {list(i)}: "
            f"got {got[i].item()!r} ({_bits(got)[i].item()}), want {want[i].item()!r} "
            f"({_bits(want)[i].item()})")


# ---------------------------------------------------------------------------------------
# CPU: the reference


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
@pytest.mark.parametrize("out_kind", ["int8", "float"])
def test_reference_matches_emulation(dtype, out_kind):
    rng = _rng()
    out_dtype = torch.int8 if out_kind == "int8" else dtype
    for m in (1, 2, 7, 64, 301):
        for k in (1, 3, 64, 100, 2561):
            x = make_x((m, k), dtype, rng)
            q, s = ops._quantize_act_int8_ref(x, out_dtype)
            eq, es = emulate(x, out_dtype)
            assert_same(q, eq, f"x_q m={m} k={k}")
            assert_same(s, es, f"s m={m} k={k}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_reference_3d_and_wrapper(dtype):
    rng = _rng()
    for shape in ((3, 5, 100), (2, 1, 7), (1, 1, 1, 33)):
        x = make_x(shape, dtype, rng)
        q, s = ops.quantize_act_int8(x)  # out_dtype defaults to x's dtype
        assert q.dtype == dtype and q.shape == x.shape
        assert s.dtype == torch.float32 and s.shape == (*shape[:-1], 1)
        eq, es = emulate(x, dtype)
        assert_same(q, eq, f"x_q {shape}")
        assert_same(s, es, f"s {shape}")
        q8, s8 = ops.quantize_act_int8(x, torch.int8)
        assert_same(q8, emulate(x, torch.int8)[0], f"int8 x_q {shape}")
        assert_same(s8, es, f"int8 s {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_ties_round_half_to_even(dtype):
    # amax = 127 makes s exactly 1 (fl(1/127) * 127 rounds to 1.0), so x * s = x
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5, -125.5, -0.0, -0.25, 127.0]],
                     dtype=dtype)
    q, s = ops._quantize_act_int8_ref(x, dtype)
    assert s.item() == 1.0
    want = torch.tensor([[0.0, 2, 2, -0.0, -2, -2, 4, 126, -126, -0.0, -0.0, 127]], dtype=dtype)
    assert_same(q, want, "ties")
    q8, _ = ops._quantize_act_int8_ref(x, torch.int8)
    assert q8.tolist() == [[0, 2, 2, 0, -2, -2, 4, 126, -126, 0, 0, 127]]
    # amax = 127 * 4: s = 1/4; 2 -> 0.5 -> 0, 6 -> 1.5 -> 2, 10 -> 2.5 -> 2
    x = torch.tensor([[2.0, 6.0, 10.0, -6.0, 508.0]], dtype=dtype)
    q8, s = ops._quantize_act_int8_ref(x, torch.int8)
    assert s.item() == 0.25 and q8.tolist() == [[0, 2, 2, -2, 127]]


def test_amax_clamp_rows():
    x = torch.zeros(3, 16)
    x[1] = 1e-6
    x[2, 3] = -4e-6
    q, s = ops._quantize_act_int8_ref(x, torch.int8)
    s_eps = (torch.tensor(1.0) / torch.tensor(EPS32)) * 127  # float32 arithmetic
    assert torch.equal(s, s_eps.expand(3, 1))
    assert q[0].abs().sum() == 0
    assert q[1].tolist() == [13] * 16  # 1e-6 * 1.27e7 = 12.7
    assert q[2, 3].item() == -51 and q[2].abs().sum() == 51  # -4e-6 * 1.27e7 = -50.8


def test_reference_rejects_bad_arguments():
    for x, out, pattern in _bad_calls("cpu"):
        with pytest.raises(ValueError, match=pattern):
            ops.quantize_act_int8(x, out)


def _bad_calls(device):
    x = torch.zeros(2, 3, device=device)
    return [
        (x.double(), torch.int8, r"got x (torch\.float64|Double) \[2, 3\]"),
        (x.to(torch.int8), torch.int8, r"got x (torch\.int8|Char) \[2, 3\]"),
        (torch.zeros(2, 0, device=device), torch.int8, r"non-empty last dimension; got \[2, 0\]"),
        (torch.zeros((), device=device), torch.int8, r"non-empty last dimension; got \[\]"),
        (x.bfloat16(), torch.float16, r"x's dtype (torch\.bfloat16|BFloat16); got "
                                      r"out_dtype=(torch\.float16|Half)"),
        (x, torch.int32, r"x's dtype (torch\.float32|Float); got out_dtype=(torch\.int32|Int)"),
    ]


def test_empty_rows_reference():
    for shape in ((0, 64), (2, 0, 100)):
        q, s = ops.quantize_act_int8(torch.zeros(shape, dtype=torch.bfloat16), torch.int8)
        assert q.shape == shape and q.dtype == torch.int8
        assert s.shape == (*shape[:-1], 1) and s.dtype == torch.float32


# ---------------------------------------------------------------------------------------
# CPU: the fake kernel


def test_fake_kernel_shapes_and_errors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        for shape, dtype, out in (((4, 5, 100), torch.bfloat16, torch.int8),
                                  ((7, 3), torch.float16, torch.float16),
                                  ((0, 64), torch.float32, torch.float32)):
            x = torch.empty(shape, dtype=dtype)
            q, s = torch.ops.ternary.quantize_act_int8(x, out)
            assert q.shape == shape and q.dtype == out
            assert s.shape == (*shape[:-1], 1) and s.dtype == torch.float32
        with pytest.raises(ValueError, match="non-empty last dimension"):
            torch.ops.ternary.quantize_act_int8(torch.empty(3, 0), torch.int8)
        with pytest.raises(ValueError, match="out_dtype"):
            torch.ops.ternary.quantize_act_int8(torch.empty(3, 4), torch.float16)


def _a8(x):
    q, s = ops.quantize_act_int8(x, torch.int8)
    return q, s, q.to(torch.float32) / s


def test_compile_fullgraph_cpu():
    # aot_eager traces through the fake kernel (fullgraph: no graph break) without the C++
    # compile inductor would need on CPU; the GPU test below compiles with inductor
    rng = _rng()
    compiled = torch.compile(_a8, fullgraph=True, backend="aot_eager", dynamic=True)
    for shape in ((5, 64), (9, 100), (2, 3, 64)):
        x = make_x(shape, torch.bfloat16, rng)
        for got, want, what in zip(compiled(x), _a8(x), ("x_q", "s", "x_q / s")):
            assert_same(got, want, f"compiled {what} {shape}")


# ---------------------------------------------------------------------------------------
# GPU: the CUDA kernel

M_GPU = (1, 2, 7, 64, 333, 4096, 16384)
K_GPU = (3, 64, 100, 2560, 2561, 6912, 11008, 16384, 65536)
POISON = {torch.int8: -128}  # never produced from finite x (|x * s| <= 127.0001); floats: NaN


def _poisoned_call(x, out_dtype):
    """The op with its outputs' blocks poisoned where the caching allocator allows: same-size
    blocks filled and freed just before, which it mostly hands out again (reused says whether
    it did; test_cuda_every_output_written poisons deterministically through a graph)."""
    k = x.shape[-1]
    qp = torch.full(x.shape, POISON.get(out_dtype, float("nan")), dtype=out_dtype, device="cuda")
    sp = torch.full((*x.shape[:-1], 1), float("nan"), dtype=torch.float32, device="cuda")
    ptrs = (qp.data_ptr(), sp.data_ptr())
    del qp, sp
    q, s = ops.quantize_act_int8(x, out_dtype)
    assert k == q.shape[-1]
    return q, s, (q.data_ptr(), s.data_ptr()) == ptrs


def _check_cuda(x, out_dtype, what, cpu_rows=64):
    """The CUDA op against the reference: all of it against PyTorch's own CUDA ops running
    _quantize_act_int8_ref (IEEE float32 like the CPU), and up to cpu_rows rows (the first,
    the last, random others; rows are independent) against the CPU reference."""
    q, s, _ = _poisoned_call(x, out_dtype)
    assert q.device == x.device and q.shape == x.shape and q.dtype == out_dtype
    assert s.shape == (*x.shape[:-1], 1) and s.dtype == torch.float32
    rq, rs = ops._quantize_act_int8_ref(x, out_dtype)  # the Python function: PyTorch's kernels
    assert_same(q, rq, f"{what}: x_q vs the reference on the GPU")
    assert_same(s, rs, f"{what}: s vs the reference on the GPU")
    k = x.shape[-1]
    x2, q2, s2 = x.reshape(-1, k), q.reshape(-1, k), s.reshape(-1, 1)
    m = x2.shape[0]
    rows = sorted({0, m - 1, *torch.randperm(m)[:cpu_rows].tolist()})
    cq, cs = ops._quantize_act_int8_ref(x2[rows].cpu(), out_dtype)
    assert_same(q2[rows], cq, f"{what}: x_q rows vs the CPU reference")
    assert_same(s2[rows], cs, f"{what}: s rows vs the CPU reference")


@pytest.mark.gpu
def test_cuda_kernel_is_registered():
    # else every test below would compare the reference with itself
    assert torch._C._dispatch_has_kernel_for_dispatch_key("ternary::quantize_act_int8", "CUDA")


@pytest.mark.gpu
@pytest.mark.parametrize("out_kind", ["int8", "float"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
@pytest.mark.parametrize("k", K_GPU)
@pytest.mark.parametrize("m", M_GPU)
def test_cuda_matches_reference(m, k, dtype, out_kind):
    rng = _rng(m * 100003 + k)
    out_dtype = torch.int8 if out_kind == "int8" else dtype
    x = make_x((m, k), dtype, rng, device="cuda")
    _check_cuda(x, out_dtype, f"m={m} k={k} {DT_IDS[dtype]} -> {DT_IDS[out_dtype]}")


def _boundary_ks(dtype):
    """K at the launcher's thresholds (act_quant.cu: chunks of 16 bytes a row: warp up to 32,
    64, 128; block up to 512, 4096, 8192; two-pass above), and odd K next to them."""
    v = 16 // torch.empty((), dtype=dtype).element_size()
    ks = set()
    for chunks in (1, 32, 33, 64, 65, 128, 129, 512, 513, 4096, 4097, 8192, 8193, 12000):
        ks |= {chunks * v, chunks * v + 1, chunks * v + v - 1}
    return sorted(ks)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_cuda_launch_thresholds(dtype):
    rng = _rng()
    for k in _boundary_ks(dtype):
        for m in (1, 5, 9):
            for out_dtype in _out_dtypes(dtype):
                x = make_x((m, k), dtype, rng, device="cuda")
                _check_cuda(x, out_dtype, f"m={m} k={k} {DT_IDS[dtype]} -> {DT_IDS[out_dtype]}")


def _graph_of(static, out_dtype):
    """A CUDA graph of the op on the static input (warmed up on a side stream first) and its
    static outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            ops.quantize_act_int8(static, out_dtype)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = ops.quantize_act_int8(static, out_dtype)
    return graph, q, s
    return graph, q, s


def _poison_outputs(q, s):
    q.fill_(POISON.get(q.dtype, float("nan")))
    s.fill_(float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_cuda_every_output_written(dtype):
    """Deterministic poisoning: a graph's outputs are fixed buffers, so they are filled with
    values the op never writes for finite x (int8 -128, NaN), then the graph replays the
    kernel alone and every element must match the reference."""
    rng = _rng()
    for m, k, off in ((1, 3, 0), (7, 100, 1), (64, 2561, 0), (33, 2561, 3), (333, 6912, 0),
                      (9, 1000, 5), (5, 70001, 0), (3, 70001, 7), (4096, 64, 0), (17, 5, 2),
                      (8200, 64, 1), (8300, 1030, 0), (8193, 2561, 0)):  # > kMaxGrid rows
        base = make_x((m * k + off,), dtype, rng, device="cuda", special_rows=False)
        static = base[off:].view(m, k)  # contiguous: the graph holds the kernel only
        for out_dtype in _out_dtypes(dtype):
            graph, q, s = _graph_of(static, out_dtype)
            _poison_outputs(q, s)
            graph.replay()
            cq, cs = ops._quantize_act_int8_ref(static.cpu(), out_dtype)
            what = f"m={m} k={k} offset {off} -> {DT_IDS[out_dtype]}"
            assert_same(q, cq, f"{what}: x_q (poisoned)")
            assert_same(s, cs, f"{what}: s (poisoned)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_cuda_layouts(dtype):
    """Unaligned rows (a contiguous x starting 1..7 elements past an aligned address: every
    row has a scalar head and unaligned x_q stores), 3-D x, non-contiguous views."""
    rng = _rng()
    for k in (64, 100, 2560, 2561, 6913):
        for off in range(1, 8):
            base = make_x((7 * k + 8,), dtype, rng, device="cuda", special_rows=False)
            x = base[off: off + 7 * k].view(7, k)
            for out_dtype in _out_dtypes(dtype):
                _check_cuda(x, out_dtype, f"offset {off} k={k} -> {DT_IDS[out_dtype]}")
    big = make_x((6, 4, 2561), dtype, rng, device="cuda")
    for x, what in ((big, "3-D"), (big.transpose(0, 1), "transposed"),
                    (big[:, :, ::2], "strided K"), (big[:, 1:3, 5:1000], "sliced")):
        for out_dtype in _out_dtypes(dtype):
            _check_cuda(x, out_dtype, f"{what} {list(x.shape)} -> {DT_IDS[out_dtype]}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS.get)
def test_cuda_special_values(dtype):
    """NaN and inf propagate as in the reference (a NaN row: s NaN, float x_q NaN, int8 x_q
    0; an inf row: s 0); zero rows, tiny rows, ties and -0.0 are bit exact."""
    rng = _rng()
    for k in (3, 100, 2561, 40000):
        x = make_x((12, k), dtype, rng, device="cuda")
        c = lambda: rng.randrange(k)  # noqa: E731
        x[0, c()] = float("nan")
        x[1, c()] = float("inf")
        x[2, c()] = -float("inf")
        x[3, c()] = float("inf")
        x[3, c()] = float("nan")
        x[4] = 0.0
        x[5] = -0.0
        x[6] = torch.randn(k, device="cuda").to(dtype) * 1e-6
        if dtype == torch.float32:
            x[7] = torch.randn(k, device="cuda") * 1e-39  # subnormal float32
        x[8] = (torch.arange(k, device="cuda") % 255 - 127).to(dtype) + 0.5  # amax 127.5
        x[8, 0] = 127.0
        x[8, 1:] = x[8, 1:].clamp(-126.5, 126.5)  # amax 127: s = 1, ties everywhere
        for out_dtype in _out_dtypes(dtype):
            q, s = ops.quantize_act_int8(x, out_dtype)
            cq, cs = ops._quantize_act_int8_ref(x.cpu(), out_dtype)
            assert_same(q, cq, f"special k={k} -> {DT_IDS[out_dtype]}", nan_equal=True)
            assert_same(s, cs, f"special s k={k}", nan_equal=True)
            assert torch.isnan(s[0]).all() and s[1].item() == 0 and torch.isnan(s[3]).all()
            assert s[8].item() == 1.0


@pytest.mark.gpu
def test_cuda_empty_rows_and_errors():
    for shape in ((0, 64), (2, 0, 100), (0, 3)):
        for dtype in DTYPES:
            for out_dtype in _out_dtypes(dtype):
                x = torch.zeros(shape, dtype=dtype, device="cuda")
                q, s = ops.quantize_act_int8(x, out_dtype)
                assert q.shape == shape and q.dtype == out_dtype and q.is_cuda
                assert s.shape == (*shape[:-1], 1) and s.dtype == torch.float32 and s.is_cuda
    for x, out, pattern in _bad_calls("cuda"):
        with pytest.raises(ValueError, match=pattern):
            ops.quantize_act_int8(x, out)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype,out_kind,view", [
    ((1, 2560), torch.bfloat16, "float", None),
    ((16, 4096), torch.bfloat16, "int8", None),
    ((256, 6912), torch.float16, "float", None),
    ((3, 5, 2561), torch.float32, "int8", None),
    ((100, 64), torch.bfloat16, "int8", "transpose"),  # the contiguous copy is captured too
    ((4, 70000), torch.bfloat16, "float", None),  # two-pass kernel
])
def test_cuda_graph_capture_replay(shape, dtype, out_kind, view):
    rng = _rng()
    out_dtype = torch.int8 if out_kind == "int8" else dtype
    if view == "transpose":
        static = make_x(shape[::-1], dtype, rng, device="cuda").t()
    else:
        static = make_x(shape, dtype, rng, device="cuda")
    graph, q, s = _graph_of(static, out_dtype)
    for trial in range(3):
        fresh = make_x(static.shape, dtype, rng, device="cuda")
        static.copy_(fresh)
        _poison_outputs(q, s)
        graph.replay()
        torch.cuda.synchronize()
        cq, cs = ops._quantize_act_int8_ref(fresh.cpu(), out_dtype)
        assert_same(q, cq, f"graph replay {trial} x_q")
        assert_same(s, cs, f"graph replay {trial} s")


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_cuda_torch_compile_fullgraph(dynamic):
    rng = _rng()
    torch._dynamo.reset()
    compiled = torch.compile(_a8, fullgraph=True, dynamic=dynamic)
    for shape in ((1, 2560), (37, 2560), (4, 9, 6912)):
        for dtype in (torch.bfloat16, torch.float16):
            x = make_x(shape, dtype, rng, device="cuda")
            got, want = compiled(x), _a8(x)
            assert_same(got[0], want[0], f"compiled x_q {shape}")
            assert_same(got[1], want[1], f"compiled s {shape}")
            cq, cs = ops._quantize_act_int8_ref(x.cpu(), torch.int8)
            assert_same(got[0], cq, f"compiled x_q {shape} vs CPU")
            assert_same(got[1], cs, f"compiled s {shape} vs CPU")
            # the division is inductor's: compare it with a tolerance of its rounding only
            torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=0)
