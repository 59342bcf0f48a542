#!/usr/bin/env python3
"""One ternary layer called a few times, eagerly, for a profiler to attach to (ncu, nsys):
the kernels a profiler should read are the ones of the last call, after the warm-up ones.

    ncu --clock-control none -k regex:a8_wgmma_kernel --launch-skip 2 --launch-count 1 \\
        python3 -P bench/one_layer.py --m 2048 --k 4096 --n 22016

--activation int8_per_token (the default) calls ternary::linear_a8, as the vLLM plugin does
for bitnet checkpoints; none calls ternary::linear_fused. Random codes, a channel scale and
activations with a few large channels; the output is checked against the reference op on the
last call (exit 1 if it differs), so a profile is never of a wrong kernel. Prints the route
and, with --json, {"route", "m", "n", "k", "calls", "ok"}.

Imports the installed ternary (run it with -P), or the checkout's on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ternary import _ext, ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, required=True, help="tokens (rows of x)")
    ap.add_argument("--k", type=int, required=True, help="input features")
    ap.add_argument("--n", type=int, required=True, help="output features")
    ap.add_argument("--activation", choices=("int8_per_token", "none"), default="int8_per_token")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--calls", type=int, default=3,
                    help="calls in all, the last one checked (default 3: skip 2 in the profiler)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for name in ("m", "k", "n", "calls"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1; got {getattr(a, name)}")
    if not torch.cuda.is_available():
        print("one_layer.py: needs a CUDA GPU (it runs the CUDA kernels)", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-1, 2, (a.n, a.k), dtype=torch.int8, generator=g).cuda()
    scale = (torch.rand(a.n, generator=g) + 0.25).cuda()
    packed = ops.pack(codes)
    repacked = ops.repack(packed)
    x = torch.randn(a.m, a.k, generator=g)
    x[:, torch.randperm(a.k, generator=g)[:3]] *= 40
    x = x.to(dtype).cuda()
    dev = torch.cuda.current_device()
    if a.activation == "int8_per_token":
        route = _ext.linear_a8_route(a.m, a.n, a.k, dtype, dev)

        def call():
            return ops.linear_a8(x, repacked, a.n, scale)

        def want():
            xq, s = ops.quantize_act_int8(x, torch.int8)
            return ops.gemm_a8(xq, s, packed, scale, None, dtype)
    else:
        route = _ext.fused_route(a.m, a.n, -(-a.k // 64) * 64, 0, dev)

        def call():
            return ops.linear_fused(x, repacked, None, scale, 0, a.n, -1, None)

        def want():
            return ops.gemm(x, packed, scale, 0).to(dtype)
    for _ in range(a.calls):
        y = call()
    torch.cuda.synchronize()
    ref = want()
    if a.activation == "int8_per_token":
        ok = bool(torch.equal(y, ref))  # linear_a8 is gemm_a8's result bit for bit
    else:
        ok = bool(torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * float(
            ref.float().abs().max())))
    facts = {"route": route, "m": a.m, "n": a.n, "k": a.k, "calls": a.calls, "ok": ok}
    print(json.dumps(facts) if a.json else
          f"{a.activation} m={a.m} k={a.k} n={a.n}: {route}, {a.calls} calls, "
          f"{'matches the reference' if ok else 'DIFFERS from the reference'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
