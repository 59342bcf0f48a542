"""A workload for Nsight Compute: a few launches of ternary::gemm_fused on one shape, for
reading a kernel's stall reasons and memory throughput (ncu --launch-skip/--launch-count pick
the launches). Usage: python3 bench/ncu_workload.py --k 4096 --n 22016 --m 1 16 64"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ternary import ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--n", type=int, default=22016)
    p.add_argument("--m", type=int, nargs="+", default=[1])
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    codes = torch.randint(-1, 2, (a.n, a.k), dtype=torch.int8, device="cuda")
    repacked = ops.repack(ops.pack(codes))
    scale = torch.rand(a.n, device="cuda") + 0.5
    for m in a.m:
        x = torch.randn(m, a.k, dtype=torch.bfloat16, device="cuda")
        for _ in range(a.reps):
            ops.gemm_fused(x, repacked, scale, 0, a.n, None)
    torch.cuda.synchronize()
    print("ncu workload done", a)


if __name__ == "__main__":
    main()
