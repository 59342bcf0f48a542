"""`ternary kernel-soak`: linear_fused launched over and over, hangs named (ternary.tools.kernel_soak)."""

from __future__ import annotations


def add_arguments(p) -> None:
    from ternary.tools import kernel_soak

    kernel_soak.add_arguments(p)


def run(args) -> int:
    from ternary.tools import kernel_soak

    return kernel_soak.run_cli(args)
