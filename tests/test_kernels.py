"""The kernel policy (ternary/kernels.py) on injected platforms: no GPU needed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ternary import kernels, ops
from ternary.platform import Platform, detect_platform

GPU = Platform(system="linux", wsl=False, cuda=True, capability=(9, 0), extension=True)
WSL_NO_EXT = Platform(system="linux", wsl=True, cuda=True, capability=(8, 9),
                              extension=False, extension_error="undefined symbol: foo")
WINDOWS = Platform(system="windows", wsl=False, cuda=True, capability=(8, 9),
                           extension=True)
CPU_ONLY = Platform(system="linux", wsl=False, cuda=False, capability=None,
                            extension=False)


def choose(platform, env=None, dtype=torch.bfloat16, group_size=0, device="cuda"):
    return kernels.choose(platform, n=4096, k=4096, dtype=dtype, group_size=group_size,
                          device=device, env=env or {})


def test_gpu_with_extension_picks_fused():
    assert choose(GPU).name == "fused"


def test_wsl2_without_extension_defaults_to_cublas():
    assert choose(WSL_NO_EXT).name == "cublas"
    ok, why = kernels.FusedKernel().can_implement(WSL_NO_EXT, 1, 4, torch.bfloat16, 0,
                                                  torch.device("cuda"))
    assert not ok and "WSL2" in why and "undefined symbol: foo" in why


def test_windows_float32_activations_take_cublas():
    assert choose(WINDOWS, dtype=torch.float32).name == "cublas"


def test_group_size_not_multiple_of_64_takes_cublas():
    assert choose(GPU, group_size=48).name == "cublas"
    ok, why = kernels.FusedKernel().can_implement(GPU, 1, 4, torch.bfloat16, 48,
                                                  torch.device("cuda"))
    assert not ok and "48" in why


def test_old_gpu_refused_by_fused():
    old = Platform(system="linux", wsl=False, cuda=True, capability=(7, 5),
                           extension=True)
    ok, why = kernels.FusedKernel().can_implement(old, 1, 4, torch.float16, 0,
                                                  torch.device("cuda"))
    assert not ok and "7.5" in why
    assert choose(old).name == "cublas"


def test_a_build_without_code_for_this_gpu_is_refused_by_every_cuda_path():
    # once loaded, ternary._C serves every ternary op on CUDA tensors, the reference ones too:
    # on a GPU its arch list misses, each would fail at launch ("no kernel image")
    a100 = dataclasses.replace(GPU, capability=(8, 0), extension_archs=("9.0a",))
    with pytest.raises(kernels.NoKernelError) as info:
        choose(a100)
    why = ("ternary._C was built for 9.0a, which has no code for this GPU (compute capability "
           "8.0); rebuild it for this GPU: `ternary doctor` names the targets that cover it, "
           "then `nox -s build-<target>`")
    for name in ("fused", "cublas", "reference"):
        assert f"  {name}: {why}" in str(info.value), str(info.value)
    with pytest.raises(kernels.NoKernelError, match="TERNARY_KERNEL=cublas cannot run"):
        choose(a100, env={"TERNARY_KERNEL": "cublas"})
    assert choose(a100, device="cpu").name == "reference"
    for archs, cap in ((("8.0",), (8, 6)), (("8.0", "9.0a"), (9, 0)), (("8.0+PTX",), (12, 0))):
        assert choose(dataclasses.replace(GPU, capability=cap, extension_archs=archs)
                      ).name == "fused", (archs, cap)


def test_a_ptx_build_serves_later_gpus_and_is_refused_below_its_arch():
    """A --ptx-arch build (arch list compute_80) runs on every GPU of 8.0 or later through the
    driver's JIT, the fused kernel included; a GPU below its arch is refused by name."""
    for cap in ((8, 0), (8, 9), (9, 0)):
        assert choose(dataclasses.replace(GPU, capability=cap, extension_archs=("compute_80",))
                      ).name == "fused", cap
    old = dataclasses.replace(GPU, capability=(8, 6), extension_archs=("compute_89",))
    with pytest.raises(kernels.NoKernelError) as info:
        choose(old)
    assert ("ternary._C was built as compute_89 PTX only, which runs on compute capability 8.9 "
            "or later; this GPU is 8.6") in str(info.value), str(info.value)


def test_cpu_weights_take_reference():
    assert choose(CPU_ONLY, device="cpu").name == "reference"
    assert choose(GPU, device="cpu").name == "reference"


