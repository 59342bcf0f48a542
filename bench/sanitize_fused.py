"""A small workload for compute-sanitizer (memcheck, racecheck): every fused-kernel template
instance the dispatcher can pick (M tiers, group and channel scales, both dtypes), on shapes
with ragged N and K so the bounds checks are exercised; then the int8 path (quantize_act_int8
and gemm_a8, every output dtype, ragged tiles), and linear_a8 on each of its routes. Exits non-zero on a wrong result.

Imports the installed ternary (run it with -P), or the checkout's on PYTHONPATH."""

import sys

import torch

from ternary import ops

torch.manual_seed(0)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
for dtype in (torch.bfloat16, torch.float16):
    for m, n, k, g in ((1, 45, 196, 0), (8, 45, 196, 0), (3, 40, 8192, 0), (16, 45, 196, 0),
                       (12, 40, 8192, 0), (5, 70, 260, 64), (16, 70, 260, 64), (20, 33, 132, 0),
                       (40, 65, 516, 128),
                       (70, 31, 64, 0),
                       # M <= 8 with x staged in shared memory, K of 13 tiles (warps of
                       # unequal steps); M 9-16 past a wave: two n tiles a warp step, odd
                       # last tile
                       (3, 45, 832, 0), (12, 2 * SMS * 32 + 8, 128, 0),
                       (12, 4 * SMS * 32 + 8, 128, 0),
                       # M 9-16, 2-3 one-n-tile blocks an SM: one n tile, 4 warps
                       (12, 80 * SMS + 8, 704, 0),
                       # M 9-16, 3-4 tiles an SM: two n tiles, 8 warps
                       (12, 112 * SMS + 8, 704, 0),
                       # M <= 8, 4 or more blocks an SM: two n tiles a step, odd last tile
                       (2, 4 * SMS * 32 + 8, 192, 0),
                       # M <= 8, 0.5-1.5 blocks an SM: 16 warps, 2-deep ring, x from global
                       # (K of 11 tiles: unequal warp steps); one block past the SMs
                       (5, 32 * SMS + 8, 704, 0),
                       # M 17-128 (two n tiles a warp step): odd tile count, ring wraps,
                       # K of one tile; group scale up to FUSED_MAX_M
                       (33, 389, 1000, 0), (128, 70, 260, 64), (80, 128 * SMS + 8, 128, 0),
                       # M 65-128 on Hopper, grids under half a wave (wgmma, A in
                       # registers): K split 4 ways and ragged N; K of one tile
                       (128, 40, 4096, 0), (70, 300, 1024, 0), (100, 33, 64, 0),
                       # M 33-128 on Hopper (TMA x, 64 / 128-token tiles): unsplit past a
                       # wave, K split 2 ways, the tiles past a wave split (K of 32 tiles)
                       (100, 128 * SMS + 40, 128, 0), (64, 128 * (SMS // 3), 2048, 0),
                       (49, 128 * (SMS + 2) - 50, 2048, 0), (120, 128 * (SMS + 2) - 50, 2048, 0),
                       # M > 128 on Hopper (TMA x, 256 x 128 blocks, half a wave or more):
                       # ragged last row block and channel block, K of one tile and of 5
                       (300, 64 * SMS + 40, 320, 0), (129, 128 * SMS - 100, 64, 0),
                       # ... under half a wave (18 x 2 blocks of 256 tokens): 27 x 3
                       # blocks of 128 tokens, K split 4 ways; past a wave, where
                       # 128-token tiles take at most 1.5 x the rounds (K of 32 tiles):
                       # unsplit, and the tiles past a wave split 4 ways
                       (300, 128 * 9 - 60, 1000, 0), (300, 128 * (SMS // 2 + 2) - 50, 2048, 0),
                       (129, 128 * (SMS + 2) - 50, 2048, 0),
                       # persistent with 256-token tiles (1.75 waves, 10 k tiles: 2 pad
                       # stages a tile), N % 8 != 0
                       (129, 128 * (7 * SMS // 4) - 76, 640, 0),
                       # ... 11 k tiles (one pad stage, released after its full phase); 7
                       # k tiles (one more than a ring round: the last pad follows a held
                       # stage and is released after the store)
                       (129, 128 * (7 * SMS // 4) - 76, 704, 0),
                       (129, 128 * (7 * SMS // 4) - 76, 448, 0)):
        codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")
        scale = torch.rand(n, -(-k // g), device="cuda") if g else torch.rand(n, device="cuda")
        packed = ops.pack(codes)
        y = ops.gemm_fused(torch.randn(m, k, dtype=dtype, device="cuda"), ops.repack(packed),
                           scale, g, n, torch.randn(n, dtype=dtype, device="cuda"))
        torch.cuda.synchronize()
        if not torch.isfinite(y).all():
            sys.exit(f"non-finite output m={m} n={n} k={k} g={g} {dtype}")
# W1.58A8: per-token quantize, then int8 tensor cores (csrc/gemm_a8.cu, gemm_a8_tc.cu and, on
# an sm_90a build, fused/wgmma_a8.cu at every M): M, N and K off the tiles (K a multiple of 4
# only), channel and tensor scales, bias, int32 sums
from ternary import _ext  # noqa: E402

WGMMA_A8 = _ext.a8_wgmma_compiled(torch.cuda.current_device())
for m, n, k in ((1, 1, 4), (3, 37, 68), (16, 65, 132), (17, 129, 260), (70, 200, 1000),
                (129, 63, 2052), (300, 300, 96), (257, 260, 640)):
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    xq, sx = ops.quantize_act_int8(x, torch.int8)
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")
    packed = ops.pack(codes)
    want = (xq.double() @ codes.double().T)
    repacked = ops.repack(packed)
    for name, acc in (
            ("gemm_a8", ops.gemm_a8(xq, sx, packed, torch.ones(n, device="cuda"), None,
                                    torch.int32)),
            ("gemm_a8_repacked", ops.gemm_a8_repacked(xq, sx, repacked, n,
                                                      torch.ones(n, device="cuda"), None,
                                                      torch.int32)),
            *((("gemm_a8_wgmma", ops.gemm_a8_wgmma(xq, sx, repacked, n,
                                                   torch.ones(n, device="cuda"), None,
                                                   torch.int32)),) if WGMMA_A8 else ())):
        if not torch.equal(acc.double(), want):
            sys.exit(f"{name} int32 sums wrong m={m} n={n} k={k}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        scale = torch.rand(1 if m % 2 else n, device="cuda") + 0.5
        bias = torch.randn(n, dtype=dtype, device="cuda")
        y = ops.gemm_a8(xq, sx, packed, scale, bias, dtype)
        y2 = ops.gemm_a8_repacked(xq, sx, repacked, n, scale, bias, dtype)
        y3 = ops.gemm_a8_wgmma(xq, sx, repacked, n, scale, bias, dtype) if WGMMA_A8 else y
        torch.cuda.synchronize()
        if not torch.isfinite(y).all() or not torch.equal(y, y2) or not torch.equal(y, y3):
            sys.exit(f"gemm_a8 / gemm_a8_repacked output wrong m={m} n={n} k={k} {dtype}")
# linear_a8, the int8_per_token layer: each route it picks by M (the float kernels' decode,
# decode_nt2, gemm_nt and on Hopper wgmma_big with the 1/s epilogue on x_q padded to the tile;
# the int8 kernels elsewhere), K off the tile, odd N, tensor and channel scale, bias or
# none; wgmma_big unsplit, split 2 ways (its finish kernel applies the epilogue) and with
# the last partial wave split
for m, n, k in ((1, 45, 196), (5, 70, 260), (12, 33, 516), (40, 389, 1000), (100, 65, 132),
                (128, 200, 68), (129, 63, 2052), (300, 300, 96), (100, 128 * SMS + 40, 128),
                (40, 128 * (SMS // 3), 2040), (49, 128 * (SMS + 2) - 50, 2048),
                # M 129-256 on wgmma_big: one wave of 256-token tiles, and past a wave (the
                # persistent kernel)
                (200, 64 * SMS + 40, 320), (250, 128 * (7 * SMS // 4) - 76, 640)):
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(m, k, dtype=dtype, device="cuda")
        scale = torch.rand(1 if m % 2 else n, device="cuda") + 0.5
        bias = torch.randn(n, dtype=dtype, device="cuda") if m % 3 else None
        xq, sx = ops.quantize_act_int8(x, torch.int8)
        want = ops.gemm_a8(xq, sx, packed, scale, bias, dtype)
        y = ops.linear_a8(x, repacked, n, scale, bias)
        torch.cuda.synchronize()
        if not torch.equal(y, want):
            sys.exit(f"linear_a8 ({_ext.linear_a8_route(m, n, k, dtype)}) differs from "
                     f"gemm_a8 m={m} n={n} k={k} {dtype}")
print("sanitize workload done")
