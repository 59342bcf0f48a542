"""Absmean ternary quantization (BitNet b1.58): per output channel, scale = mean|W| over the
row and codes = clamp(round(W / scale), -1, 1).

Computed in float64 so the result does not depend on float32 summation order; the scale is
then stored as float32. An all-zero row has mean|W| = 0 and W / 0 is NaN: such a row (or one
whose mean|W| underflows to 0 in float32) gets codes 0 and scale 1.0, which dequantizes to
exactly the zero row and stays a valid checkpoint (a zero scale is rejected as malformed by
every reader here).
"""

from __future__ import annotations

import torch

ZERO_ROW_SCALE = 1.0


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense weight [N, K] -> (codes int8 [N, K] in {-1, 0, 1}, scale float32 [N])."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"quantize() takes a floating-point [N, K] weight; got "
                         f"{weight.dtype} {list(weight.shape)}")
    if weight.shape[1] == 0:
        raise ValueError(f"quantize() got a weight with K = 0 columns ({list(weight.shape)}); "
                         "a linear layer needs at least one input feature")
    w = weight.detach().to(torch.float64)
    scale = w.abs().mean(dim=1)
    # a float64 mean of |float32| cannot overflow, so a non-finite mean means a NaN/inf input
    if not torch.isfinite(scale).all():
        bad = (~torch.isfinite(w)).nonzero()[0].tolist()
        raise ValueError(f"quantize() got a non-finite weight (first at [row, col] = {bad}); "
                         "fix the source checkpoint")
    big = scale > torch.finfo(torch.float32).max  # a float64 weight past float32's range
    if big.any():
        row = int(big.nonzero()[0])
        raise ValueError(f"quantize(): row {row}'s mean |W| is {float(scale[row]):.3g}, past the "
                         "float32 range of a stored scale; rescale the weight")
    zero = scale.to(torch.float32) == 0
    scale = torch.where(zero, torch.full_like(scale, ZERO_ROW_SCALE), scale)
    codes = torch.round(w / scale[:, None]).clamp_(-1, 1)
    codes[zero] = 0
    codes = codes.to(torch.int8)
    return codes, scale.to(torch.float32)
