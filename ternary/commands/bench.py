"""`ternary bench`: times the gemm kernels against cuBLAS bf16 and gemlite (needs a GPU)."""

from __future__ import annotations


def add_arguments(p) -> None:
    from ternary.tools import gemm_bench

    gemm_bench.add_arguments(p)


def run(args) -> int:
    from ternary.tools import gemm_bench

    return gemm_bench.run_cli(args)
