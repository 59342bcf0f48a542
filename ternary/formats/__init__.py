"""Ternary checkpoint formats: the canonical `ternary` v1 format, Hugging Face `bitnet`,
`vendor-int8` and plain `dense` checkpoints; reading (lazily, module by module), checking,
quantizing and converting them. docs/formats.md fixes the layouts.

    dequantize(model_dir, module) -> float32 [N, K], as the checkpoint defines it
    quantize(weight) -> (codes int8 [N, K], scale float32 [N]), absmean per channel
    Checkpoint(model_dir) / iter_modules(model_dir): canonical modules, one at a time
"""

from __future__ import annotations

import os

import torch

from ternary.formats.absmean import quantize
from ternary.formats.errors import FormatError, Problem
from ternary.formats.module import TernaryModule
from ternary.formats.reader import FORMATS, Checkpoint, detect, iter_modules

__all__ = ["Checkpoint", "FORMATS", "FormatError", "Problem", "TernaryModule", "dequantize",
           "detect", "iter_modules", "quantize"]


def dequantize(model_dir: str | os.PathLike, module: str, **overrides) -> torch.Tensor:
    """float32 [N, K] of `module` (with or without `.weight`), in any supported format.
    vendor-int8 overrides: code_map=..., group_size=... Each call opens the checkpoint, and a
    vendor-int8 one reads every weight to settle its code map: for many modules, open one
    `Checkpoint(model_dir)` and call its `dequantize` instead."""
    with Checkpoint(model_dir, **overrides) as ckpt:
        return ckpt.dequantize(module)
