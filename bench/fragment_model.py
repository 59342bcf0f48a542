"""A Python model of fused_decode_kernel's per-lane fragments (csrc/fused/): what each
lane of a warp puts in the A (weights) and B (x) registers of every m16n8k16, with the PTX
layouts fused_gemm_kernel already relies on, and where the D registers are written. It checks
the mapping, not the CUDA code: run it after changing either.

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
