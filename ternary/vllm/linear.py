"""TernaryLinearMethod: a vLLM linear method for ternary weights.

Lifecycle (the order vLLM calls it in):
1. create_weights: allocate `weight` uint8 [N_rank, K_rank/4] and `weight_scale` float32
   [N_rank] (or [N_rank, G_rank] for group scales) in the canonical checkpoint layout, with
   output_dim/input_dim/packed_dim attributes, so vLLM's own v1 weight loaders slice them
   for tensor parallelism (QKV, merged gate_up, row parallel). Shapes that cannot be split
   across the ranks are refused here, before any weight is read.
2. loading: a per-parameter adapter (ternary.vllm.loading) turns each checkpoint tensor
   (canonical or bitnet) into that layout, then vLLM's loader slices and copies it.
3. process_weights_after_loading: the kernel ternary.kernels chooses for the device
   repacks what it needs.
4. apply: the kernel's GEMM; for activation int8_per_token (every bitnet checkpoint), on the
   input quantized per token to int8 first, exactly as transformers' bitnet layers do
   (Kernel.apply_a8: the fused kernel's is one op, ternary::linear_a8).
"""

from __future__ import annotations

import functools
import logging

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.utils import set_weight_attrs

from ternary.vllm import loading
from ternary.vllm.spec import QuantSpec, TernaryConfigError
from ternary.vllm import KERNEL_LOG_PREFIX

PACK = 4  # 2-bit codes per byte along K
KERNEL_LOG = KERNEL_LOG_PREFIX + "%s for %s"
# under "vllm." so vLLM's own handler prints it, in its format, at its level (INFO by default)
logger = logging.getLogger("vllm.ternary")
_announced: set[tuple] = set()


def activation_dtype(layer: torch.nn.Module) -> torch.dtype:
    return getattr(layer, "params_dtype", None) or torch.get_default_dtype()


def announce_kernel(kernel, layer: torch.nn.Module, group_size: int,
                    activation: str = "none") -> None:
    """One INFO line per distinct (kernel, shape, dtype, activation mode): which kernel serves
    the layer."""
    n, k = layer.weight.shape[0], layer.weight.shape[1] * PACK
    dtype = activation_dtype(layer)
    key = (kernel.name, n, k, str(dtype), group_size, activation)
    if key in _announced:
        return
    _announced.add(key)
    route = kernel.name
    if activation == "int8_per_token" and not group_size:
        from ternary.kernels import a8_routes

        route = f"{kernel.name} (A8: {a8_routes(kernel, n, k, dtype)})"
    elif getattr(kernel, "max_m", None):
        route = f"{kernel.name} ({large_m_routes(kernel, n, k)})"
    shape = (f"n={n} k={k} dtype={str(dtype).removeprefix('torch.')} group_size={group_size} "
             f"activation={activation}")
    if layer.weight.is_cuda:
        from ternary.platform import detect_platform

        jit = detect_platform(layer.weight.device).jit_ptx
        if jit:
            shape += f" ({jit} PTX, JIT-compiled by the driver)"
    logger.info(KERNEL_LOG, route, shape)


def large_m_routes(kernel, n: int, k: int, top: int = 16384) -> str:
    """What the fused kernel does above its max_m for an n x k layer: dequantize + cuBLAS,
    or (Hopper, where that grid fills half the GPU) its large-M kernel from some M on. The
    threshold is found by bisection over kernel.route, which grows with M: more rows, more
    tiles."""
    from ternary import ops

    cap = ops.large_m_cap()  # TERNARY_LARGE_M_MAX
    top = min(top, cap) if cap else top
    above = f", dequantize + cuBLAS above M={cap} ({ops.LARGE_M_ENV})" if cap else ""
    lo = kernel.max_m + 1
    if top < lo or kernel.route(top, n, k) != kernel.name:
        return f"dequantize + cuBLAS above M={kernel.max_m}"
    hi = top  # route(hi) is the fused kernel; find the first such M
    while lo < hi:
        mid = (lo + hi) // 2
        if kernel.route(mid, n, k) == kernel.name:
            hi = mid
        else:
            lo = mid + 1
    if hi == kernel.max_m + 1:
        return f"its large-M kernel above M={kernel.max_m}{above}"
    return (f"dequantize + cuBLAS for M={kernel.max_m + 1}-{hi - 1}, its large-M kernel "
            f"from M={hi}{above}")


