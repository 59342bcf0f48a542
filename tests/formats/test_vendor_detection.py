"""The vendor-int8 detectors on their own: code map from code counts, group size from the
scale columns."""

from __future__ import annotations

import pytest
import torch

from ternary.formats.vendor_int8 import column_width, detect_code_map, runs


@pytest.mark.parametrize("counts,want", [
    ([2500, 5000, 2500], "neg-zero-pos"),   # codes 0 and 2 balance: they are -1 and +1
    ([5000, 2500, 2500], "zero-pos-neg"),   # codes 1 and 2 balance
    ([3333, 3333, 3334], None),             # all equal: either map fits
    ([3000, 3000, 4000], None),             # neither pair balances
    ([0, 0, 0], None),
    # Gaussian weights under absmean: 31 % zeros, 34.5 % each sign. 100,000 codes decide,
    # 10,000 do not (6 sigma of a count difference is 600 there, the gap 350).
    ([31000, 34500, 34500], "zero-pos-neg"),
    ([3100, 3450, 3450], None),
])
def test_detect_code_map(counts, want):
    got, evidence = detect_code_map(counts)
    assert got == want
    assert f"0:{counts[0]} 1:{counts[1]} 2:{counts[2]}" in evidence


def test_column_width():
    assert column_width(64, 4, 16) == (16, "4 scale columns fit the stated group_size 16")
    assert column_width(64, 4, 32)[0] == 16  # stated 32 would need 2 columns
    assert column_width(64, 4, None)[0] == 16
    # a divisor is the reading, but not the only one the columns allow: said, not silent
    assert column_width(60, 3, 128) == (20, "stated group_size 128 would need 1 columns, K=60 / "
                                        "3 columns = 20 (group sizes 20-29 also make 3 columns: "
                                        "pass --group-size if the model used another)")
    assert column_width(64, 2, None)[1] == "no group_size stated, K=64 / 2 columns = 32 (group " \
        "sizes 32-63 also make 2 columns: pass --group-size if the model used another)"
    assert column_width(10, 3, None) == (4, "no group_size stated, only group size 4 gives 3 "
                                         "columns")
    width, why = column_width(32, 3, None)
    assert width is None and "fits group sizes [11, 12, 13, 14, 15]" in why


def test_runs():
    a, b, c = 1.0, 2.0, 3.0
    assert runs(torch.tensor([[a, a, b, b, c, c], [c, c, c, c, a, a]])) == 2
    assert runs(torch.tensor([[a, a, a, b, b, b]])) == 3
    assert runs(torch.tensor([[a, a, a, a, b]])) == 4      # partial last block
    assert runs(torch.tensor([[a, a, b, b], [a, b, b, b]])) == 1
    assert runs(torch.tensor([[a, a, a], [b, b, b]])) == 3  # per channel
