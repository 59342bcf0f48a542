"""`ternary tp-kernels`: the fused kernel between all-reduces on N GPUs (ternary.tools.tp_kernels)."""

from __future__ import annotations


def add_arguments(p) -> None:
    from ternary.tools import tp_kernels

    tp_kernels.add_arguments(p)


def run(args) -> int:
    from ternary.tools import tp_kernels

    return tp_kernels.run_cli(args)
