"""Python models of two kernels' per-lane fragments (csrc/fused.cu), with the PTX m16n8k16
layouts fused_gemm_kernel already relies on: what each lane puts in the A and B registers of
every mma and where the D registers are written.
- fused_decode_kernel: weights as A, x as B.
- fused_gemm_smem_kernel: x as A read back from the shared-memory ring that the cp.async
  chunk mapping fills (rows past M zero), weights as B; the correction taken by one warp a
  k step in turn and summed over the block.
They check the mapping, not the CUDA code: run this after changing either.

    python bench/fragment_model.py
"""

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ternary import ops  # noqa: E402

def codes_of_lane(tile, lane):
    b = tile[lane*16:(lane+1)*16]
    words = [int(b[4*w]) | int(b[4*w+1])<<8 | int(b[4*w+2])<<16 | int(b[4*w+3])<<24 for w in range(4)]
    # code(f, r, h, w) = bits 16h + 2(2f+r) of word w
    return lambda f, r, h, w: (words[w] >> (16*h + 2*(2*f + r))) & 3
def emulate(x, repacked, scale, n, k):
    m = x.shape[0]; kt_count = repacked.shape[1]; nt_count = repacked.shape[0]
    kpad = kt_count*64
    xp = torch.zeros(m, kpad, dtype=torch.float64); xp[:, :k] = x.double()
    y = torch.full((m, n), float('nan'), dtype=torch.float64)
    sx = xp.sum(1)
    for nt in range(nt_count):
        NB = 1 if m <= 8 else 2
        acc = torch.zeros(2, NB, 16, 8, dtype=torch.float64)  # D[hb][nb][row][col]
        for kt in range(kt_count):
            tile = repacked[nt, kt].tolist()
            lanes = [codes_of_lane(tile, l) for l in range(32)]
            for wi in range(4):
              for nb in range(NB):
                for hb in range(2):
                    A = torch.zeros(16, 16, dtype=torch.float64); B = torch.zeros(16, 8, dtype=torch.float64)
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        c = lanes[lane]
                        for h in range(2):
                            A[g, 2*t+h] = c(2*hb, 0, h, wi)       # a0 reg
                            A[g+8, 2*t+h] = c(2*hb+1, 0, h, wi)   # a1 reg
                            A[g, 2*t+8+h] = c(2*hb, 1, h, wi)     # a2 reg
                            A[g+8, 2*t+8+h] = c(2*hb+1, 1, h, wi) # a3 reg
                            kseg = kt*64 + 16*t
                            xr = 8*nb + g
                            if xr < m:
                                B[2*t+h, g] = xp[xr, kseg + 4*wi + h]       # b0 reg
                                B[2*t+8+h, g] = xp[xr, kseg + 4*wi + 2 + h] # b1 reg
                    acc[hb, nb] += A @ B
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for nb in range(NB):
              for e in range(4):
                j = 8*nb + 2*t + (e & 1)
                if j >= m: continue
                for hb in range(2):
                    row = g + 8*(e >> 1)
                    col = nt*32 + 16*hb + row
                    if col >= n: continue
                    s = scale[0] if scale.numel() == 1 else scale[col]
                    y[j, col] = (acc[hb, nb, row, 2*t + (e & 1)] - sx[j]) * float(s)
    return y
