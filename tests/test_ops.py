"""The PyTorch reference of the `ternary` ops on the CPU: opcheck of every op, round trips,
float64 comparisons and every refusal of the op contract (ternary/ops.py)."""

from __future__ import annotations

import re

import pytest
import torch

from ternary import ops


def _codes(n, k, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    return torch.randint(-1, 2, (n, k), dtype=torch.int8, generator=g)


def _dense64(codes, scale, group_size):
    w = codes.double()
    if group_size:
        return w * scale.double().repeat_interleave(group_size, dim=1)[:, : codes.shape[1]]
    return w * scale.double().view(-1, 1)


@pytest.mark.parametrize("n,k", [(1, 4), (33, 68), (64, 128), (70, 300), (5, 1028)])
def test_pack_unpack_repack_round_trip(n, k):
    codes = _codes(n, k)
    packed = ops.pack(codes)
    assert packed.shape == (n, k // 4)
    assert torch.equal(ops.unpack(packed), codes)
    repacked = ops.repack(packed)
    assert list(repacked.shape) == ops.repacked_shape(n, k)
    assert torch.equal(ops.unrepack(repacked, n, k), packed)


def test_repack_layout_matches_the_kernel_index_formula():
    """csrc/fused/repack.cu's repack_kernel computes each byte from this formula; the reference's
    permutation must agree with it everywhere."""
    n, k = 40, 132
    codes = _codes(n, k, seed=1)
    flat = ops.repack(ops.pack(codes)).flatten().tolist()
    kt_count = -(-k // 64)
    for i, byte in enumerate(flat):
        tile, r = divmod(i, 512)
        nt, kt = divmod(tile, kt_count)
        lane, b = divmod(r, 16)
        g, t = divmod(lane, 4)
        w, h, fb = b >> 2, (b >> 1) & 1, b & 1
        for c in range(4):
            f, rr = fb * 2 + (c >> 1), c & 1
            nn, kk = nt * 32 + f * 8 + g, kt * 64 + t * 16 + w * 4 + rr * 2 + h
            want = int(codes[nn, kk]) + 1 if nn < n and kk < k else 1
            assert (byte >> (2 * c)) & 3 == want, (i, c)


@pytest.mark.parametrize("mode,group_size", [("channel", 0), ("tensor", 0), ("group", 64),
                                             ("group", 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gemm_reference_matches_float64(mode, group_size, dtype):
    n, k, m = 37, 4 * 53, 5
    codes = _codes(n, k)
    scale = {"channel": torch.rand(n) + 0.5, "tensor": torch.rand(1) + 0.5,
             "group": torch.rand(n, -(-k // max(group_size, 1))) + 0.5}[mode]
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    y = ops.gemm(x, ops.pack(codes), scale, group_size, bias)
    ref = x.double() @ _dense64(codes, scale, group_size).t() + bias.double()
    err = ((y.double() - ref).norm() / ref.norm()).item()
    assert err < {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    w = ops.dequantize(ops.pack(codes), scale, group_size, torch.float64)
    assert torch.allclose(w, _dense64(codes, scale, group_size).to(torch.float32).double())


@pytest.mark.parametrize("group_size", [0, 64, 128])
def test_gemm_fused_reference_equals_gemm(group_size):
    n, k = 45, 4 * 77
    codes = _codes(n, k)
    scale = torch.rand(n, -(-k // group_size)) if group_size else torch.rand(n)
    packed = ops.pack(codes)
    x = torch.randn(2, 3, k, dtype=torch.bfloat16)
    y = ops.gemm_fused(x, ops.repack(packed), scale, group_size, n)
    assert y.shape == (2, 3, n)
    assert torch.equal(y, ops.gemm(x, packed, scale, group_size))


def _samples():
    n, k = 40, 136
    codes = _codes(n, k, seed=2)
    packed = ops.pack(codes)
    scale = torch.rand(n)
    x = torch.randn(3, k, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.bfloat16)
    return {
        "pack": (codes,),
        "unpack": (packed,),
        "dequantize": (packed, scale, 0, torch.bfloat16),
        "gemm": (x, packed, scale, 0, bias),
        "repack": (packed,),
        "unrepack": (ops.repack(packed), n, k),
        "gemm_fused": (x, ops.repack(packed), scale, 0, n, bias),
        "quantize_act_int8": (x, torch.int8),
    }


@pytest.mark.parametrize("name", list(_samples()))
def test_opcheck(name):
    torch.library.opcheck(getattr(torch.ops.ternary, name), _samples()[name])


# Every refusal of the contract, each with the values in its message.
def _fused_args(**over):
    n, k = 32, 128
    packed = ops.pack(_codes(n, k, seed=3))
    args = {"x": torch.randn(2, k, dtype=torch.bfloat16), "repacked": ops.repack(packed),
                "scale": torch.rand(n), "group_size": 0, "n": n, "bias": None}
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    ({"x": torch.randn(2, 128)}, r"gemm_fused takes .* got x torch.float32"),
    ({"group_size": 32, "scale": torch.rand(32, 4)}, r"multiple of 64; got 32"),
    ({"n": 64}, r"repacked must be uint8 \[2, 2, 512\]"),
    ({"x": torch.randn(2, 200, dtype=torch.bfloat16)}, r"for n=32, K=200"),
    ({"scale": torch.rand(31)}, r"scale must be \[N\]=\[32\]"),
    ({"bias": torch.randn(31, dtype=torch.bfloat16)}, r"bias must be \[N\]=\[32\]"),
    ({"bias": torch.randn(32)}, r"of x's dtype torch.bfloat16"),
    ({"x": torch.tensor(1.0, dtype=torch.bfloat16)}, r"at least one dimension"),
])
def test_gemm_fused_refusals(over, match):
    args = _fused_args(**over)
    for fn in (ops.gemm_fused, ops._gemm_fused_fake):
        with pytest.raises(ValueError, match=match):
            fn(*args.values())


def test_repack_and_unrepack_refusals():
    with pytest.raises(ValueError, match=r"uint8 \[N, K/4\].*got torch.int8 \[4, 4\]"):
        ops.repack(torch.zeros(4, 4, dtype=torch.int8))
    repacked = ops.repack(ops.pack(_codes(8, 64, seed=4)))
    with pytest.raises(ValueError, match=r"repacked must be uint8 \[1, 2, 512\]"):
        ops.unrepack(repacked, 8, 128)
    with pytest.raises(ValueError, match=r"k=66 must be >= 0 and k a multiple of 4"):
        ops.unrepack(repacked, 8, 66)


def test_dequantize_refuses_a_scale_on_another_device():
    # on meta the op runs its fake kernel, which used to hand back uninitialised memory on
    # packed's device; prepare refuses it before any kernel runs
    from ternary import kernels

    packed, scale = ops.pack(torch.zeros(8, 16, dtype=torch.int8)), torch.ones(8)
    for call in (lambda: ops.dequantize(packed, scale.to("meta")),
                 lambda: ops.dequantize_repacked(ops.repack(packed), scale.to("meta"), 0, 8, 16),
                 lambda: kernels.CublasKernel().prepare(packed, scale.to("meta"), 0)):
        with pytest.raises(ValueError, match="scale is on meta but (re)?packed is on cpu"):
            call()


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool])
def test_dequantize_refuses_an_integer_output_dtype(dtype):
    packed, scale = ops.pack(torch.ones(4, 8, dtype=torch.int8)), torch.full((4,), 0.5)
    with pytest.raises(ValueError, match=f"floating-point weight; got dtype={dtype}"):
        ops.dequantize(packed, scale, 0, dtype)
    with pytest.raises(ValueError, match="floating-point weight"):
        ops.dequantize(packed.to("meta"), scale.to("meta"), 0, dtype)


def test_non_contiguous_packed_and_empty_codes():
    codes = torch.randint(-1, 2, (6, 32), dtype=torch.int8)
    packed = ops.pack(codes)
    strided = packed.t().contiguous().t()  # the same values, column-major
    assert not strided.is_contiguous()
    assert torch.equal(ops.unpack(strided), codes)
    assert torch.equal(ops.repack(strided), ops.repack(packed))
    assert ops.pack(torch.empty(0, 8, dtype=torch.int8)).shape == (0, 2)


def test_prepare_refuses_nan_scales_and_code_3():
    from ternary import kernels

    codes = torch.randint(-1, 2, (8, 16), dtype=torch.int8)
    packed, scale = ops.pack(codes), torch.rand(8) + 0.5
    bad = scale.clone()
    bad[3] = float("inf")
    with pytest.raises(ValueError, match=r"scale \[8\]: 1 of 8 scale values are inf \(first at "
                                         r"index \[3\]: inf\)"):
        kernels.ReferenceKernel().prepare(packed, bad, 0)
    corrupt = packed.clone()
    corrupt[2, 1] = 0xC0  # the top field is 3
    with pytest.raises(ValueError, match=r"holds code 3 in 1 bytes \(first at \[n, byte\] = "
                                         r"\[2, 1\]: 192\)"):
        kernels.ReferenceKernel().prepare(corrupt, scale, 0)


def test_fused_apply_refuses_a_scalar_x():
    from ternary import kernels

    k = kernels.FusedKernel()
    prepared = k.prepare(ops.pack(torch.zeros(8, 64, dtype=torch.int8)), torch.ones(8), 0)
    with pytest.raises(ValueError, match="x has K=.* but the layer's weight has K=64"):
        k.apply(torch.tensor(1.0, dtype=torch.bfloat16), prepared)


def test_large_m_cap_reads_the_env(monkeypatch):
    monkeypatch.delenv(ops.LARGE_M_ENV, raising=False)
    assert ops.large_m_cap() is None
    monkeypatch.setenv(ops.LARGE_M_ENV, "0")
    assert ops.large_m_cap() is None
    monkeypatch.setenv(ops.LARGE_M_ENV, "8192")
    assert ops.large_m_cap() == 8192
    for bad in ("-1", "8k", "1.5", " 8192", "8_192", "+8192"):
        monkeypatch.setenv(ops.LARGE_M_ENV, bad)
        with pytest.raises(ValueError, match=r"TERNARY_LARGE_M_MAX must be a row count >= 0.*" + re.escape(repr(bad))):
            ops.large_m_cap()


# ---------------------------------------------------------------------------------------
# int8 activations per token (docs/formats.md): the reference against transformers' own
# bitnet layers (linear_a8: tests/test_linear_a8.py).


def _outlier_rows(m, k, dtype, seed):
    """Activations as trained models have them: a few channels far larger than the rest."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:3]] *= 40
    x[0] = 0  # a row of zeros: the 1e-5 clamp
    return x.to(dtype)


def _eager(fn):
    return getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", fn)


@pytest.mark.parametrize("k", [3, 64, 100, 2561])
def test_quantize_act_int8_equals_transformers_bitnet_layers(k):
    """The two places transformers defines it, in float32: BitLinear.activation_quant (x_q and
    s) and ActQuant (AutoBitLinear's, x_q / s)."""
    tf = pytest.importorskip("transformers.integrations.bitnet")
    x = _outlier_rows(37, k, torch.float32, seed=k)
    q, s = ops.quantize_act_int8(x)
    q8, s8 = ops.quantize_act_int8(x, torch.int8)
    with torch._dynamo.config.patch(disable=True):
        want_q, want_s = _eager(tf.BitLinear.activation_quant)(None, x)
        want_deq = _eager(tf.ActQuant.forward)(None, x.clone())
    assert torch.equal(q8, want_q) and torch.equal(q, want_q.to(torch.float32))
    assert torch.equal(s, want_s) and torch.equal(s8, s)
    assert torch.equal(q / s, want_deq)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_act_int8_matches_float64(dtype):
    x = _outlier_rows(64, 300, dtype, seed=torch.seed() % 2**31).view(4, 16, 300)
    q, s = ops.quantize_act_int8(x)
    assert q.dtype == dtype and s.dtype == torch.float32 and s.shape == (4, 16, 1)
    xf = x.to(torch.float32)
    amax = xf.abs().amax(-1, keepdim=True).clamp(min=1e-5)
    s64 = torch.tensor(127.0, dtype=torch.float64) * (1.0 / amax.double()).float().double()
    assert torch.equal(s.double(), s64.float().double())
    prod = (xf.double() * s.double()).float().double()  # one float32 multiply
    want = torch.round(prod).clamp(-128, 127)  # torch.round: half to even
    assert torch.equal(q.double(), want)
    assert q.abs().max() <= 127


def test_quantize_act_int8_rounds_half_to_even():
    # s = 127 / 127 = 1: x * s is x itself, so .5 cases are exact
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5]])
    q, s = ops.quantize_act_int8(x)
    assert s.item() == 1.0
    assert q.tolist() == [[127.0, 0.0, 2.0, 2.0, -0.0, -2.0, 126.0]]


@pytest.mark.parametrize("x,out,match", [
    (torch.zeros(2, 0), None, r"non-empty last dimension; got \[2, 0\]"),
    (torch.zeros(2, 4, dtype=torch.int32), None, r"got x torch.int32 \[2, 4\]"),
    (torch.zeros(2, 4), torch.float16, r"as int8 or as x's dtype torch.float32; got "
     r"out_dtype=torch.float16"),
])
def test_quantize_act_int8_refusals(x, out, match):
    with pytest.raises(ValueError, match=match):
        ops.quantize_act_int8(x, out)


def test_quantize_act_int8_takes_the_whole_rows_amax_and_refuses_a_wrong_one():
    """A row-parallel slice of x quantized with its whole row's max equals the matching slice
    of the whole row quantized at once (tensor parallelism's split_row_amax)."""
    x = _outlier_rows(6, 64, torch.float32, seed=4)
    whole_q, whole_s = ops.quantize_act_int8(x)
    amax = x.abs().amax(-1, keepdim=True)
    part_q, part_s = ops.quantize_act_int8(x[:, 32:], amax=amax)
    assert torch.equal(part_q, whole_q[:, 32:]) and torch.equal(part_s, whole_s)
    with pytest.raises(ValueError, match=r"amax must be float32 \[6, 1\].*got torch.float32 \[6\]"):
        ops.quantize_act_int8(x, amax=amax.view(6))
