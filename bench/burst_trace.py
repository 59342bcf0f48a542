#!/usr/bin/env python3
"""Launch-by-launch times of the fused kernel and cuBLAS bf16 in a burst, with the SM clock,
the power and the clock-limit reasons NVML reports during it.

`ternary bench` times 20 graph replays after an idle pause; at M = 4096 the fused kernel reads
0.83-0.88x cuBLAS there, while one launch under ncu is within 1.5 % (fourteenth session) and
a sustained run 0.99-1.01x. This separates the two explanations: if the fused kernel's time a
launch grows over the burst while its cycles a launch (time x SM clock) stay put, the clock
is what it loses; if its first launch is already slow, it is cycles.

Each case: `--settle` idle seconds, then `--ms` milliseconds of back-to-back calls (weights
rotated past L2, as the bench does), an event between every two calls; a thread samples NVML
every 2 ms. Run from the repository root after building the extension in place:
  python3 bench/burst_trace.py --shapes 4096x22016 4096x4096 --m 1024 4096 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

# windows (ms from the first launch) the table summarises
WINDOWS = ((0, 5), (5, 20), (20, 50), (50, 100), (100, 200), (200, 400), (400, 1000))
# nvmlClocksEventReasons bits (nvml.h)
REASONS = {0x4: "sw-power", 0x8: "hw-slow", 0x20: "sw-thermal", 0x40: "hw-thermal",
           0x80: "hw-power-brake", 0x100: "display", 0x1: "idle", 0x2: "app-clocks"}
NVML_FI_DEV_POWER_INSTANT = 186


class Nvml:
    """The few NVML calls this needs, through ctypes (pynvml is not on the GPU machine)."""

    class _Field(ctypes.Structure):
        _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                    ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                    ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                    ("value", ctypes.c_ulonglong)]

    def __init__(self, index: int):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.h = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)),
                    f"nvmlDeviceGetHandleByIndex_v2({index})")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"NVML {what} returned {rc}")

    def sample(self) -> tuple[int, float, float, int]:
        """(SM MHz, instant W (NaN if the driver lacks it), average W, clock-limit reasons)."""
        mhz, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(mhz))  # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw))
        self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.h, ctypes.byref(reasons))
        f = self._Field(fieldId=NVML_FI_DEV_POWER_INSTANT)
        rc = self.lib.nvmlDeviceGetFieldValues(self.h, 1, ctypes.byref(f))
        inst = f.value / 1e3 if rc == 0 and f.nvmlReturn == 0 else float("nan")
        return mhz.value, inst, mw.value / 1e3, reasons.value


def sampler(nvml: Nvml, out: list, stop: threading.Event, period_s: float = 0.002) -> None:
    while not stop.is_set():
        out.append((time.perf_counter(), *nvml.sample()))
        time.sleep(period_s)


def build_cases(k: int, n: int, m: int, device) -> dict:
    from ternary import kernels, ops
    from ternary.gemm_bench import _copies

    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    copies = _copies(k * n // 4, l2)
    codes = [torch.randint(-1, 2, (n, k), dtype=torch.int8, device=device) for _ in range(copies)]
    scales = [torch.rand(n, device=device) + 0.5 for _ in range(copies)]
    packed = [ops.pack(c) for c in codes]
    fused = kernels.FusedKernel()
    prepared = [fused.prepare(p, s, 0) for p, s in zip(packed, scales)]
    dense = [ops.dequantize(packed[i], scales[i], 0, torch.bfloat16)
             for i in range(_copies(2 * k * n, l2))]
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    return {
        "fused": [lambda p=p: ops.gemm_fused(x, p.repacked, p.scale, 0, n) for p in prepared],
        "cublas": [lambda w=w: torch.mm(x, w.t()) for w in dense],
    }


def trace(calls, ms: float, settle_s: float, nvml: Nvml | None) -> dict:
    """Per-launch times (us) over a burst of about `ms` milliseconds, and the NVML samples."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for c in calls:
        c()
    e.record()
    e.synchronize()
    per_call_ms = s.elapsed_time(e) / len(calls)
    count = max(len(calls), int(ms / per_call_ms))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    samples: list = []
    stop = threading.Event()
    time.sleep(settle_s)
    th = None
    if nvml is not None:
        th = threading.Thread(target=sampler, args=(nvml, samples, stop), daemon=True)
        th.start()
        time.sleep(0.01)
    t0 = time.perf_counter()
    events[0].record()
    for i in range(count):
        calls[i % len(calls)]()
        events[i + 1].record()
    events[-1].synchronize()
    t1 = time.perf_counter()
    stop.set()
    if th is not None:
        th.join()
    us = [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(count)]
    return {"us": us, "host_t0": t0, "host_t1": t1, "samples": samples}