def emulate_gemm_smem(x, repacked, scale, n, k, MT, S, NW):
    m = x.shape[0]; kt_count = repacked.shape[1]; nt_count = repacked.shape[0]
    xp = torch.zeros(m, kt_count * 64, dtype=torch.float64); xp[:, :k] = x.double()
    y = torch.full((m, n), float('nan'), dtype=torch.float64)
    rows = 16 * MT
    for bm in range((m + rows - 1) // rows):
      m0 = bm * rows
      for bn in range((nt_count + NW - 1) // NW):
        acc = torch.zeros(NW, MT, 4, 16, 8, dtype=torch.float64)  # [warp][a][f] D
        corr = torch.zeros(NW, MT, 16, 8, dtype=torch.float64)
        xs = torch.full((S, rows, 72), float('nan'), dtype=torch.float64)
        def issue(kt, stage):
            for c in range(rows * 8):  # every thread's chunks together
                row, col = c // 8, c % 8
                src = xp[min(m0 + row, m - 1), kt*64 + col*8: kt*64 + col*8 + 8]
                xs[stage, row, col*8: col*8 + 8] = src if m0 + row < m else 0.0
        for st in range(S - 1):
            if st < kt_count: issue(st, st)
        for kt in range(kt_count):
            if kt + S - 1 < kt_count: issue(kt + S - 1, (kt + S - 1) % S)
            stage = kt % S
            for warp in range(NW):
                nt = min(bn * NW + warp, nt_count - 1)
                tile = repacked[nt, kt].tolist()
                lanes = [codes_of_lane(tile, l) for l in range(32)]
                for a in range(MT):
                    for wi in range(4):
                        A = torch.full((16, 16), float('nan'), dtype=torch.float64)
                        B = torch.full((4, 16, 8), float('nan'), dtype=torch.float64)
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            run = [xs[stage, a*16 + hh*8 + g, t*16: t*16 + 16] for hh in range(2)]
                            for h in range(2):
                                A[g, 2*t + h] = run[0][4*wi + h]          # a0: xa[0][2wi]
                                A[g + 8, 2*t + h] = run[1][4*wi + h]      # a1: xa[1][2wi]
                                A[g, 2*t + 8 + h] = run[0][4*wi + 2 + h]  # a2: xa[0][2wi+1]
                                A[g + 8, 2*t + 8 + h] = run[1][4*wi + 2 + h]
                                for f in range(4):
                                    B[f, 2*t + h, g] = lanes[lane](f, 0, h, wi)      # b[f][0]
                                    B[f, 2*t + 8 + h, g] = lanes[lane](f, 1, h, wi)  # b[f][1]
                        for f in range(4):
                            acc[warp, a, f] += A @ B[f]
                        if kt % NW == warp:
                            corr[warp, a] += A @ torch.ones(16, 8, dtype=torch.float64)
        csum = corr.sum(0)
        for warp in range(NW):
            if bn * NW + warp >= nt_count: continue
            nt = bn * NW + warp
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for f in range(4):
                    for e in range(2):
                        col = nt*32 + f*8 + 2*t + e
                        if col >= n: continue
                        s = float(scale[0] if scale.numel() == 1 else scale[col])
                        for a in range(MT):
                            for rr, r_in in ((m0 + a*16 + g, g), (m0 + a*16 + g + 8, g + 8)):
                                if rr < m:
                                    y[rr, col] = (acc[warp, a, f, r_in, 2*t + e]
                                                  - csum[a, r_in, 2*t + e]) * s
    return y


for trial in range(4):
    n = random.choice([5, 45, 70, 200]); k = random.choice([64, 132, 200])
    m = random.choice([17, 20, 33, 40]); MT = random.choice([1, 2]); NW = random.choice([2, 4])
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    rep = ops.repack(ops.pack(codes))
    scale = torch.rand(n) if trial % 2 else torch.rand(1)
    x = torch.randn(m, k)
    ref = x.double() @ (codes.double() * (scale.double().view(-1, 1) if scale.numel() > 1 else scale.double())).t()
    got = emulate_gemm_smem(x, rep, scale, n, k, MT, 4, NW)
    assert not torch.isnan(got).any(), "unwritten outputs"
    err = (got - ref).abs().max().item()
    assert err < 1e-9, (n, k, m, MT, NW, err)
    print("ok gemm_smem", n, k, m, MT, NW, err)

for trial in range(5):
    n = random.choice([5, 32, 45, 70]); k = random.choice([64, 132, 200]); m = random.choice([1, 8, 9, 13, 16])
    codes = torch.randint(-1, 2, (n, k), dtype=torch.int8)
    packed = ops.pack(codes); rep = ops.repack(packed)
    scale = torch.rand(n) if trial % 2 else torch.rand(1)
    x = torch.randn(m, k)
    ref = x.double() @ (codes.double() * (scale.double().view(-1, 1) if scale.numel() > 1 else scale.double())).t()
    got = emulate(x, rep, scale, n, k)
    assert not torch.isnan(got).any(), "unwritten outputs"
    err = (got - ref).abs().max().item()
    assert err < 1e-9, (n, k, m, err)
    print("ok", n, k, m, err)
