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


def bitnet_to_canonical(packed: torch.Tensor, n: int, name: str) -> torch.Tensor:
    """transformers' bitnet layout uint8 [ceil(N/4), K] (ternary.formats.bitnet) ->
    canonical uint8 [N, K/4]."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TernaryConfigError(
            f"{name}: a bitnet weight must be uint8 [ceil(N/4), K]; got {packed.dtype} "
            f"{list(packed.shape)}"
        )
    r, k = packed.shape
    if r != -(-n // 4):
        raise TernaryConfigError(
            f"{name}: bitnet weight has {r} byte rows but the model's layer has N={n} outputs "
            f"(expected ceil(N/4)={-(-n // 4)}); the checkpoint does not match config.json"
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


def per_channel_scale(loaded: torch.Tensor, n: int, spec: QuantSpec, name: str) -> torch.Tensor:
    """A checkpoint scale -> float32 [N] (channel/tensor) or as stored (group). A tensor
    scale is expanded per output channel, so that fused layers (qkv, gate_up) keep one
    scale per shard and vLLM's loaders slice it like the rows it scales."""
    s = loaded.to(torch.float32)
    if spec.scale == "group":
        return s
    if spec.scale == "tensor":
        if s.numel() != 1:
            raise TernaryConfigError(
                f"{name}: scale='tensor' needs one value, got shape {list(loaded.shape)}"
            )
        if spec.format == "bitnet":
            if float(s) == 0.0:
                raise TernaryConfigError(f"{name}: bitnet weight_scale is 0")
            if spec.bitnet_linear_class == "bitlinear":  # BitLinear divides by its scale
                s = 1.0 / s
        return s.reshape(1).expand(n).contiguous()
    if s.dim() != 1 or s.shape[0] != n:
        raise TernaryConfigError(
            f"{name}: scale='channel' needs float32 [N]={[n]}, got {list(loaded.shape)}"
        )
    return s