def test_forced_kernel_is_honoured():
    assert choose(GPU, env={"TERNARY_KERNEL": "reference"}).name == "reference"
    assert choose(GPU, env={"TERNARY_KERNEL": "cublas"}).name == "cublas"


def test_forced_kernel_that_cannot_run_says_why():
    with pytest.raises(kernels.NoKernelError, match=r"TERNARY_KERNEL=fused cannot run .*"
                                                    r"needs a CUDA GPU; none is visible"):
        choose(CPU_ONLY, env={"TERNARY_KERNEL": "fused"})


def test_unknown_forced_kernel():
    with pytest.raises(kernels.NoKernelError, match=r"'bogus' is not a kernel; use one of "
                                                    r"fused, cublas, reference"):
        choose(GPU, env={"TERNARY_KERNEL": "bogus"})


def test_auto_is_the_automatic_choice():
    assert choose(GPU, env={"TERNARY_KERNEL": " Auto "}).name == choose(GPU, env={}).name


def test_nothing_fits_lists_every_reason():
    with pytest.raises(kernels.NoKernelError) as e:
        choose(GPU, dtype=torch.float64)
    msg = str(e.value)
    for name in ("fused:", "cublas:", "reference:"):
        assert name in msg
    assert "torch.float64" in msg


def test_fused_routes_large_m_to_cublas():
    k = kernels.FusedKernel()
    assert k.route(kernels.FUSED_MAX_M) == "fused"
    assert k.route(kernels.FUSED_MAX_M + 1) == "fused>cublas"
    assert kernels.FusedKernel(max_m=None).route(10**6) == "fused"


@pytest.mark.parametrize("cuda_route,want", [("wgmma_big", "fused"), ("wgmma_big_splitk", "fused"),
                                             ("fused_gemm_nt", "fused>cublas")])
def test_fused_route_above_max_m_follows_the_extension(monkeypatch, cuda_route, want):
    """Above max_m, linear_fused keeps the fused kernel exactly where the extension picks
    wgmma_big; the report says so only with the shape, an extension and a GPU."""
    from ternary import _ext

    monkeypatch.setattr(_ext, "load", lambda: object())
    monkeypatch.setattr(_ext, "fused_route", lambda m, n, k, g, d: cuda_route)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    k = kernels.FusedKernel()
    assert k.route(1024, 4096, 4096) == want
    assert k.route(1024) == "fused>cublas"  # no shape: no lookup
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert k.route(1024, 4096, 4096) == "fused>cublas"


@pytest.mark.parametrize("m", [3, kernels.FUSED_MAX_M + 5])
@pytest.mark.parametrize("name", ["fused", "cublas", "reference"])
def test_apply_matches_gemm_on_cpu(name, m):
    n, k = 40, 200
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed, scale = ops.pack(codes), torch.rand(n)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.bfloat16)
    kernel = kernels.KERNELS[name]()
    y = kernel.apply(x, kernel.prepare(packed, scale, 0), bias)
    ref = ops.gemm(x, packed, scale, 0, bias)
    assert y.shape == ref.shape
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2


@pytest.mark.parametrize("name", ["fused", "cublas"])
def test_cublas_path_never_takes_a_cublaslt_epilogue(name, monkeypatch):
    """The WSL2 / Windows fallback (and the fused route's M > 128 path off Hopper) avoids
    cublasLt: the bias is added apart, never through addmm / linear's fused epilogue. On
    CPU the fused route runs its Python composite (ternary.ops); the CUDA op is checked
    against cuBLASLt's own log by the GPU test below."""
    def refuse(*args, **kwargs):
        raise AssertionError("addmm / linear with a bias goes through cublasLt")

    for mod, fn in ((torch, "addmm"), (torch.nn.functional, "linear"), (torch, "baddbmm")):
        monkeypatch.setattr(mod, fn, refuse)
    n, k, m = 40, 200, kernels.FUSED_MAX_M + 5
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed, scale = ops.pack(codes), torch.rand(n)
    x, bias = torch.randn(m, k, dtype=torch.bfloat16), torch.randn(n, dtype=torch.bfloat16)
    kernel = kernels.KERNELS[name]()
    if name == "fused":
        assert kernel.route(m) == "fused>cublas"
    y = kernel.apply(x, kernel.prepare(packed, scale, 0), bias)
    ref = ops.gemm(x, packed, scale, 0, bias)
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2


def test_fused_apply_refuses_other_k():
    kernel = kernels.FusedKernel()
    prepared = kernel.prepare(ops.pack(torch.zeros(8, 100, dtype=torch.int8)), torch.ones(8), 0)
    with pytest.raises(ValueError, match="x has K=96 but the layer's weight has K=100"):
        kernel.apply(torch.zeros(1, 96, dtype=torch.bfloat16), prepared)


