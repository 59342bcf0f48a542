"""A lane-by-lane model of gemm_a8_tc_kernel (csrc/gemm_a8_tc.cu): the x tile as cp.async
leaves it, each lane's 16 bytes of the repacked weight tile (ternary.ops._repack_ref),
decode_word, and the PTX fragment layouts of mma.sync m16n8k32 s8, against int64 sums. It
checks the mapping (the k permutation inside each 32-wide step), not the CUDA code: run it
after changing either.

    python bench/a8_tc_model.py
"""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ternary import ops  # noqa: E402

def bytes_of(u32):  # int8 bytes 0..3 of each uint32
    u = np.asarray(u32, dtype=np.uint32)
    return np.stack([((u >> (8 * j)) & 0xFF).astype(np.uint8).view(np.int8) for j in range(4)], -1)

def decode_word(w, f):
    w = np.uint32(w)
    v = w >> np.uint32(4 * f)
    lo = v & np.uint32(0x00030003)
    hi = (v >> np.uint32(2)) & np.uint32(0x00030003)
    b = lambda x, i: (int(x) >> (8 * i)) & 0xFF
    c = b(lo, 0) | (b(lo, 2) << 8) | (b(hi, 0) << 16) | (b(hi, 2) << 24)  # __byte_perm 0x6420
    return np.uint32(((c + 0x7F7F7F7F) & 0xFFFFFFFF) ^ 0x80808080)

def mma(acc, a, b):
    """acc [32 lanes, 4] int64; a [32, 4] uint32 (a0..a3); b [32, 2] uint32."""
    A = np.zeros((16, 32), np.int64); B = np.zeros((32, 8), np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        ab = bytes_of(a[lane]); bb = bytes_of(b[lane])
        for i in range(4):
            A[g, 4 * t + i] = ab[0, i]; A[g + 8, 4 * t + i] = ab[1, i]
            A[g, 16 + 4 * t + i] = ab[2, i]; A[g + 8, 16 + 4 * t + i] = ab[3, i]
            B[4 * t + i, g] = bb[0, i]; B[16 + 4 * t + i, g] = bb[1, i]
    C = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        acc[lane] += [C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]]

def run(m, n, k, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (m, k), dtype=np.int64).astype(np.int8)
    codes = rng.integers(-1, 2, (n, k)).astype(np.int8)
    rep = ops._repack_ref(ops.pack(torch.from_numpy(codes))).numpy()
    KT = rep.shape[1]
    kp = -(-k // 16) * 16  # the op pads x to a multiple of 16
    xp = np.zeros((m, kp), np.int8); xp[:, :k] = x
    y = np.full((m, n), -999999, np.int64)
    for by in range(-(-m // 128)):
        for bx in range(-(-n // 128)):
            m0, n0 = by * 128, bx * 128
            for warp in range(8):
                wm, wn = (warp >> 2) * 64, (warp & 3) * 32
                nt = (n0 + wn) // 32; live = n0 + wn < n
                acc = np.zeros((4, 4, 32, 4), np.int64)
                for kt in range(KT):
                    # the x tile as cp.async leaves it: zero past m and kp
                    tile = np.zeros((128, 64), np.int8)
                    r1, c0 = min(m, m0 + 128), kt * 64
                    if m0 < m and c0 < kp:
                        c1 = min(kp, c0 + 64)
                        tile[: r1 - m0, : c1 - c0] = xp[m0:r1, c0:c1]
                    words = np.zeros((32, 4), np.uint32)
                    if live:
                        words = rep[nt, kt].reshape(32, 16).copy().view(np.uint32).reshape(32, 4)
                    for i in range(4):
                        for f in range(4):
                            for s in range(2):
                                a = np.zeros((32, 4), np.uint32); b = np.zeros((32, 2), np.uint32)
                                for lane in range(32):
                                    g, t = lane >> 2, lane & 3
                                    lo = tile[wm + i * 16 + g, t * 16: t * 16 + 16].copy().view(np.uint32)
                                    hi = tile[wm + i * 16 + g + 8, t * 16: t * 16 + 16].copy().view(np.uint32)
                                    a[lane] = [lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1]]
                                    b[lane] = [decode_word(words[lane, 2 * s], f),
                                               decode_word(words[lane, 2 * s + 1], f)]
                                mma(acc[i, f], a, b)
                for i in range(4):
                    for f in range(4):
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            for h in range(2):
                                for e in range(2):
                                    row = m0 + wm + i * 16 + g + h * 8
                                    col = n0 + wn + f * 8 + t * 2 + e
                                    if row < m and col < n:
                                        y[row, col] = acc[i, f, lane, h * 2 + e]
    want = x.astype(np.int64) @ codes.astype(np.int64).T
    bad = int((y != want).sum())
    print(f"m={m} n={n} k={k}: {bad} of {y.size} wrong")
    return bad

bad = sum(run(*a, seed=j) for j, a in enumerate([(1, 1, 4), (5, 37, 68), (17, 33, 132), (130, 200, 192)]))
sys.exit(1 if bad else 0)
