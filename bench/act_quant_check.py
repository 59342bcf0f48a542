"""Time ternary::quantize_act_int8 (csrc/act_quant.cu) against its PyTorch reference on the GPU.

    python bench/act_quant_check.py [--dtype bf16] [--m 1 16 256 4096] [--k 2560 4096 6912]

For each M x K and x_q dtype (int8, x's dtype): microseconds a call, the median of --reps
timings of --calls back-to-back calls between CUDA events, for the op called eagerly
(launch overhead included), the op replayed from a CUDA graph (the kernel alone), and the
reference (_quantize_act_int8_ref on the GPU: PyTorch's own kernels, eager); GB/s is the
graph time's effective bandwidth (x read once, x_q and s written). Inputs stay in L2 where
they fit (50 MB on an H200). Every output is checked bit for bit against the reference.

    python bench/act_quant_check.py --sweep

instead runs the op once on each of many small shapes (odd K, unaligned rows, every launch
route) and checks it bit for bit, no timing: the run to put under
`compute-sanitizer --tool memcheck` (or racecheck), which sees reads past a row.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from ternary import _ext, ops

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _time(fn, calls: int, reps: int) -> float:
    """Median microseconds a call of fn over reps timings of `calls` calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / calls)
    return statistics.median(times)


def _graph_time(x, out_dtype, calls: int, reps: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.quantize_act_int8(x, out_dtype)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            ops.quantize_act_int8(x, out_dtype)
    return _time(graph.replay, 1, reps) / calls


def sweep(dtypes) -> int:
    """Every launch route, odd K and unaligned rows once each; returns the mismatch count."""
    bad = n = 0
    for dtype in dtypes:
        v = 16 // torch.empty((), dtype=dtype).element_size()
        ks = sorted({1, 2, 3, 5, 7, 9, 100, 2561}
                    | {c * v + d for c in (32, 33, 64, 65, 128, 129, 512, 513, 4096, 4097, 8192,
                                           8193, 9000) for d in (0, 1, v - 1)})
        cases = [(k, m, off) for k in ks for m, off in ((1, 0), (3, 1), (5, v - 1), (9, 0))]
        # more rows than the grid holds (act_quant.cu, kMaxGrid): rows taken grid-stride
        cases += [(k, 8200, off) for k in (v * 20 + 1, v * 129 + 3, v * 600) for off in (0, 1)]
        for k, m, off in cases:
            base = torch.randn(m * k + off, device="cuda").to(dtype)
            x = base[off:].view(m, k)
            for out_dtype in (torch.int8, dtype):
                q, s = ops.quantize_act_int8(x, out_dtype)
                rq, rs = ops._quantize_act_int8_ref(x, out_dtype)
                n += 1
                if not (torch.equal(q, rq) and torch.equal(s, rs)):
                    bad += 1
                    print(f"MISMATCH {dtype} -> {out_dtype} m={m} k={k} offset {off}")
    torch.cuda.synchronize()
    print(f"sweep: {n} calls, {bad} mismatches")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--m", type=int, nargs="+", default=[1, 16, 256, 4096])
    p.add_argument("--k", type=int, nargs="+", default=[2560, 4096, 6912])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--sweep", action="store_true", help="check many small shapes, no timing")
    a = p.parse_args(argv)
    if not torch.cuda.is_available() or _ext.load() is None:
        raise SystemExit(f"needs a CUDA GPU and ternary._C (error: {_ext.load_error()})")
    if a.sweep:
        return 1 if sweep(list(DTYPES.values())) else 0
    dtype = DTYPES[a.dtype]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  x {a.dtype}  "
          f"build {_ext.load().build_info()}")
    print(f"{'M':>5} {'K':>6} {'x_q':>5} | {'eager us':>9} {'graph us':>9} {'ref us':>9} "
          f"{'GB/s':>7} {'ref/graph':>9}")
    rows = []
    for m in a.m:
        for k in a.k:
            x = torch.randn(m, k, device="cuda", dtype=torch.float32)
            x[:, torch.randint(0, k, (max(1, k // 256),))] *= 50
            x = x.to(dtype)
            for out_dtype in (torch.int8, dtype):
                q, s = ops.quantize_act_int8(x, out_dtype)
                rq, rs = ops._quantize_act_int8_ref(x, out_dtype)
                bits = (lambda t: t if t.dtype == torch.int8 else
                        t.view(torch.int32 if t.dtype == torch.float32 else torch.int16))
                exact = bool(torch.equal(bits(q), bits(rq)) and torch.equal(s.view(torch.int32),
                                                                           rs.view(torch.int32)))
                eager = _time(lambda: ops.quantize_act_int8(x, out_dtype), a.calls, a.reps)
                graph = _graph_time(x, out_dtype, a.calls, a.reps)
                ref = _time(lambda: ops._quantize_act_int8_ref(x, out_dtype), max(1, a.calls // 5),
                            a.reps)
                nbytes = x.numel() * x.element_size() + q.numel() * q.element_size() + s.numel() * 4
                gbs = nbytes / graph / 1e3
                name = "int8" if out_dtype == torch.int8 else a.dtype
                print(f"{m:>5} {k:>6} {name:>5} | {eager:>9.2f} {graph:>9.2f} {ref:>9.2f} "
                      f"{gbs:>7.0f} {ref / graph:>8.1f}x{'' if exact else '  MISMATCH'}",
                      flush=True)
                rows.append({"m": m, "k": k, "x": a.dtype, "x_q": name, "eager_us": eager,
                             "graph_us": graph, "ref_us": ref, "gb_s": gbs, "exact": exact})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