@pytest.mark.parametrize("name", ["fused", "cublas"])
def test_apply_refuses_x_of_another_dtype_or_device(name):
    # (checked in Python on CPU tensors: apply's own checks come before any op)
    kernel = kernels.KERNELS[name]()
    prepared = kernel.prepare(ops.pack(torch.zeros(8, 64, dtype=torch.int8)), torch.ones(8), 0)
    with pytest.raises(ValueError, match=r"x is torch.int32; the layer takes \(torch.float16, "):
        kernel.apply(torch.zeros(1, 64, dtype=torch.int32), prepared)
    with pytest.raises(ValueError, match="x is on meta but the layer's weight is on cpu"):
        kernel.apply(torch.zeros(1, 64, dtype=torch.bfloat16, device="meta"), prepared)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("one_copy", [False, True])
def test_fused_routes_match_with_or_without_the_canonical_copy(m, one_copy):
    # Without the canonical copy, the large-M route unrepacks the fused layout on the fly.
    n, k = 40, 132
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed, scale = ops.pack(codes), torch.rand(n) + 0.5
    kernel = kernels.FusedKernel(max_m=2)
    prepared = kernel.prepare(packed, scale, 0)
    assert prepared.packed is None and prepared.repacked is not None  # 2 bits a weight
    if not one_copy:
        prepared.packed = packed
    x = torch.randn(m, k, dtype=torch.bfloat16)
    want = ops.gemm(x, packed, scale, 0, None).float()
    got = kernel.apply(x, prepared).float()
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-2)


def test_one_compiled_graph_keeps_both_routes():
    """vLLM compiles a model once for every batch size and drops shape guards. The M-routing
    must therefore live inside one op: a graph traced at M=128 must hold linear_fused (not the
    dequantize + mm branch that Python routing at M=128 would bake in) and serve M=3 too."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    n, k = 40, 136  # K apart from every M used: equal sizes would be "duck" specialized
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed, scale = ops.pack(codes), torch.rand(n) + 0.5
    kernel = kernels.FusedKernel()
    prepared = kernel.prepare(packed, scale, 0)
    f = torch.compile(lambda x: kernel.apply(x, prepared), backend=capture, dynamic=True,
                      fullgraph=True)
    f(torch.randn(kernels.FUSED_MAX_M * 2, k, dtype=torch.bfloat16))
    x = torch.randn(3, k, dtype=torch.bfloat16)
    y = f(x)
    assert len(graphs) == 1, f"recompiled for M=3: {len(graphs)} graphs"
    targets = {str(node.target).removesuffix(".default") for node in graphs[0].graph.nodes
               if node.op == "call_function"}
    assert "ternary.linear_fused" in targets, targets
    assert not targets & {"ternary.dequantize", "ternary.gemm_fused", "ternary.unrepack"}, targets
    assert torch.equal(y, ops.gemm_fused(x, prepared.repacked, scale, 0, n))


@pytest.mark.parametrize("one_copy", [False, True])
def test_linear_fused_reference_routes(one_copy):
    n, k, max_m = 24, 68, 4
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed, scale = ops.pack(codes), torch.rand(n) + 0.5
    repacked = ops.repack(packed)
    bias = torch.randn(n, dtype=torch.bfloat16)
    copy = None if one_copy else packed
    for m in (1, max_m):
        x = torch.randn(2, m, k, dtype=torch.bfloat16)[0]
        assert torch.equal(ops.linear_fused(x, repacked, copy, scale, 0, n, max_m, bias),
                           ops.gemm_fused(x, repacked, scale, 0, n, bias))
    x = torch.randn(max_m + 1, k, dtype=torch.bfloat16)
    want = x @ ops.dequantize(packed, scale, 0, torch.bfloat16).t() + bias
    assert torch.equal(ops.linear_fused(x, repacked, copy, scale, 0, n, max_m, bias), want)
    assert torch.equal(ops.linear_fused(x, repacked, copy, scale, 0, n, -1, bias),
                       ops.gemm_fused(x, repacked, scale, 0, n, bias))


def test_linear_fused_refuses_a_canonical_copy_of_another_shape():
    n, k = 24, 68
    packed = ops.pack(torch.zeros(n, k, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"packed must be uint8 \[n, K/4\] = \[24, 17\].*got \[24, 16\]"):
        ops.linear_fused(torch.zeros(2, k, dtype=torch.bfloat16), ops.repack(packed),
                         packed[:, :16], torch.ones(n), 0, n, 4, None)


@pytest.mark.parametrize("mode", ["channel", "tensor", "group"])
def test_dequantize_repacked_is_dequantize_of_the_canonical_weight(mode):
    n, k = 45, 196  # a partial tile in both n and K
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed = ops.pack(codes)
    gs = 64 if mode == "group" else 0
    scale = {"channel": torch.rand(n), "tensor": torch.rand(1),
             "group": torch.rand(n, -(-k // 64))}[mode]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert torch.equal(ops.dequantize_repacked(ops.repack(packed), scale, gs, n, k, dtype),
                           ops.dequantize(packed, scale, gs, dtype))


def test_dequantize_repacked_refuses_groups_that_split_tiles():
    packed = ops.pack(torch.zeros(8, 128, dtype=torch.int8))
    with pytest.raises(ValueError, match="group_size 0 or a multiple of 64; got 32"):
        ops.dequantize_repacked(ops.repack(packed), torch.ones(8, 4), 32, 8, 128)


_LT_SCRIPT = """
import torch
from ternary import kernels, ops
from ternary.platform import Platform, detect_platform
codes = torch.randint(-1, 2, (512, 1024), dtype=torch.int8)
packed, scale = ops.pack(codes).cuda(), torch.rand(512).cuda()
x = torch.randn(kernels.FUSED_MAX_M + 64, 1024, dtype=torch.bfloat16, device="cuda")
bias = torch.randn(512, dtype=torch.bfloat16, device="cuda")
if {control}:  # what the paths avoid: addmm with a bias, cublasLt's bias epilogue
    y = torch.addmm(bias, x, ops.dequantize(packed, scale, 0, x.dtype).t())