def choose_kernel(layer: torch.nn.Module, group_size: int):
    """The kernel ternary.kernels' policy picks for this layer on its device (honours
    TERNARY_KERNEL; one error listing every kernel's reason when none fits)."""
    from ternary import kernels
    from ternary.platform import detect_platform

    w = layer.weight
    return kernels.choose(detect_platform(w.device), n=w.shape[0], k=w.shape[1] * PACK,
                          dtype=activation_dtype(layer), group_size=group_size, device=w.device)


def _logical_rows(layer: torch.nn.Module, shard_id) -> int:
    """Full (pre tensor parallel) output size of the checkpoint tensor `shard_id` of a layer."""
    if shard_id is None:
        return layer.output_size
    if isinstance(shard_id, str):  # QKVParallelLinear: "q" | "k" | "v"
        heads = layer.total_num_heads if shard_id == "q" else layer.total_num_kv_heads
        size = getattr(layer, "v_head_size", layer.head_size) if shard_id == "v" else layer.head_size
        return heads * size
    if isinstance(shard_id, tuple):  # several merged outputs stored as one tensor
        return sum(layer.output_sizes[i] for i in shard_id)
    return layer.output_sizes[shard_id]  # MergedColumnParallelLinear: 0 | 1 | ...


def _adapt(kind: str, spec: QuantSpec, layer: torch.nn.Module, vllm_loader):
    """A weight_loader that converts one checkpoint tensor, then calls vLLM's loader."""

    @functools.wraps(vllm_loader)
    def load(param, loaded_weight, loaded_shard_id=None, *args, **kwargs):
        n = _logical_rows(layer, loaded_shard_id)
        k = layer.ternary_k  # the whole K, before tensor parallel (create_weights)
        name = f"{getattr(layer, 'prefix', '') or type(layer).__name__}.{kind}"
        if loaded_shard_id is not None:
            name += f" (shard {loaded_shard_id!r})"
        def inner(p, w):
            if loaded_shard_id is None:
                return vllm_loader(p, w, *args, **kwargs)
            return vllm_loader(p, w, loaded_shard_id, *args, **kwargs)

        if kind == "weight" and spec.online:
            # dense master weights: quantized here, per checkpoint tensor (per shard of a fused
            # layer, before tensor parallel slicing), as transformers' WeightQuant does them
            packed, scale = loading.online_to_canonical(loaded_weight, n, k, name)
            inner(layer.weight_scale, scale)
            return inner(param, packed)
        if kind == "weight":
            if spec.format == "bitnet":
                loaded_weight = loading.bitnet_to_canonical(loaded_weight, n, name, k)
            else:
                loading.check_weight(loaded_weight, n, k, name)
        else:
            loaded_weight = loading.per_channel_scale(loaded_weight, n, spec, name, k)
        return inner(param, loaded_weight)

    return load


