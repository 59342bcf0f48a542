"""ternary/_ext.py: what it checks before it reaches ternary._C (no GPU, no extension)."""

from __future__ import annotations

import pytest

from ternary import _ext


@pytest.mark.parametrize(("args", "named"), [
    ((-1, 4096, 4096, 0, 0), "m=-1 n=4096"),
    ((1, 4096, -64, 0, 0), "k=-64"),
    ((1, 4096, 4096, -128, 0), "group_size=-128"),
    ((1, 4096, 4096, 0, -1), "device=-1"),
    ((1.5, 4096, 4096, 0, 0), "m=1.5"),
])
def test_fused_route_refuses_bad_sizes_before_the_extension(args, named):
    # the C++ check is not enough: its throw crashed the interpreter on the H200 machine
    with pytest.raises(ValueError, match=named):
        _ext.fused_route(*args)