else:
    for name in ("cublas", "fused"):  # the fused kernel's route above FUSED_MAX_M
        k = kernels.KERNELS[name]()
        assert name != "fused" or k.route(x.shape[0]) == "fused>cublas"
        y = k.apply(x, k.prepare(packed, scale, 0), bias)
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="calls cuBLAS")
def test_cublas_paths_never_call_cublaslt_matmul_on_a_gpu(tmp_path):
    """cuBLASLt's own API log (CUBLASLT_LOG_LEVEL=5): torch.mm's plain GEMM runs on
    cuBLAS's internal Lt entry (cublasLtTSTMatmul, H200, torch 2.11), but the paths never
    reach the public cublasLtMatmul that addmm's bias epilogue takes (the control)."""
    import os
    import subprocess
    import sys

    def api_calls(control: bool) -> list[str]:
        log = tmp_path / f"lt-{control}.log"
        env = dict(os.environ, CUBLASLT_LOG_LEVEL="5", CUBLASLT_LOG_FILE=str(log))
        subprocess.run([sys.executable, "-c", _LT_SCRIPT.format(control=control)], env=env,
                       check=True, timeout=120)
        return [ln for ln in log.read_text().splitlines() if "[Api][cublasLtMatmul]" in ln]

    assert api_calls(control=True), "the control made no cublasLtMatmul call: no log?"
    assert api_calls(control=False) == []


_WANT_BIAS = r"bias must be \[N\]=\[40\] of x's dtype torch.bfloat16; got "


@pytest.mark.parametrize("bias,match", [
    (torch.randn(41, dtype=torch.bfloat16), _WANT_BIAS + r"torch.bfloat16 \[41\]"),
    (torch.randn(40), "got torch.float32 \\[40\\]"),
    (torch.randn(1, dtype=torch.bfloat16), "got torch.bfloat16 \\[1\\]")])
def test_cublas_apply_refuses_a_bias_the_fused_route_refuses(bias, match):
    codes = torch.randint(-1, 2, (40, 200), dtype=torch.int8)
    kernel = kernels.CublasKernel()
    prepared = kernel.prepare(ops.pack(codes), torch.rand(40), 0)
    x = torch.randn(3, 200, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        kernel.apply(x, prepared, bias)
    with pytest.raises(ValueError, match="x has K=196 but the layer's weight has K=200"):
        kernel.apply(x[:, :196], prepared)


def test_build_arch_list_as_build_info_gives_it():
    from ternary import _ext

    assert _ext.arch_list({"arch_list": "8.0;8.6, 9.0a"}) == ["8.0", "8.6", "9.0a"]
    assert _ext.arch_list({"arch_list": ["8.9"]}) == ["8.9"]
    assert _ext.arch_list(None) == [] and _ext.arch_list({}) == []
