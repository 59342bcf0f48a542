"""Why does `ternary bench` time the policy's call ("auto") 5-11 % slower than the fused kernel
("fused") at M = 1024 (4096 x 12288: 155.6 against 138.9 us), when both reach the same
gemm_fused_cuda with the same weights and x? Times the two, and cuBLAS bf16, alternately with
ternary.gemm_bench's rotated CUDA graphs, so an order or clock effect shows as a drift:
    python3 bench/h200/probe/order.py [--m 1024] [--rounds 3]"""

import argparse
import sys

import torch
from rich.console import Console
from rich.table import Table

from ternary import gemm_bench, kernels, ops

SHAPES = ((4096, 12288), (4096, 22016), (4096, 4096))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, nargs="+", default=[1024])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    fused = kernels.FusedKernel()
    table = Table(title="fused vs auto vs cuBLAS, alternating (us)")
    for col in ("K x N", "M", "round", "fused", "auto", "cuBLAS", "auto - fused"):
        table.add_column(col, justify="right")
    for k, n in SHAPES:
        copies = gemm_bench._copies(k * n // 4, l2)
        packed = [ops.pack(torch.randint(-1, 2, (n, k), dtype=torch.int8, device=dev))
                  for _ in range(copies)]
        scales = [torch.rand(n, device=dev) + 0.5 for _ in range(copies)]
        prepared = [fused.prepare(q, s, 0) for q, s in zip(packed, scales)]
        dense = [ops.dequantize(packed[i], scales[i], 0, torch.bfloat16)
                 for i in range(gemm_bench._copies(2 * k * n, l2))]
        for m in a.m:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            choice = kernels.choose(kernels.detect_platform(), m=m, n=n, k=k,
                                    dtype=torch.bfloat16, group_size=0, device=dev)
            calls = {
                "fused": [lambda q=q, x=x, n=n: ops.gemm_fused(x, q.repacked, q.scale, 0, n)
                          for q in prepared],
                "auto": [lambda q=q, x=x, c=choice: c.apply(x, q, None) for q in prepared],
                "cublas": [lambda w=w, x=x: torch.mm(x, w.t()) for w in dense],
            }
            ref = ops.gemm_fused(x, prepared[0].repacked, prepared[0].scale, 0, n)
            if not torch.equal(ref, choice.apply(x, prepared[0], None)):
                print(f"{k}x{n} M={m}: auto and fused differ", file=sys.stderr)
                return 1
            for r in range(a.rounds):
                t = {name: gemm_bench.time_rotated(c) for name, c in calls.items()}
                table.add_row(f"{k} x {n}", str(m), str(r), f"{t['fused']:.1f}",
                              f"{t['auto']:.1f}", f"{t['cublas']:.1f}",
                              f"{t['auto'] - t['fused']:+.1f}")
        del packed, prepared, dense
        torch.cuda.empty_cache()
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
