"""Fixture `ref`: independent float64 reference decoders, written straight from docs/formats.md's
layouts with plain loops over numpy arrays (no code shared with ternary.formats)."""

from __future__ import annotations

import types

import numpy as np
import pytest


def canonical(packed: np.ndarray, scale: np.ndarray, group_size: int | None) -> np.ndarray:
    n, cols = packed.shape
    k = cols * 4
    out = np.zeros((n, k), dtype=np.float64)
    for row in range(n):
        for col in range(k):
            code = (int(packed[row, col // 4]) >> (2 * (col % 4))) & 3
            assert code != 3
            if group_size:
                s = scale[row, col // group_size]
            elif scale.size == 1:
                s = scale.reshape(-1)[0]
            else:
                s = scale[row]
            out[row, col] = (code - 1) * np.float64(s)
    return out


def bitnet(packed: np.ndarray, scale: float, n: int, linear_class: str) -> np.ndarray:
    rows, k = packed.shape
    out = np.zeros((n, k), dtype=np.float64)
    for logical in range(n):
        block, r = divmod(logical, rows)
        for col in range(k):
            w = ((int(packed[r, col]) >> (2 * block)) & 3) - 1
            out[logical, col] = w * scale if linear_class == "autobitlinear" else w / scale
    return out


def vendor_int8(raw: np.ndarray, scale: np.ndarray, code_map: tuple[int, int, int],
                column_width: int | None) -> np.ndarray:
    n, k = raw.shape
    out = np.zeros((n, k), dtype=np.float64)
    for row in range(n):
        for col in range(k):
            w = code_map[int(raw[row, col]) & 3]
            s = scale[row, col // column_width] if column_width else scale[row]
            out[row, col] = w * np.float64(s)
    return out


def absmean(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = weight.astype(np.float64)
    scale = np.abs(w).mean(axis=1)
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint(w / scale[:, None]), -1, 1)
    return codes.astype(np.int8), scale


@pytest.fixture
def ref():
    return types.SimpleNamespace(canonical=canonical, bitnet=bitnet, vendor_int8=vendor_int8,
                                 absmean=absmean)
