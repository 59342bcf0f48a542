"""Does the large-M route (M > 128: dequantize_repacked, then cuBLAS) get cheaper when the
dequantize goes chunk by chunk of output channels, each chunk into the same scratch so it is
still in L2 when its mm reads it? (bench/NOTES.md, first session: "chunking the dequantize so
each chunk stays in L2 for its mm" was never tried.) Times with ternary.gemm_bench's rotated
CUDA graphs, checks each chunked result against the unchunked one, and prints a table:
    python3 bench/h200/probe/l2_chunk.py [--chunks 1024 2048 ...] [--m 256 1024 4096]"""

import argparse
import sys

import torch

from ternary import gemm_bench, ops

SHAPES = ((4096, 22016), (11008, 4096), (4096, 6144), (4096, 4096), (4096, 12288))


def chunked(x, rep, scale, n, k, nc, y, out_view: bool):
    """y = x @ dequantize(rep).T, nc channels at a time (nc a multiple of 32)."""
    for c0 in range(0, n, nc):
        c1 = min(n, c0 + nc)
        w = ops.dequantize_repacked(rep[c0 // 32:(c1 + 31) // 32], scale[c0:c1], 0, c1 - c0, k,
                                    x.dtype)
        if out_view:
            torch.mm(x, w.t(), out=y[:, c0:c1])
        else:
            y[:, c0:c1] = torch.mm(x, w.t())
        del w  # before the next chunk's allocation, so every chunk gets the same block
    return y


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--m", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--shapes", type=int, nargs="+", default=None, help="K N K N ...")
    a = p.parse_args()
    shapes = SHAPES if not a.shapes else tuple(zip(a.shapes[::2], a.shapes[1::2]))
    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    dt = torch.bfloat16
    print(f"L2 {l2 / 2**20:.0f} MiB; us per call, median of 20 graph replays, weights rotated")
    head = ["K", "N", "M", "cublas", "route", "deq", "mm"] + [f"c{c}" for c in a.chunks] + \
        [f"c{c}v" for c in a.chunks]
    print(" ".join(f"{h:>8}" for h in head))
    for k, n in shapes:
        copies = gemm_bench._copies(k * n // 4, l2)
        reps, scales = [], []
        for _ in range(copies):
            codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device=dev)
            reps.append(ops.repack(ops.pack(codes)))
            scales.append(torch.rand(n, device=dev) + 0.5)
        dense = [ops.dequantize_repacked(reps[i], scales[i], 0, n, k, dt)
                 for i in range(gemm_bench._copies(2 * k * n, l2))]
        for m in a.m:
            x = torch.randn(m, k, dtype=dt, device=dev)
            ys = [torch.empty(m, n, dtype=dt, device=dev) for _ in reps]
            want = torch.mm(x, ops.dequantize_repacked(reps[0], scales[0], 0, n, k, dt).t())
            row = {
                "cublas": gemm_bench.time_rotated([lambda w=w, x=x: torch.mm(x, w.t()) for w in dense]),
                "route": gemm_bench.time_rotated(
                    [lambda r=r, s=s, x=x, n=n: ops.linear_fused(x, r, None, s, 0, n, 128)
                     for r, s in zip(reps, scales)]),
                "deq": gemm_bench.time_rotated(
                    [lambda r=r, s=s, n=n, k=k: ops.dequantize_repacked(r, s, 0, n, k, dt)
                     for r, s in zip(reps, scales)]),
                "mm": None,
            }
            row["mm"] = row["route"] - row["deq"]
            for view in (False, True):
                for nc in a.chunks:
                    got = chunked(x, reps[0], scales[0], n, k, nc, ys[0], view)
                    err = (got.float() - want.float()).abs().max().item()
                    if err != 0:
                        print(f"  chunk {nc} view={view}: max |diff| {err} against unchunked")
                    row[f"c{nc}{'v' if view else ''}"] = gemm_bench.time_rotated(
                        [lambda r=r, s=s, y=y, a=(x, n, k, nc, view):
                         chunked(a[0], r, s, a[1], a[2], a[3], y, a[4])
                         for r, s, y in zip(reps, scales, ys)])
            print(" ".join(f"{v:>8}" for v in (k, n, m)) + " " +
                  " ".join(f"{row[h]:8.1f}" for h in head[3:]), flush=True)
            del ys
        del reps, scales, dense
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
