"""Registration, config resolution, create_weights and apply against the installed vLLM."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed in this environment")

from ternary import ops
from ternary.formats import bitnet
from ternary.vllm.spec import QuantSpec, TernaryConfigError


@pytest.fixture(scope="module")
def registered():
    from ternary.vllm.register import register

    register()
    from ternary.vllm.config import TernaryConfig

    return TernaryConfig


def test_register_is_idempotent_and_resolvable(registered):
    from vllm.model_executor.layers.quantization import get_quantization_config

    from ternary.vllm.register import register

    assert register() == "already"
    assert get_quantization_config("ternary") is registered


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.value == "ternary.vllm.plugin:register" for ep in eps)


def test_from_config_and_override(registered):
    cfg = registered.from_config({"quant_method": "bitnet", "linear_class": "bitlinear"})
    assert cfg.get_name() == "ternary" and cfg.spec.format == "bitnet"

    class Llama:
        model_type = "llama"

    class BitNet:
        model_type = "bitnet"

    assert registered.override_quantization_method({"quant_method": "bitnet"}, None, Llama()) == "ternary"
    assert registered.override_quantization_method({"quant_method": "ternary"}, None, Llama()) is None
    assert registered.override_quantization_method({"quant_method": "bitnet"}, "fp8", Llama()) is None
    class Falcon:
        model_type = "falcon"

    assert registered.override_quantization_method({"quant_method": "bitnet"}, None,
                                                   BitNet()) == "ternary"
    with pytest.raises(TernaryConfigError, match="model_type='falcon'"):
        registered.override_quantization_method({"quant_method": "bitnet"}, None, Falcon())

    class BitNetOther:
        model_type = "bitnet"
        architectures = ["BitNetForSequenceClassification"]

    with pytest.raises(TernaryConfigError, match=r"architectures=\['BitNetForSequenceClassification'\]"
                       r".*bitnet: \['BitNetForCausalLM'\]"):
        registered.override_quantization_method({"quant_method": "bitnet"}, None, BitNetOther())
    with pytest.raises(TernaryConfigError, match="quant_method='awq'"):
        registered.from_config({"quant_method": "awq"})


def _init_single_rank():
    """vLLM's layers ask the tensor-parallel group for their rank: one gloo rank."""
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    import os

    from ternary.tools.engine import free_port

    os.environ.setdefault("VLLM_DIST_IDENT", f"ternary-test-{os.getpid()}")
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                    distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    ps.ensure_model_parallel_initialized(1, 1)


def test_get_quant_method_skips_and_lm_head(registered):
    from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod

    from ternary.vllm.linear import TernaryLinearMethod

    try:
        from vllm.config import VllmConfig, set_current_vllm_config
        ctx = set_current_vllm_config(VllmConfig())
    except ImportError:
        import contextlib
        ctx = contextlib.nullcontext()
    with ctx:
        _init_single_rank()
        cfg = registered(QuantSpec("ternary", "channel", None, ("mlp.down_proj",)))
        kept = ReplicatedLinear(8, 8, bias=False, quant_config=cfg, prefix="model.layers.0.mlp.down_proj")
        quant = ReplicatedLinear(8, 8, bias=False, quant_config=cfg, prefix="model.layers.0.mlp.up_proj")
    assert isinstance(kept.quant_method, UnquantizedLinearMethod)
    assert isinstance(quant.quant_method, TernaryLinearMethod)
    assert cfg.get_quant_method(torch.nn.Embedding(4, 4), "lm_head") is None


def _copy_loader(param, loaded, shard_id=None):
    param.data.copy_(loaded)


