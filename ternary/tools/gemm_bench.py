"""Times the ternary gemm kernels against cuBLAS bf16 on the dense weight and gemlite's
A16W158 kernel (docs/performance.md says how to read the table): CUDA graphs (launch gaps out of
the numbers), weights rotated past L2 (each timed call reads its weight from HBM), random
data, median of repeated replays. Used by bench/bench_gemm.py and `ternary bench`.

Every timing starts after a short idle pause (`settle_s`): the H200 draws close to its 700 W
limit in the M = 4096 cells and runs at 1.4-1.65 GHz instead of 1.98 for a while after them,
so without the pause a cell's numbers depend on the cell before it (M = 1 after the
previous shape's M = 4096 reads 1-1.7 us slower).

The timed replays then stop after `window_ms` of GPU time (at least MIN_REPLAYS), and where
MIN_REPLAYS replays of every weight copy would take longer, the graph holds fewer copies
(at least 2): the power limiter lowers the clock about 50 ms into a burst of large-M calls
(bench/burst_trace.py), so a kernel whose graph held more weight copies (on 4096 x 22016 the
2-bit weights rotate through 9, the bf16 ones through 2) was timed over more of its burst, at
a lower clock than cuBLAS. With the window every kernel is timed at
the clock it starts at (each row's `timed_ms` says how long its timings took); `--sustain`
times them all at the clock they settle at.

The 2-bit bandwidth floor of a call is (K*N/4 weight bytes + M*K*2 + M*N*2 activation bytes)
over the copy bandwidth measured in the same run, and the bf16 compute floor 2 M N K over the
bf16 matmul rate measured there; "floor %" is the larger of the two over the time of `auto`
(the kernel the policy picks), so 100 is the floor reached. Both rates are probes (a copy, one
bf16 matmul shape), not peaks: a kernel that beats the probe's rate reads above 100.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ternary.formats.modules import vllm_layer_shapes
from ternary.tools.synthetic import bigmodel

SHAPES = ((4096, 22016), (11008, 4096), (4096, 6144), (4096, 4096), (4096, 12288))  # (K, N)
# microsoft/bitnet-b1.58-2B-4T's layers as vLLM fuses them: qkv, o, gate_up, down
BITNET_2B_SHAPES = tuple((k, n) for n, k in vllm_layer_shapes(
    bigmodel.widths(bigmodel.SHAPES["bitnet-2b"])).values())
SHAPE_SETS = {"tracked": SHAPES, "bitnet-2b": BITNET_2B_SHAPES}
M_VALUES = (1, 4, 16, 64, 256, 1024, 4096)
SETTLE_S = 0.25  # idle seconds before each timing; the clock was back at 1.95 GHz within 0.1 s
WINDOW_MS = 20.0  # GPU time a timing may take: before the power limiter (burst_trace.py)
MIN_REPLAYS = 3
METHODS = ("fused", "auto", "cublas_path", "cublas_dense", "a8", "a8_tc", "a8_tc_rp", "a8_wg",
           "int_mm", "gemlite")


@dataclass
class Row:
    k: int
    n: int
    m: int
    us: dict[str, float | None] = field(default_factory=dict)
    auto_kernel: str = ""
    fused_kernel: str = ""  # the CUDA kernel gemm_fused picks (ternary._ext.fused_route)
    a8_kernel: str = ""  # the one an int8_per_token layer takes (Kernel.route_a8)
    floor_bw_us: float = 0.0
    floor_compute_us: float = 0.0
    timed_ms: dict[str, float] = field(default_factory=dict)  # GPU time each timing took


def measure_copy_bandwidth(device, nbytes: int = 2 << 30) -> float:
    """Bytes read plus bytes written per second of a large device-to-device copy."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times)


def measure_bf16_flops(device, size: int = 8192) -> float:
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        a @ b
    e.record()
    e.synchronize()
    return 2 * size**3 * 10 / (s.elapsed_time(e) / 1e3)


