"""quantize(): absmean per output channel, against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from ternary.formats import quantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_matches_float64_reference(ref, dtype):
    w = (torch.randn(37, 64, generator=torch.Generator().manual_seed(1)) * 0.03).to(dtype)
    w[5] = 0  # an all-zero row
    codes, scale = quantize(w)
    want_codes, want_scale = ref.absmean(w.float().numpy())
    assert codes.dtype == torch.int8 and codes.shape == (37, 64)
    assert scale.dtype == torch.float32 and scale.shape == (37,)
    assert torch.equal(codes, torch.from_numpy(want_codes))
    assert torch.equal(scale, torch.from_numpy(want_scale).float())
    assert not codes[5].any() and scale[5] == 1.0 and torch.isfinite(scale).all()


def test_quantize_refuses_non_finite_and_non_matrix():
    with pytest.raises(ValueError, match=r"non-finite weight \(first at \[row, col\] = \[1, 2\]\)"):
        w = torch.ones(3, 4)
        w[1, 2] = float("nan")
        quantize(w)
    with pytest.raises(ValueError, match=r"floating-point \[N, K\] weight; got torch.int8 \[4\]"):
        quantize(torch.ones(4, dtype=torch.int8))


def test_quantize_refuses_no_columns_and_a_scale_past_float32():
    with pytest.raises(ValueError, match=r"K = 0 columns \(\[3, 0\]\)"):
        quantize(torch.zeros(3, 0))
    assert quantize(torch.zeros(0, 5))[0].shape == (0, 5)
    w = torch.ones(3, 4, dtype=torch.float64)
    w[2, 1] = 1e300
    with pytest.raises(ValueError, match=r"row 2's mean \|W\| is 2.5e\+299, past the float32"):
        quantize(w)
