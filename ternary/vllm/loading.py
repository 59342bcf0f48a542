"""Checkpoint tensors -> the layout TernaryLinearMethod allocates, one shard at a time.

vLLM's own weight loaders do the tensor-parallel slicing; these adapters run just before
them and turn what a checkpoint holds for one logical weight (q_proj, gate_proj, ...) into
the canonical per-shard layout those loaders can slice:
- weight: uint8 [N, K/4], packed along K, so slicing rows (column parallel) or byte columns
  (row parallel) is plain narrowing;
- scale: float32 [N] (one value per output channel, a tensor scale expanded) or
  [N, ceil(K/group_size)], so it is sliced together with its rows.
No vLLM import: the adapters are tested without it.
"""

from __future__ import annotations

import torch

from ternary import ops
from ternary.formats import bitnet
from ternary.vllm.spec import QuantSpec, TernaryConfigError

# torch dtype -> safetensors dtype name, for the format readers' dtype rules
_ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def check_weight(packed: torch.Tensor, n: int, k: int, name: str) -> None:
    """A canonical checkpoint weight is uint8 [N, K/4] for the layer's whole (pre tensor
    parallel) N and K: vLLM's loaders narrow what they get to the rank's part, so a
    tensor of the wrong size would otherwise load cut to fit, or fail inside them."""
    if packed.dtype != torch.uint8:
        raise TernaryConfigError(
            f"{name}: a ternary weight must be uint8 [N, K/4]; got {packed.dtype} "
            f"{list(packed.shape)} (a dense checkpoint? convert it with `ternary convert`, or "
            "list the module in modules_to_not_convert if it is meant to stay dense)"
        )
    if list(packed.shape) != [n, k // 4]:
        raise TernaryConfigError(
            f"{name}: the checkpoint weight is {list(packed.shape)} but the model's layer "
            f"(config.json) is N={n}, K={k}, i.e. uint8 [N, K/4]={[n, k // 4]}; the "
            "checkpoint does not match config.json"
        )


def bitnet_to_canonical(packed: torch.Tensor, n: int, name: str, k: int | None = None
                        ) -> torch.Tensor:
    """transformers' bitnet layout uint8 [ceil(N/4), K] (ternary.formats.bitnet) ->
    canonical uint8 [N, K/4]; k: the layer's K, when known, which the tensor must match."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TernaryConfigError(
            f"{name}: a bitnet weight must be uint8 [ceil(N/4), K]; got {packed.dtype} "
            f"{list(packed.shape)}"
        )
    k_want = k
    r, k = packed.shape
    if r != -(-n // 4):
        raise TernaryConfigError(
            f"{name}: bitnet weight has {r} byte rows but the model's layer has N={n} outputs "
            f"(expected ceil(N/4)={-(-n // 4)}); the checkpoint does not match config.json"
        )
    if k_want is not None and k != k_want:
        raise TernaryConfigError(
            f"{name}: bitnet weight has K={k} inputs but the model's layer has K={k_want} "
            "(config.json); the checkpoint does not match config.json"
        )
    if k % 4:
        raise TernaryConfigError(
            f"{name}: K={k} inputs is not a multiple of 4; the canonical layout packs four "
            f"codes per byte along K, so this layer cannot be served quantized (add it to "
            f"modules_to_not_convert and store it dense)"
        )
    fields = bitnet.unpack_rows(packed, n)
    if bool((fields == 3).any()):
        row = int((fields == 3).any(dim=1).nonzero()[0])
        raise TernaryConfigError(
            f"{name}: invalid 2-bit code 3 (only 0, 1, 2 encode -1, 0, +1), first in logical "
            f"row {row}; the file is corrupt or not bitnet-packed"
        )
    return ops.pack(fields.to(torch.int8) - 1)


def online_to_canonical(dense: torch.Tensor, n: int, k: int, name: str
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """A bitnet "online" checkpoint's dense master weight [N, K] -> (canonical uint8 [N, K/4],
    float32 [N] scale), quantized exactly as transformers' WeightQuant does in each forward
    (ternary.formats.bitnet.weight_quant: per tensor, absmean)."""
    if not dense.is_floating_point() or list(dense.shape) != [n, k]:
        raise TernaryConfigError(
            f"{name}: a bitnet checkpoint with quantization_mode 'online' stores dense float "
            f"weights [N, K]={[n, k]} (config.json); got {dense.dtype} {list(dense.shape)}. "
            "Packed (uint8) weights need quantization_mode 'offline'")
    if k % 4:
        raise TernaryConfigError(
            f"{name}: K={k} inputs is not a multiple of 4; the canonical layout packs four "
            "codes per byte along K (add it to modules_to_not_convert)")
    codes, scale = bitnet.weight_quant(dense)
    why = ops.bad_scale_values(scale)
    if why:
        raise TernaryConfigError(f"{name}: {why}")
    return ops.pack(codes), scale.expand(n).contiguous()


def per_channel_scale(loaded: torch.Tensor, n: int, spec: QuantSpec, name: str,
                      k: int | None = None) -> torch.Tensor:
    """A checkpoint scale -> float32 [N] (channel/tensor) or as stored (group). A tensor
    scale is expanded per output channel, so that fused layers (qkv, gate_up) keep one
    scale per shard and vLLM's loaders slice it like the rows it scales. k: the layer's
    whole K, which a group scale's columns must fit. The dtypes and values are the format
    reader's (ternary.formats), so both accept the same checkpoints."""
    allowed = bitnet.SCALE_DTYPES if spec.format == "bitnet" else ("F32",)
    if _ST_DTYPE.get(loaded.dtype) not in allowed:
        raise TernaryConfigError(f"{name}: wrong dtype {loaded.dtype} {list(loaded.shape)} for a "
                                 f"{spec.format} scale; expected {' or '.join(allowed)}")
    s = loaded.to(torch.float32)
    why = ops.bad_scale_values(s)
    if why:
        raise TernaryConfigError(f"{name}: {why}")
    if spec.scale == "group":
        groups = -(-k // spec.group_size) if k is not None else None
        if s.dim() != 2 or s.shape[0] != n or (groups is not None and s.shape[1] != groups):
            raise TernaryConfigError(
                f"{name}: scale='group' with group_size={spec.group_size} needs float32 "
                f"[N, ceil(K/group_size)]={[n, groups]} for the layer's N={n}, K={k}; got "
                f"{list(loaded.shape)}"
            )
        return s
    if spec.scale == "tensor":
        if s.numel() != 1:
            raise TernaryConfigError(
                f"{name}: scale='tensor' needs one value, got shape {list(loaded.shape)}"
            )
        if spec.format == "bitnet" and spec.bitnet_linear_class == "bitlinear":
            s = 1.0 / s  # BitLinear divides by its scale
        return s.reshape(1).expand(n).contiguous()
    if s.dim() != 1 or s.shape[0] != n:
        raise TernaryConfigError(
            f"{name}: scale='channel' needs float32 [N]={[n]}, got {list(loaded.shape)}"
        )
    return s