def replays_in_window(replay_ms: float, window_ms: float, replays: int) -> int:
    """How many of `replays` timed replays fit in `window_ms` of GPU time (at least
    MIN_REPLAYS, or `replays` if fewer); window_ms 0 means no window."""
    if window_ms <= 0 or replay_ms <= 0:
        return replays
    return max(min(MIN_REPLAYS, replays), min(replays, int(window_ms // replay_ms)))


def copies_in_window(call_ms: float, window_ms: float, copies: int) -> int:
    """How many of `copies` calls a graph replay may hold so that MIN_REPLAYS replays fit in
    `window_ms` (at least 2, so consecutive calls still read different weights)."""
    if window_ms <= 0 or call_ms <= 0:
        return copies
    return max(min(2, copies), min(copies, int(window_ms / (MIN_REPLAYS * call_ms))))


def _graph_of(calls) -> tuple[torch.cuda.CUDAGraph, float]:
    """A CUDA graph that runs `calls` once each, and the milliseconds of one replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(2):
        graph.replay()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    graph.replay()
    e.record()
    e.synchronize()
    return graph, s.elapsed_time(e)


def time_rotated(calls, replays: int = 20, sustain_s: float = 0.0, settle_s: float = 0.0,
                 window_ms: float = 0.0, info: dict | None = None) -> float:
    """Median microseconds of one call: a CUDA graph runs every call once (each on its own
    weight copy), replayed up to `replays` times within `window_ms` of GPU time, after
    `settle_s` idle seconds (where MIN_REPLAYS replays of every copy would not fit, the graph
    holds fewer copies); with sustain_s, after replaying for that long instead (the clock
    the kernel's own power draw settles at, as in a long prefill), all copies `replays`
    times. `info`, if given, receives the GPU milliseconds timed (`timed_ms`)."""
    for c in calls:  # warm-up outside capture (autotuners, lazy init)
        c()
    torch.cuda.synchronize()
    graph, replay_ms = _graph_of(calls)
    if sustain_s > 0:
        t_end = time.perf_counter() + sustain_s
        while time.perf_counter() < t_end:
            graph.replay()
            torch.cuda.synchronize()
    else:
        use = copies_in_window(replay_ms / len(calls), window_ms, len(calls))
        if use < len(calls):
            calls = calls[:use]
            graph, replay_ms = _graph_of(calls)
        time.sleep(settle_s)
        replays = replays_in_window(replay_ms, window_ms, replays)
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    if info is not None:
        info["timed_ms"] = sum(times)
    return statistics.median(times) * 1e3 / len(calls)


def _copies(bytes_per_copy: int, l2_bytes: int) -> int:
    return max(2, min(32, math.ceil(3 * l2_bytes / max(bytes_per_copy, 1))))


def weight_copies(k: int, n: int, device, dtype, fused):
    """Random ternary weights of one K x N layer in as many copies as rotate past L2: codes,
    scales, packed, prepared for `fused` (a kernels.FusedKernel), and the dense `dtype` copies
    cuBLAS reads (fewer: each is 8x larger)."""
    from ternary import ops

    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    copies = _copies(k * n // 4, l2)
    codes = [torch.randint(-1, 2, (n, k), dtype=torch.int8, device=device)
             for _ in range(copies)]
    scales = [torch.rand(n, device=device) + 0.5 for _ in range(copies)]
    packed = [ops.pack(c) for c in codes]
    prepared = [fused.prepare(p, s, 0) for p, s in zip(packed, scales)]
    dense = [ops.dequantize(packed[i], scales[i], 0, dtype)
             for i in range(_copies(2 * k * n, l2))]
    return codes, scales, packed, prepared, dense


def _int_mm_a8(x, codes, scale, dtype):
    """An int8_per_token layer on torch._int_mm: quantize, int8 x int8 -> int32 by cuBLASLt
    (codes [N, K] read as the [K, N] column-major operand it wants), the float32 epilogue."""
    from ternary import ops

    xq, s = ops.quantize_act_int8(x, torch.int8)
    return (torch._int_mm(xq, codes.t()).to(torch.float32) * scale / s).to(dtype)


def _gemlite_layers(codes_list, scale_value: float, dtype):
    from gemlite.helper import A16W158_INT

    layers = []
    for c in codes_list:
        # from_weights builds its scales with a bare torch.ones (CPU unless told otherwise)
        with torch.device(c.device):
            layers.append(A16W158_INT(device=str(c.device), dtype=dtype).from_weights(
                weight=c.to(dtype), weight_scale=torch.tensor(scale_value)))
    return layers


def run(shapes=SHAPES, m_values=M_VALUES, dtype=torch.bfloat16, gemlite: bool = True,
        replays: int = 20, progress: bool = True, partial_json: str | None = None,
        settle_s: float = SETTLE_S, sustain_s: float = 0.0,
        window_ms: float = WINDOW_MS) -> dict:
    """Times every (shape, M), each kernel after `settle_s` idle seconds and within
    `window_ms` of GPU time; with partial_json, rewrites that file after each row so a run
    cut short still leaves its numbers."""
    from ternary import _ext, kernels, ops

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    l2 = props.L2_cache_size
    bw = measure_copy_bandwidth(device)
    flops = measure_bf16_flops(device)
    meta: dict = {
        "device": props.name, "sms": props.multi_processor_count, "l2_bytes": l2,
        "copy_bandwidth_Bps": bw, "bf16_mm_flops": flops, "torch": torch.__version__,
        "dtype": str(dtype), "replays": replays, "settle_s": 0.0 if sustain_s else settle_s,
        "sustain_s": sustain_s,
        "window_ms": 0.0 if sustain_s else window_ms,
        "gemlite": None,
        "gemlite_error": None,
    }
    if gemlite:
        try:
            import gemlite as gl

            meta["gemlite"] = gl.__version__
        except Exception as e:  # noqa: BLE001 (any gemlite failure is reported, not fatal)
            meta["gemlite_error"] = f"{type(e).__name__}: {e}"
    a8_wgmma = _ext.a8_wgmma_compiled(device.index or 0)
    rows: list[Row] = []
    fused = kernels.FusedKernel()
    platform = kernels.detect_platform()

    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("benchmark", total=len(shapes) * len(m_values))
        for k, n in shapes:
            codes, scales, packed, prepared, dense = weight_copies(k, n, device, dtype, fused)
            layers, gl_err = None, meta["gemlite_error"]
            if gemlite and gl_err is None:
                try:
                    layers = _gemlite_layers(codes, 1.0, dtype)
                except Exception as e:  # noqa: BLE001 (reported in the table)
                    gl_err = meta["gemlite_error"] = f"{type(e).__name__}: {e}"
            for m in m_values:
                bar.update(task, description=f"K={k} N={n} M={m}")
                x = torch.randn(m, k, dtype=dtype, device=device)
                row = Row(k=k, n=n, m=m)
                row.floor_bw_us = (k * n / 4 + 2 * m * k + 2 * m * n) / bw * 1e6
                row.floor_compute_us = 2 * m * n * k / flops * 1e6
                choice = kernels.choose(platform, m=m, n=n, k=k, dtype=dtype, group_size=0,
                                        device=device)
                row.auto_kernel = choice.route(m, n, k)
                row.fused_kernel = _ext.fused_route(m, n, k, 0, torch.device(device).index or 0)
                row.a8_kernel = choice.route_a8(m, n, k, dtype)
                auto_prep = [choice.prepare(p, s, 0) for p, s in zip(packed, scales)] \
                    if choice.name != "fused" else prepared
                cases = {
                    "fused": [lambda p=p, x=x, n=n: ops.gemm_fused(x, p.repacked, p.scale, 0, n)
                              for p in prepared],
                    "auto": [lambda p=p, x=x, c=choice: c.apply(x, p, None) for p in auto_prep],
                    "cublas_path": [lambda p=p, s=s, x=x: torch.mm(
                        x, ops.dequantize(p, s, 0, dtype).t()) for p, s in zip(packed, scales)],
                    "cublas_dense": [lambda w=w, x=x: torch.mm(x, w.t()) for w in dense],
                    # an int8_per_token layer as the plugin runs it (Kernel.apply_a8: with
                    # the fused kernel, ternary::linear_a8, the quantize included)
                    "a8": [lambda p=p, x=x, c=choice: c.apply_a8(x, p, None) for p in auto_prep],
                }
                # int8 tensor cores: quantize, then ternary::gemm_a8 on the packed codes
                cases["a8_tc"] = [lambda p=p, s=s, x=x: ops.gemm_a8(
                    *ops.quantize_act_int8(x, torch.int8), p, s, None, dtype)
                    for p, s in zip(packed, scales)]
                # ... and ternary::gemm_a8_repacked on the fused kernel's own tiles
                cases["a8_tc_rp"] = [lambda p=p, s=s, x=x, n=n: ops.gemm_a8_repacked(
                    *ops.quantize_act_int8(x, torch.int8), p.repacked, n, s, None, dtype)
                    for p, s in zip(prepared, scales)]
                # ... and its Hopper kernel, int8 wgmma, at every M (sm_90a builds on a 9.0 GPU)
                if a8_wgmma:
                    cases["a8_wg"] = [lambda p=p, s=s, x=x, n=n: ops.gemm_a8_wgmma(
                        *ops.quantize_act_int8(x, torch.int8), p.repacked, n, s, None, dtype)
                        for p, s in zip(prepared, scales)]
                # cuBLASLt int8 (int32 out) on the dense int8 codes, with the same epilogue;
                # torch._int_mm takes M > 16 and K, N multiples of 8 only (checked here: a
                # refusal inside a graph capture would break the capture)
                if m > 16 and k % 8 == 0 and n % 8 == 0:
                    cases["int_mm"] = [lambda c=c, s=s, x=x: _int_mm_a8(x, c, s, dtype)
                                       for c, s in zip(codes, scales)]
                if layers is not None:
                    cases["gemlite"] = [lambda lay=lay, x=x: lay(x) for lay in layers]
                for name, calls in cases.items():
                    torch.cuda.synchronize()
                    try:
                        info: dict = {}
                        row.us[name] = time_rotated(calls, replays, sustain_s, settle_s,
                                                    window_ms, info)
                        row.timed_ms[name] = info["timed_ms"]
                    except Exception as e:
                        row.us[name] = None
                        if name == "gemlite":
                            meta["gemlite_error"] = f"{type(e).__name__}: {e}"
                        else:
                            raise
                rows.append(row)
                bar.advance(task)
                if partial_json:
                    _write_json(partial_json, {"meta": meta, "rows": [asdict(r) for r in rows]})
            del codes, packed, prepared, dense, layers
            torch.cuda.empty_cache()
    return {"meta": meta, "rows": [asdict(r) for r in rows]}


def _write_json(path: str, result: dict) -> None:
    import json

    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)


def _ratio(slow, fast) -> str:
    return f"{slow / fast:.2f}" if slow and fast else "-"


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    meta = result["meta"]
    t = Table(title=(f"{meta['device']}: ternary gemm, {meta['dtype']}, CUDA graphs, weights "
                     f"rotated past L2; copy {meta['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, bf16 mm "
                     f"{meta['bf16_mm_flops'] / 1e12:.0f} TFLOP/s; times in us"))
    a8 = any(r["us"].get("a8") for r in result["rows"])
    tc = any(r["us"].get("a8_tc") for r in result["rows"])

    wg = any(r["us"].get("a8_wg") for r in result["rows"])

    def best_tc(us):  # the fastest int8 tensor-core kernel of the row
        v = [us[key] for key in ("a8_tc", "a8_tc_rp", "a8_wg") if us.get(key)]
        return min(v) if v else None

    for col in ("K x N", "M", "fused (kernel)", "auto (policy)", "cuBLAS bf16", "dequant+mm",
                "gemlite", "x cuBLAS", "x gemlite", "floor us", "floor %",
                *(("A8 route", "A8 x cuBLAS") if a8 else ()),
                *(("A8 TC 64", "A8 TC 128", *(("A8 wgmma",) if wg else ()), "int_mm A8",
                   "TC x cuBLAS", "TC x int_mm") if tc else ())):
        t.add_column(col, justify="right", no_wrap=col in ("K x N", "M"))

    def f(v):
        return "-" if v is None else f"{v:.1f}"

    for r in result["rows"]:
        us = r["us"]
        fu, cb, gl, au = us.get("fused"), us.get("cublas_dense"), us.get("gemlite"), us.get("auto")
        floor = max(r["floor_bw_us"], r["floor_compute_us"])
        fk = f" ({r['fused_kernel']})" if r.get("fused_kernel") else ""
        t.add_row(f"{r['k']} x {r['n']}", str(r["m"]), f"{f(fu)}{fk}",
                  f"{f(au)} ({r['auto_kernel']})",
                  f(cb), f(us.get("cublas_path")), f(gl),
                  f"{cb / au:.2f}" if cb and au else "-", f"{gl / au:.2f}" if gl and au else "-",
                  f"{floor:.1f}{'' if r['floor_bw_us'] >= r['floor_compute_us'] else ' (c)'}",
                  f"{100 * floor / au:.0f}" if au else "-",
                  *((f(us.get("a8")) + (f" ({r['a8_kernel']})" if r.get("a8_kernel") else ""),
                     f"{cb / us['a8']:.2f}" if cb and us.get("a8") else "-") if a8 else ()),
                  *((f(us.get("a8_tc")), f(us.get("a8_tc_rp")),
                     *((f(us.get("a8_wg")),) if wg else ()), f(us.get("int_mm")),
                     _ratio(cb, best_tc(us)), _ratio(us.get("int_mm"), best_tc(us))) if tc else ()))
    # the int8 tensor-core columns do not fit 160 characters without folding every cell
    console = Console(width=220 if tc else 160)
    console.print(t)
    console.print("x cuBLAS / x gemlite: speedup of `auto` (the kernel the policy picks); floor: "
                  "2-bit bandwidth floor, (c) where the bf16 compute floor is larger")
    if tc:
        console.print("A8 TC 64 / 128: quantize + ternary::gemm_a8 (int8 tensor cores, 64-token "
                      "tiles, canonical weight) / gemm_a8_repacked (the fused kernel's weight: "
                      "mma.sync 128 x 128 tiles, the wgmma kernel from M = 128 on Hopper)"
                      + ("; A8 wgmma: gemm_a8_wgmma (int8 wgmma, 128 x 256 tiles) at every M"
                         if wg else "") + "; TC x: the fastest of them; int_mm A8: quantize + "
                      "torch._int_mm (cuBLASLt int8) on the dense int8 codes + the same epilogue "
                      "('-' where it refuses the shape, M <= 16)")
    if a8:
        console.print("A8 route: an int8_per_token layer as the plugin runs it (`auto`'s "
                      "apply_a8; for fused, ternary::linear_a8: the per-token quantize and the "
                      "kernel in brackets, gemm_a8's result bit for bit)")
    if meta.get("settle_s") and not meta.get("sustain_s"):
        console.print(f"each kernel timed after {meta['settle_s']:g} s idle, so no cell runs at "
                      "the lower clock the previous cell's power draw left")
    if meta.get("window_ms"):
        w = meta["window_ms"]
        console.print(f"each kernel timed within its first {w:g} ms of GPU time (at least "
                      f"{min(MIN_REPLAYS, meta.get('replays', MIN_REPLAYS))} replays)"
                      + (", before the power limiter lowers the clock (about 50 ms into a "
                         "burst on the H200)" if w <= 50 else ""))
        over = [f"{r['k']} x {r['n']} M={r['m']} {name} {ms:.0f} ms"
                for r in result["rows"] for name, ms in r.get("timed_ms", {}).items()
                if ms > 1.05 * w]
        if over:
            console.print(f"timed over more than the window ({len(over)}): "
                          + ", ".join(over[:6]) + (" ..." if len(over) > 6 else ""))
    elif not meta.get("sustain_s"):
        why = "--window 0" if "window_ms" in meta else "a run before the window existed"
        console.print(f"no timing window ({why}): kernels whose graphs run longer were timed "
                      "further into their burst, at a lower clock")
    if meta.get("sustain_s"):
        console.print(f"each kernel ran {meta['sustain_s']:g} s before its timing: the clock its "
                      "own power draw settles at, as in a long prefill")
    if meta.get("gemlite_from"):
        console.print(f"gemlite column from an earlier run: {meta['gemlite_from']}")
    if meta.get("gemlite_error"):
        console.print(f"gemlite: {meta['gemlite_error']}")


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    return run_cli(p.parse_args(argv))


def add_arguments(p) -> None:
    p.add_argument("--m", type=int, nargs="+", default=list(M_VALUES), help="batch sizes M")
    p.add_argument("--shapes", nargs="+", default=[f"{k}x{n}" for k, n in SHAPES],
                   help=f"weight shapes KxN, or a set: {', '.join(SHAPE_SETS)} (default: the "
                   "tracked five)")
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--no-gemlite", action="store_true", help="skip gemlite")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--settle", type=float, default=SETTLE_S, metavar="SECONDS",
                   help=f"idle pause before each timing (default {SETTLE_S}; 0 for none)")
    p.add_argument("--window", type=float, default=WINDOW_MS, metavar="MS",
                   help=f"GPU time each timing may take, at least {MIN_REPLAYS} replays (default "
                   f"{WINDOW_MS:g}: before the power limiter; 0 for all --replays and weight "
                   "copies; not used with --sustain)")
    p.add_argument("--sustain", type=float, default=0.0, metavar="SECONDS",
                   help="run each kernel this long before timing it (steady-state clocks)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON here (with "
                   "--render: the rendered run, its gemlite column merged)")
    p.add_argument("--render", metavar="PATH", help="print the table of a saved JSON (no GPU)")
    p.add_argument("--gemlite-from", metavar="PATH",
                   help="with --render: fill the gemlite column from another saved run")


def merge_gemlite(result: dict, other: dict) -> dict:
    """`result` with the gemlite times of `other` (an earlier run of the same shapes), its
    source recorded in meta; rows without a match stay empty."""
    times = {(r["k"], r["n"], r["m"]): r["us"].get("gemlite") for r in other["rows"]}
    for r in result["rows"]:
        r["us"]["gemlite"] = times.get((r["k"], r["n"], r["m"]))
    result["meta"]["gemlite_from"] = {k: other["meta"].get(k) for k in
                                      ("device", "gemlite", "copy_bandwidth_Bps", "torch",
                                       "window_ms", "sustain_s")}
    return result


def load_result(path: str, flag: str) -> dict:
    """A saved `ternary bench --json` run, or SystemExit naming the file and what is wrong."""
    import json

    try:
        with open(path) as fh:
            result = json.load(fh)
    except OSError as e:
        raise SystemExit(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"{flag} {path}: not JSON ({e})") from None
    meta = result.get("meta") if isinstance(result, dict) else None
    rows = result.get("rows") if isinstance(result, dict) else None
    if not (isinstance(meta, dict) and _META <= meta.keys() and isinstance(rows, list)
            and all(isinstance(r, dict) and _ROW <= r.keys() and isinstance(r["us"], dict)
                    for r in rows)):
        raise SystemExit(f"{flag} {path}: not a `ternary bench --json` result (it needs 'meta' "
                         f"with {sorted(_META)} and 'rows' with {sorted(_ROW)} in each)")
    return result


# what render reads of a saved run
_META = {"device", "dtype", "copy_bandwidth_Bps", "bf16_mm_flops"}
_ROW = {"k", "n", "m", "us", "auto_kernel", "floor_bw_us", "floor_compute_us"}


def parse_shapes(specs: list[str]) -> list[tuple[int, int]]:
    """--shapes KxN ... as (K, N) pairs, or SystemExit naming the one that is wrong."""
    shapes = []
    for s in specs:
        if s in SHAPE_SETS:
            shapes.extend(SHAPE_SETS[s])
            continue
        try:
            k, n = (int(v) for v in s.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes takes KxN (e.g. 4096x22016) or one of "
                             f"{list(SHAPE_SETS)}; got {s!r}") from None
        if k <= 0 or n <= 0 or k % 4:
            raise SystemExit(f"--shapes {s}: K and N must be positive and K a multiple of 4")
        shapes.append((k, n))
    return shapes


def run_cli(args) -> int:
    if args.json and not Path(args.json).parent.is_dir():
        # (before a render or a run of minutes, not after it)
        raise SystemExit(f"--json {args.json}: the folder {Path(args.json).parent} does not exist")
    if args.render:
        result = load_result(args.render, "--render")
        if args.gemlite_from:
            result = merge_gemlite(result, load_result(args.gemlite_from, "--gemlite-from"))
        render(result)
        if args.json:  # the rendered run, with the merged gemlite column if any
            _write_json(args.json, result)
        return 0
    if args.gemlite_from:
        raise SystemExit("--gemlite-from fills the gemlite column of a saved run: use it with "
                         "--render PATH")
    shapes = parse_shapes(args.shapes)
    if any(m < 1 for m in args.m) or args.replays < 1:
        raise SystemExit(f"--m {args.m} and --replays {args.replays}: give positive numbers")
    if not 0 <= args.settle <= 10:
        raise SystemExit(f"--settle {args.settle}: give idle seconds between 0 and 10")
    if not 0 <= args.window <= 10000:
        raise SystemExit(f"--window {args.window}: give milliseconds between 0 and 10000")
    if not 0 <= args.sustain <= 60:
        raise SystemExit(f"--sustain {args.sustain}: give seconds between 0 and 60")
    if not torch.cuda.is_available():
        raise SystemExit(f"ternary bench needs a CUDA GPU; torch {torch.__version__} sees none "
                         "(use --render PATH to print a saved run)")
    from ternary import _ext

    if _ext.load() is None:
        err = _ext.load_error()
        raise SystemExit("ternary bench times the fused kernel of ternary._C, which "
                         + (f"fails to load: {err}" if err else "is not built here")
                         + "; build it for this GPU with `nox -s build-<target>`")
    t0 = time.time()
    result = run(shapes, args.m, getattr(torch, args.dtype), not args.no_gemlite, args.replays,
                 partial_json=args.json, settle_s=args.settle, sustain_s=args.sustain,
                 window_ms=args.window)
    result["meta"]["wall_s"] = time.time() - t0
    render(result)
    if args.json:
        _write_json(args.json, result)
    return 0
