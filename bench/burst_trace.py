#!/usr/bin/env python3
"""Launch-by-launch times of the fused kernel and cuBLAS bf16 in a burst, with the SM clock,
the power and the clock-limit reasons NVML reports during it.

It separates clock from cycles: if a kernel's time a launch grows over the burst while its
cycles a launch (time x SM clock) stay put, the clock is what it loses; if its first launches
are already slow, it is cycles. (It is how `ternary bench`'s timing window came about: timed
over 20 graph replays, two kernels were measured at different points of their bursts,
docs/performance.md.)

Each case: `--settle` idle seconds, then about `--ms` milliseconds of back-to-back calls (the
launch count comes from one timed pass over the weight copies, so the burst runs 0.85-1.15x
that), weights rotated past L2 as the bench does, an event between every two calls; a thread
samples NVML every 2 ms. The samples are placed on the launches' timeline by the host time
at which the last launch completed, so they can be off by a few milliseconds, and NVML's
own readings lag (the instant power by 50-100 ms, seen on the H200). Run from the repository
root after building the extension in place:
  python3 bench/burst_trace.py --shapes 4096x22016 4096x4096 --m 1024 4096 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
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
    """The few NVML calls this needs, through ctypes (pynvml is not on the GPU machine). A
    reading whose call fails is NaN (clock, power) or -1 (reasons)."""

    class _Field(ctypes.Structure):
        _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                    ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                    ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                    ("value", ctypes.c_ulonglong)]

    def __init__(self, device: torch.device):
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        try:
            self._clock, self._power = lib.nvmlDeviceGetClockInfo, lib.nvmlDeviceGetPowerUsage
            self._fields = lib.nvmlDeviceGetFieldValues
            self._reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                lib.nvmlDeviceGetCurrentClocksThrottleReasons
            init, by_index = lib.nvmlInit_v2, lib.nvmlDeviceGetHandleByIndex_v2
        except AttributeError as e:
            raise RuntimeError(f"libnvidia-ml.so.1 lacks {e}") from None
        self._check(init(), "nvmlInit_v2")
        # NVML numbers GPUs regardless of CUDA_VISIBLE_DEVICES; torch maps its index to NVML's
        to_nvml = getattr(torch.cuda, "_get_nvml_device_index", None)
        index = to_nvml(device) if to_nvml else torch.cuda._utils._get_device_index(device, True)
        self.h = ctypes.c_void_p()
        self._check(by_index(index, ctypes.byref(self.h)), f"nvmlDeviceGetHandleByIndex({index})")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"NVML {what} returned {rc}")

    def sample(self) -> tuple[float, float, float, int]:
        """(SM MHz, instant W, average W, clock-limit reasons)."""
        mhz, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        nan = float("nan")
        clock = mhz.value if self._clock(self.h, 1, ctypes.byref(mhz)) == 0 else nan  # SM
        avg = mw.value / 1e3 if self._power(self.h, ctypes.byref(mw)) == 0 else nan
        why = reasons.value if self._reasons(self.h, ctypes.byref(reasons)) == 0 else -1
        f = self._Field(fieldId=NVML_FI_DEV_POWER_INSTANT)
        rc = self._fields(self.h, 1, ctypes.byref(f))
        inst = f.value / 1e3 if rc == 0 and f.nvmlReturn == 0 else nan
        return clock, inst, avg, why


def sampler(nvml: Nvml, out: list, stop: threading.Event, period_s: float = 0.002) -> None:
    while not stop.is_set():
        out.append((time.perf_counter(), *nvml.sample()))
        time.sleep(period_s)


def build_cases(k: int, n: int, m: int, device) -> dict:
    from ternary import kernels, ops
    from ternary.tools.gemm_bench import weight_copies

    _, _, _, prepared, dense = weight_copies(k, n, device, torch.bfloat16,
                                             kernels.FusedKernel())
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
        clocks = [s[1] for s in smp if s[1] == s[1]]
        mhz = statistics.mean(clocks) if clocks else float("nan")
        inst = [s[2] for s in smp if s[2] == s[2]]
        reasons = 0
        for s in smp:
            reasons |= max(s[4], 0)
        med = statistics.median(sel)
        out.append({"window_ms": [lo, hi], "launches": len(sel), "median_us": med,
                    "first_us": sel[0], "sm_mhz": mhz,
                    "power_w": statistics.mean(inst) if inst else
                    (statistics.mean(s[3] for s in smp) if smp else float("nan")),
                    "reasons": [v for b, v in REASONS.items() if reasons & b],
                    "mcycles": med * mhz / 1e6,
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
    from ternary.tools.gemm_bench import parse_shapes

    shapes = parse_shapes(args.shapes)
    if any(m < 1 for m in args.m) or not 0 < args.ms < math.inf or not 0 <= args.settle < 60:
        raise SystemExit(f"--m {args.m}, --ms {args.ms}, --settle {args.settle}: give positive "
                         "batch sizes and burst length, and idle seconds >= 0")
    if not torch.cuda.is_available():
        raise SystemExit(f"burst_trace needs a CUDA GPU; torch {torch.__version__} sees none")
    from rich.console import Console
    from rich.table import Table

    device = torch.device("cuda")
    try:
        nvml = Nvml(device)
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
            cub = {tuple(w["window_ms"]): w for w in summ["cublas"]}
            for wf in summ["fused"]:  # the windows both bursts reached
                wc = cub.get(tuple(wf["window_ms"]))
                if wc is None:
                    continue
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