def launch_starts(us: list[float]) -> list[float]:
    """Milliseconds from the first launch's start to each launch's start."""
    starts, t = [], 0.0
    for u in us:
        starts.append(t)
        t += u / 1e3
    return starts


def summarise(tr: dict) -> list[dict]:
    """Per window: median us a launch, mean SM MHz, W, reasons seen, cycles a launch."""
    us = tr["us"]
    starts = launch_starts(us)
    t = sum(us) / 1e3
    # GPU time 0 is taken as the host time the last launch completed minus the total GPU time
    # (the queue is full long before the GPU starts, so the GPU end is the host's sync return)
    gpu0 = tr["host_t1"] - t / 1e3
    out = []
    for lo, hi in WINDOWS:
        sel = [u for u, s0 in zip(us, starts) if lo <= s0 < hi]
        if not sel:
            continue
        smp = [s for s in tr["samples"] if lo <= (s[0] - gpu0) * 1e3 < hi]
        mhz = statistics.mean(s[1] for s in smp) if smp else float("nan")
        inst = [s[2] for s in smp if s[2] == s[2]]
        reasons = 0
        for s in smp:
            reasons |= s[4]
        med = statistics.median(sel)
        out.append({"window_ms": [lo, hi], "launches": len(sel), "median_us": med,
                    "first_us": sel[0], "sm_mhz": mhz,
                    "power_w": statistics.mean(inst) if inst else
                    (statistics.mean(s[3] for s in smp) if smp else float("nan")),
                    "reasons": [v for b, v in REASONS.items() if reasons & b],
                    "mcycles": med * mhz / 1e6 if smp else float("nan"),
                    "samples": len(smp)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["4096x22016", "4096x4096"])
    p.add_argument("--m", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--ms", type=float, default=1000.0, help="burst length, milliseconds")
    p.add_argument("--settle", type=float, default=1.0, help="idle seconds before each burst")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    from ternary.gemm_bench import parse_shapes

    shapes = parse_shapes(args.shapes)
    if any(m < 1 for m in args.m) or args.ms <= 0 or args.settle < 0:
        raise SystemExit(f"--m {args.m}, --ms {args.ms}, --settle {args.settle}: give positive "
                         "batch sizes and burst length, and idle seconds >= 0")
    if not torch.cuda.is_available():
        raise SystemExit(f"burst_trace needs a CUDA GPU; torch {torch.__version__} sees none")
    from rich.console import Console
    from rich.table import Table

    device = torch.device("cuda")
    try:
        nvml = Nvml(device.index or 0)
    except (OSError, RuntimeError) as e:
        print(f"NVML unavailable ({e}): times only")
        nvml = None
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "settle_s": args.settle, "ms": args.ms, "cases": []}
    console = Console(width=150)
    for k, n in shapes:
        for m in args.m:
            cases = build_cases(k, n, m, device)
            t = Table(title=f"{k} x {n}, M = {m}: median us a launch / SM MHz / W / Mcycles")
            t.add_column("window ms")
            for name in cases:
                t.add_column(name, justify="right")
            t.add_column("cuBLAS / fused", justify="right")
            t.add_column("limits (fused; cublas)")
            summ = {}
            for name, calls in cases.items():
                tr = trace(calls, args.ms, args.settle, nvml)
                summ[name] = summarise(tr)
                result["cases"].append({"k": k, "n": n, "m": m, "kernel": name,
                                        "windows": summ[name], "us": tr["us"]})
            for wf, wc in zip(summ["fused"], summ["cublas"]):
                t.add_row(f"{wf['window_ms'][0]}-{wf['window_ms'][1]}",
                          *(f"{w['median_us']:.1f} / {w['sm_mhz']:.0f} / {w['power_w']:.0f} / "
                            f"{w['mcycles']:.3f}" for w in (wf, wc)),
                          f"{wc['median_us'] / wf['median_us']:.3f}",
                          f"{','.join(wf['reasons']) or '-'}; {','.join(wc['reasons']) or '-'}")
            console.print(t)
            f0, c0 = summ["fused"][0], summ["cublas"][0]
            console.print(f"first launch: fused {f0['first_us']:.1f} us, cuBLAS "
                          f"{c0['first_us']:.1f} us")
            del cases
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