@pytest.mark.parametrize("scale", ["channel", "tensor", "group"])
def test_create_weights_and_apply(scale):
    from ternary.vllm.linear import TernaryLinearMethod

    n, k, gs = 8, 64, 16
    spec = QuantSpec("ternary", scale, gs if scale == "group" else None, ())
    layer = torch.nn.Module()
    layer.output_size, layer.prefix = n, "model.layers.0.mlp.up_proj"
    method = TernaryLinearMethod(spec)
    method.create_weights(layer, k, [n], k, n, torch.float32, weight_loader=_copy_loader)
    assert layer.weight.dtype == torch.uint8 and list(layer.weight.shape) == [n, k // 4]
    assert (layer.weight.input_dim, layer.weight.output_dim, layer.weight.packed_dim) == (1, 0, 1)
    assert layer.weight.pack_factor == layer.weight.packed_factor == 4
    want_scale = [n, k // gs] if scale == "group" else [n]
    assert list(layer.weight_scale.shape) == want_scale

    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    stored = {"channel": torch.rand(n, generator=g) + 0.5, "tensor": torch.tensor([0.75]),
              "group": torch.rand(n, k // gs, generator=g) + 0.5}[scale]
    layer.weight.weight_loader(layer.weight, ops.pack(codes))
    layer.weight_scale.weight_loader(layer.weight_scale, stored)
    method.process_weights_after_loading(layer)
    x = torch.randn(5, k, generator=g)
    dense = ops.dequantize(ops.pack(codes), stored if scale != "tensor" else stored.expand(n).contiguous(),
                           gs if scale == "group" else 0)
    torch.testing.assert_close(method.apply(layer, x), x @ dense.t())


@pytest.mark.parametrize("activation", ["none", "int8_per_token"])
def test_apply_quantizes_activations_when_the_spec_says_so(activation):
    """int8_per_token: y = (x_q . codes) * scale / s_x, not x . W (the difference is what a
    BitNet model's tokens depend on)."""
    from ternary.vllm.linear import TernaryLinearMethod

    n, k = 16, 64
    layer = torch.nn.Module()
    layer.output_size, layer.prefix = n, "model.layers.0.mlp.down_proj"
    method = TernaryLinearMethod(QuantSpec("ternary", "channel", None, (), activation=activation))
    method.create_weights(layer, k, [n], k, n, torch.float32, weight_loader=_copy_loader)
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) + 0.5
    layer.weight.weight_loader(layer.weight, ops.pack(codes))
    layer.weight_scale.weight_loader(layer.weight_scale, scale)
    method.process_weights_after_loading(layer)
    x = torch.randn(7, k, generator=g)
    x[:, 3] *= 50  # an outlier channel: int8 rounding of the others is then coarse
    bias = torch.randn(n, generator=g)
    y = method.apply(layer, x, bias)
    dense = codes.double() * scale.double().view(-1, 1)
    if activation == "none":
        want = x.double() @ dense.t()
    else:
        q, s = ops.quantize_act_int8(x)
        want = (q.double() @ dense.t()) / s.double()
        assert not torch.allclose(want, x.double() @ dense.t(), rtol=1e-3)
    torch.testing.assert_close(y.double(), want + bias.double(), rtol=1e-5, atol=1e-5)


def test_online_weights_load_with_their_scale():
    """A bitnet "online" checkpoint has dense master weights and no weight_scale: the weight
    adapter quantizes it (WeightQuant) and fills the scale itself."""
    from ternary.vllm.linear import TernaryLinearMethod

    n, k = 8, 32
    layer = torch.nn.Module()
    layer.output_size, layer.prefix = n, "model.layers.0.self_attn.o_proj"
    spec = QuantSpec("bitnet", "tensor", None, (), "autobitlinear", activation="int8_per_token",
                     online=True)
    method = TernaryLinearMethod(spec)
    method.create_weights(layer, k, [n], k, n, torch.float32, weight_loader=_copy_loader)
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(2)) * 0.03
    layer.weight.weight_loader(layer.weight, w)
    codes, s = bitnet.weight_quant(w)
    assert torch.equal(layer.weight.data, ops.pack(codes))
    assert torch.equal(layer.weight_scale.data, s.expand(n))


def test_loaders_refuse_a_checkpoint_tensor_of_another_size():
    """vLLM's loaders narrow a tensor to the rank's part: one of the wrong size would load
    cut to fit (or fail inside vLLM). The adapters check it against the whole layer."""
    from ternary.vllm.linear import TernaryLinearMethod, _logical_rows

    n, k = 8, 128
    layer = torch.nn.Module()
    layer.output_size, layer.prefix = n, "model.layers.0.self_attn.o_proj"
    method = TernaryLinearMethod(QuantSpec("ternary", "group", 32, ()))
    method.create_weights(layer, k, [n], k, n, torch.float32, weight_loader=_copy_loader)
    with pytest.raises(TernaryConfigError, match=r"model.layers.0.self_attn.o_proj.weight: the "
                                                 r"checkpoint weight is \[8, 33\]"):
        layer.weight.weight_loader(layer.weight, torch.zeros(n, k // 4 + 1, dtype=torch.uint8))
    with pytest.raises(TernaryConfigError, match=r"o_proj.weight_scale: .*=\[8, 4\] .* got "
                                                 r"\[8, 8\]"):
        layer.weight_scale.weight_loader(layer.weight_scale, torch.ones(n, 8))
    # merged outputs stored as one tensor (a tuple shard id) count all their rows
    merged = torch.nn.Module()
    merged.output_sizes = [16, 16, 8]
    assert _logical_rows(merged, (0, 1)) == 32 and _logical_rows(merged, 2) == 8


def test_a_weight_never_loaded_is_refused_naming_the_layer():
    """An uninitialised packed weight (vLLM's load_format=dummy leaves integer weights as
    allocated) or a NaN scale is refused at load, naming the layer, not served as noise."""
    from ternary.vllm.linear import TernaryLinearMethod

    n, k = 8, 64
    layer = torch.nn.Module()
    layer.output_size, layer.prefix = n, "model.layers.3.mlp.up_proj"
    method = TernaryLinearMethod(QuantSpec("ternary", "channel", None, ()))
    method.create_weights(layer, k, [n], k, n, torch.float32, weight_loader=_copy_loader)
    layer.weight.data.fill_(0xFF)  # what an allocation may hold: code 3 everywhere
    layer.weight_scale.data.fill_(1.0)
    with pytest.raises(ValueError, match=r"model.layers.3.mlp.up_proj: packed \[8, 16\] holds "
                                         r"code 3 .* load_format=dummy"):
        method.process_weights_after_loading(layer)
    layer.weight.data.fill_(0x55)  # all zeros
    layer.weight_scale.data[2] = float("nan")
    with pytest.raises(ValueError, match=r"model.layers.3.mlp.up_proj: scale \[8\]: 1 of 8 scale "
                                         r"values are NaN"):
        method.process_weights_after_loading(layer)


def test_canonical_copy_is_freed_when_the_kernel_keeps_its_own_layout(monkeypatch):
    """A kernel whose prepared weight holds no canonical copy (the fused kernel) leaves the
    layer no loaded weight bytes; one that reads the canonical copy (reference) keeps it."""
    from ternary import kernels
    from ternary.vllm import linear

    class OwnLayout(kernels.ReferenceKernel):  # stands in for the fused kernel on CPU
        name = "own-layout"

        def prepare(self, packed, scale, group_size):
            p = super().prepare(packed, scale, group_size)
            p.repacked = packed.clone()  # "its own layout"
            p.packed = None
            return p

        def apply(self, x, prepared, bias=None):
            prepared.packed = prepared.repacked
            try:
                return super().apply(x, prepared, bias)
            finally:
                prepared.packed = None

    n, k = 8, 64
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) + 0.5
    x = torch.randn(3, k, generator=g)
    for kernel, kept in ((OwnLayout(), 0), (kernels.ReferenceKernel(), n * k // 4)):
        monkeypatch.setattr(linear, "choose_kernel", lambda layer, gs, kernel=kernel: kernel)
        layer = torch.nn.Module()
        layer.output_size, layer.prefix = n, "model.layers.0.mlp.up_proj"
        method = linear.TernaryLinearMethod(QuantSpec("ternary", "channel", None, ()))
        method.create_weights(layer, k, [n], k, n, torch.float32, weight_loader=_copy_loader)
        layer.weight.weight_loader(layer.weight, ops.pack(codes))
        layer.weight_scale.weight_loader(layer.weight_scale, scale)
        method.process_weights_after_loading(layer)
        assert layer.weight.numel() == kept, kernel.name
        torch.testing.assert_close(method.apply(layer, x),
                                   x @ ops.dequantize(ops.pack(codes), scale, 0).t())


def test_dense_checkpoint_weight_is_refused():
    from ternary.vllm.linear import TernaryLinearMethod

    layer = torch.nn.Module()
    layer.output_size, layer.prefix = 8, "model.layers.0.mlp.up_proj"
    TernaryLinearMethod(QuantSpec("ternary", "channel", None, ())).create_weights(
        layer, 16, [8], 16, 8, torch.float32, weight_loader=_copy_loader)
    with pytest.raises(TernaryConfigError, match=r"model.layers.0.mlp.up_proj.weight: .*uint8.*float32"):
        layer.weight.weight_loader(layer.weight, torch.zeros(8, 16))


def test_k_not_multiple_of_4_is_refused_before_loading():
    from ternary.vllm.linear import TernaryLinearMethod

    layer = torch.nn.Module()
    layer.prefix = "model.layers.0.mlp.down_proj"
    with pytest.raises(TernaryConfigError, match=r"down_proj: K per rank = 6 \(K=12, tensor parallel 2\)"):
        TernaryLinearMethod(QuantSpec("ternary", "channel", None, ())).create_weights(
            layer, 6, [8], 12, 8, torch.float32, weight_loader=_copy_loader)


@pytest.mark.parametrize("fmt", ["ternary", "bitnet"])
def test_model_config_resolves_to_ternary(registered, tmp_path, fmt, monkeypatch):
    """vLLM's own config resolution picks the method: quant_method "ternary" directly, a
    Llama bitnet checkpoint through override_quantization_method."""
    pytest.importorskip("tokenizers", reason="make-tiny trains its tokenizer with `tokenizers`")
    from vllm.engine.arg_utils import EngineArgs

    from ternary.tools.synthetic import tiny

    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    model = tiny.make(tmp_path, fmt)
    assert EngineArgs(model=str(model), dtype="float32").create_model_config().quantization == "ternary"


def test_serve_without_vllm_says_what_to_install(monkeypatch, capsys):
    import sys

    from ternary.cli import main as cli

    monkeypatch.setitem(sys.modules, "ternary.vllm.register", None)  # import fails
    # the check runs in the supervised child (ternary.tools.supervise): be that child here
    monkeypatch.setenv("TERNARY_SERVE_CHILD", "1")
    assert cli(["serve", "some-model", "--port", "1"]) == 2
    assert "vLLM is not importable" in capsys.readouterr().err


def test_kernel_choice_is_logged_once_per_shape_in_the_smokes_format(tmp_path):
    import logging
    import types

    from ternary import kernels
    from ternary.tools import smoke
    from ternary.vllm import linear

    layer = types.SimpleNamespace(weight=torch.zeros(48, 40, dtype=torch.uint8),
                                  params_dtype=torch.bfloat16)
    log = tmp_path / "server.log"
    handler = logging.FileHandler(log)
    logger = logging.getLogger("vllm.ternary")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        linear._announced.clear()
        for _ in range(3):  # every layer of a model: one line per distinct shape
            linear.announce_kernel(kernels.FusedKernel(), layer, 0)
        linear.announce_kernel(kernels.CublasKernel(), layer, 64)
        linear.announce_kernel(kernels.CublasKernel(), layer, 64, "int8_per_token")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
        handler.close()
    lines = smoke.kernel_lines(log.read_text())
    assert lines == [f"fused (dequantize + cuBLAS above M={kernels.FUSED_MAX_M}) for n=48 k=160 "
                     "dtype=bfloat16 group_size=0 activation=none",
                     "cublas for n=48 k=160 dtype=bfloat16 group_size=64 activation=none",
                     "cublas for n=48 k=160 dtype=bfloat16 group_size=64 "
                     "activation=int8_per_token"]
    ok, detail = smoke.check_kernel(log, "fused")
    assert not ok and "cublas for n=48" in detail


def test_a_listed_module_stored_packed_is_refused_naming_it():
    """modules_to_not_convert keeps a layer dense; a checkpoint that stores it packed gets a
    clear error from its weight loader, not a failed copy inside vLLM."""
    from ternary.vllm.linear import SkippedLinearMethod

    layer = torch.nn.Module()
    layer.prefix = "model.layers.0.mlp.down_proj"
    method = SkippedLinearMethod()
    method.create_weights(layer, 64, [8], 64, 8, torch.float32, weight_loader=_copy_loader)
    with pytest.raises(TernaryConfigError, match=r"model.layers.0.mlp.down_proj.weight: the "
                                                 r"checkpoint stores it packed \(uint8 \[8, 16\]\)"):
        layer.weight.weight_loader(layer.weight, torch.zeros(8, 16, dtype=torch.uint8))
    dense = torch.randn(8, 64)
    layer.weight.weight_loader(layer.weight, dense)  # a dense weight loads as before
    assert torch.equal(layer.weight.data, dense)


def test_large_m_routes_name_where_the_large_m_kernel_takes_over(monkeypatch):
    """The kernel log line says what the fused kernel does above its max_m, from the route
    it takes at each M (Hopper's large-M kernel from some M on, else dequantize + cuBLAS)."""
    from ternary import ops
    from ternary.vllm import linear

    class Fused:
        name, max_m = "fused", 128

        def __init__(self, first):
            self.first = first

        def route(self, m, n, k):
            return self.name if m <= self.max_m or m >= self.first else "fused>cublas"

    monkeypatch.delenv(ops.LARGE_M_ENV, raising=False)
    assert linear.large_m_routes(Fused(300), 48, 160) == (
        "dequantize + cuBLAS for M=129-299, its large-M kernel from M=300")
    assert linear.large_m_routes(Fused(129), 48, 160) == "its large-M kernel above M=128"
    assert linear.large_m_routes(Fused(10**9), 48, 160) == "dequantize + cuBLAS above M=128"
    monkeypatch.setenv(ops.LARGE_M_ENV, "1000")
    assert linear.large_m_routes(Fused(300), 48, 160) == (
        "dequantize + cuBLAS for M=129-299, its large-M kernel from M=300, dequantize + "
        "cuBLAS above M=1000 (TERNARY_LARGE_M_MAX)")
    monkeypatch.setenv(ops.LARGE_M_ENV, "200")
    assert linear.large_m_routes(Fused(300), 48, 160) == "dequantize + cuBLAS above M=128"