class TernaryLinearMethod(LinearMethodBase):
    """Linear layers with {-1, 0, +1} weights times a float32 scale."""

    def __init__(self, spec: QuantSpec):
        self.spec = spec

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        where = getattr(layer, "prefix", "") or type(layer).__name__
        k = input_size_per_partition
        tp = max(1, input_size // k)
        if k % PACK:
            fix = (f"Use a tensor_parallel_size that splits K into multiples of {PACK}"
                   if k != input_size else "List it in modules_to_not_convert and store it "
                   "dense (ternary convert --not-convert)")
            raise TernaryConfigError(
                f"{where}: K per rank = {k} (K={input_size}, tensor parallel {tp}) is not a "
                f"multiple of {PACK}; ternary weights pack {PACK} codes per byte along K. {fix}"
            )
        gs = self.spec.kernel_group_size
        if gs and k != input_size and k % gs:
            raise TernaryConfigError(
                f"{where}: K per rank = {k} (K={input_size}, tensor parallel {tp}) is not a "
                f"multiple of group_size={gs}, so scale groups would straddle ranks. Use a "
                f"tensor_parallel_size that splits K into whole groups"
            )
        vllm_loader = extra_weight_attrs.pop("weight_loader")
        n = sum(output_partition_sizes)
        layer.ternary_k = input_size  # what a checkpoint tensor's K must be (_adapt)

        weight = Parameter(torch.empty(n, k // PACK, dtype=torch.uint8), requires_grad=False)
        # packed_dim != output_dim: vLLM's loaders keep shard offsets in rows and slice the
        # input dim in bytes; both pack_factor (<=0.6) and packed_factor (newer) are read.
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0, "packed_dim": 1,
                                  "pack_factor": PACK, "packed_factor": PACK,
                                  "weight_loader": _adapt("weight", self.spec, layer, vllm_loader)})
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)

        scale_attrs = {"output_dim": 0,
                       "weight_loader": _adapt("weight_scale", self.spec, layer, vllm_loader)}
        if gs:
            scale = torch.empty(n, -(-k // gs), dtype=torch.float32)
            scale_attrs["input_dim"] = 1
        else:
            scale = torch.empty(n, dtype=torch.float32)
        weight_scale = Parameter(scale, requires_grad=False)
        set_weight_attrs(weight_scale, scale_attrs)
        layer.register_parameter("weight_scale", weight_scale)
        set_weight_attrs(weight_scale, extra_weight_attrs)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        gs = self.spec.kernel_group_size
        kernel = choose_kernel(layer, gs)
        announce_kernel(kernel, layer, gs, self.spec.activation)
        layer.ternary_kernel = kernel
        try:
            prepared = kernel.prepare(layer.weight.data, layer.weight_scale.data, gs)
        except ValueError as e:  # (a NaN scale, a code 3: name the layer it is in)
            where = getattr(layer, "prefix", "") or type(layer).__name__
            raise ValueError(f"{where}: {e}") from None
        layer.ternary_prepared = prepared
        if prepared.packed is None:
            # The kernel reads only its own layout (the fused kernel: 2 bits a weight); the
            # loaded canonical copy would otherwise stay on the GPU beside it (the H200
            # bench-serve measured 3.54 GiB for Llama-2-7B with it, bf16 12.55).
            layer.weight = Parameter(torch.empty(0, dtype=torch.uint8, device=layer.weight.device),
                                     requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        kernel, prepared = layer.ternary_kernel, layer.ternary_prepared
        if self.spec.activation == "int8_per_token":
            return kernel.apply_a8(x, prepared, bias, amax=split_row_amax(layer, x))
        return kernel.apply(x, prepared, bias)


def split_row_amax(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """Each token's max |x| over the whole row where tensor parallelism gives this rank only a
    slice of it (a row-parallel layer: o_proj, down_proj), else None. A token's int8 scale
    comes from its whole input row, at TP=1 and in transformers; from the slice, TP=2 gave
    other tokens (o_proj off by 2.1 on make-tiny's bitnet model, gloo)."""
    from vllm.model_executor.layers.linear import RowParallelLinear

    if not (isinstance(layer, RowParallelLinear) and getattr(layer, "tp_size", 1) > 1
            and getattr(layer, "input_is_parallel", True)):
        return None
    from vllm.distributed import tensor_model_parallel_all_gather

    local = x.abs().amax(-1, keepdim=True).to(torch.float32)
    return tensor_model_parallel_all_gather(local, dim=-1).amax(-1, keepdim=True)


class SkippedLinearMethod(UnquantizedLinearMethod):
    """A layer modules_to_not_convert keeps dense. A checkpoint that stores it packed anyway
    would otherwise fail inside vLLM's loader (a uint8 tensor copied into a float weight):
    this says which layer and what to change."""

    def create_weights(self, layer: torch.nn.Module, *args, **kwargs):
        super().create_weights(layer, *args, **kwargs)
        inner = layer.weight.weight_loader
        where = getattr(layer, "prefix", "") or type(layer).__name__

        @functools.wraps(inner)
        def load(param, loaded_weight, *a, **kw):
            if loaded_weight.dtype == torch.uint8:
                raise TernaryConfigError(
                    f"{where}.weight: the checkpoint stores it packed (uint8 "
                    f"{list(loaded_weight.shape)}) but quantization_config."
                    "modules_to_not_convert lists it, so it is served dense. Remove it from "
                    "modules_to_not_convert, or store it dense (ternary convert --not-convert)"
                )
            return inner(param, loaded_weight, *a, **kw)

        layer.weight.weight_loader = load
