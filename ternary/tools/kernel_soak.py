"""Launch `linear_fused` over and over, one process a GPU, until a kernel does not finish or
the time is up: a hang that comes once in a few hundred launches shows up here, named by
shape, launch count and whether the host had queued the kernel or was still launching it.

    ternary kernel-soak [--m 16384] [--tp 2] [--seconds 60] [--gpus 0,1]
                                  [--variants default,nopersist,nopdl,queued] [--json F]

Each variant runs in fresh processes (the C++ switches are read once a process), all GPUs at
once, Llama-2-7B's per-rank shapes at tensor parallel --tp in turn (ternary.tools.tp_kernels). `sync`
variants synchronize after every launch (as tp_kernels --sync, where a kernel hang shows
without vLLM); `queued` ones every 16. A process that passes its time
plus --grace is stopped; its last progress line, nvidia-smi's utilization of its GPU and its
Python stack (faulthandler, armed just before the parent gives up) go into the report.
Every shape's output is checked against float64 at the start and at the end."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ternary.tools.tp_kernels import TOL, llama7b_shapes

# name -> (environment, synchronize after every launch)
VARIANTS = {
    "default": ({}, True),
    "queued": ({}, False),
    "nopersist": ({"TERNARY_PERSISTENT": "0"}, True),
    "nopdl": ({"TERNARY_PDL": "0"}, True),
    "cublas": ({"TERNARY_LARGE_M_MAX": "1"}, True),  # every M > 1: dequantize + cuBLAS
}
QUEUE_DEPTH = 16  # launches between syncs in the queued variants


class SoakError(RuntimeError):
    pass


def _child(args) -> int:
    import torch

    from ternary import ops
    from ternary.kernels import FUSED_MAX_M

    prog = open(args.progress, "a", buffering=1)  # noqa: SIM115 (open for the whole run)
    # the parent stops this process at seconds + grace; the stack lands just before that
    faulthandler.dump_traceback_later(args.seconds + args.grace - 3, exit=False,
                                      file=open(args.stack, "w"))  # noqa: SIM115
    if not torch.cuda.is_available():
        raise SoakError("kernel_soak launches the fused kernel: it needs a CUDA GPU, and "
                        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} "
                        "shows none here")
    dev = torch.device("cuda", 0)
    torch.manual_seed(args.seed)
    layers = []
    for name, k, n in llama7b_shapes(args.tp):
        codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device=dev)
        scale = ((torch.rand(n, device=dev) + 0.5) / k ** 0.5).float()
        x = torch.randn(args.m, k, device=dev, dtype=torch.bfloat16)
        layers.append((name, k, n, codes, scale, x, ops.repack(ops.pack(codes))))

    def check(when):
        for name, k, n, codes, scale, x, rp in layers:
            y = ops.linear_fused(x, rp, None, scale, 0, n, FUSED_MAX_M)
            ref = x.double() @ (codes.double() * scale.double().view(-1, 1)).t()
            err = ((y.double() - ref).norm() / ref.norm()).item()
            prog.write(f"check {when} {name} rel_err {err:.3e}\n")
            if not err < TOL:
                raise SoakError(f"{name} M={args.m} K={k} N={n}: relative error {err:.3g} "
                                f"against float64 ({when}), limit {TOL}")

    check("start")
    torch.cuda.synchronize()
    end, launches = time.time() + args.seconds, 0
    while time.time() < end:
        for name, k, n, _, scale, x, rp in layers:
            prog.write(f"launch {launches} {name} M={args.m} K={k} N={n}\n")
            ops.linear_fused(x, rp, None, scale, 0, n, FUSED_MAX_M)
            launches += 1
            if args.sync or launches % QUEUE_DEPTH == 0:
                prog.write(f"sync {launches} (after {name})\n")
                torch.cuda.synchronize()
    torch.cuda.synchronize()
    check("end")
    torch.cuda.synchronize()
    prog.write(f"done {launches}\n")
    faulthandler.cancel_dump_traceback_later()
    return 0


def _child_command(base: Path, m: int, seconds: float, grace: float, seed: int,
                   sync: bool, tp: int = 2) -> list[str]:
    cmd = [sys.executable, "-m", "ternary", "kernel-soak", "--child", "--m", str(m),
           "--tp", str(tp), "--seconds", str(seconds), "--grace", str(grace), "--seed", str(seed),
           "--progress", str(base.with_suffix(".progress")),
           "--stack", str(base.with_suffix(".stack"))]
    return cmd + ["--sync"] if sync else cmd


def _utilization(gpu: int) -> str:
    try:
        r = subprocess.run(["nvidia-smi", "-i", str(gpu), "--format=csv,noheader",
                            "--query-gpu=utilization.gpu,memory.used"],
                           capture_output=True, text=True, timeout=20, check=False)
        return r.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"(nvidia-smi: {e})"


def run_variant(name: str, gpus: list[int], m: int, seconds: float, grace: float,
                workdir: Path, seed: int, startup: float = 60, tp: int = 2) -> list[dict]:
    """One process a GPU under variant `name`; a row a GPU: ok, hung, launches, the last
    progress line, and for a hung one its GPU's utilization and Python stack."""
    if name not in VARIANTS:
        raise SoakError(f"unknown variant {name!r}; variants: {', '.join(VARIANTS)}")
    env_extra, sync = VARIANTS[name]
    procs = []
    for gpu in gpus:
        base = workdir / f"{name}-gpu{gpu}"
        for suffix in (".progress", ".stack", ".err"):
            base.with_suffix(suffix).unlink(missing_ok=True)
        env = {**os.environ, **env_extra, "CUDA_VISIBLE_DEVICES": str(gpu)}
        cmd = _child_command(base, m, seconds, grace, seed + gpu, sync, tp)
        err = open(base.with_suffix(".err"), "w")  # noqa: SIM115 (closed below)
        procs.append((gpu, base, err, subprocess.Popen(cmd, env=env, stderr=err,
                                                       stdout=subprocess.DEVNULL)))
    deadline = time.time() + seconds + grace + startup  # start-up: weights, checks
    out = []
    for gpu, base, err, p in procs:
        try:
            p.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    for gpu, base, err, p in procs:
        hung = p.poll() is None
        util = _utilization(gpu) if hung else ""
        if hung:
            time.sleep(4)  # the stack's watchdog fires before the deadline; let it write
            p.kill()
            p.wait(30)
        err.close()
        lines = base.with_suffix(".progress").read_text().splitlines() \
            if base.with_suffix(".progress").exists() else []
        launches = [ln for ln in lines if ln.startswith("launch ")]
        checks = [ln for ln in lines if ln.startswith("check ")]
        stack = base.with_suffix(".stack").read_text() if base.with_suffix(".stack").exists() \
            else ""
        tail = base.with_suffix(".err").read_text()[-2000:]
        out.append({
            "variant": name, "gpu": gpu, "m": m, "tp": tp, "sync": sync, "env": env_extra,
            "ok": not hung and p.returncode == 0, "hung": hung, "returncode": p.returncode,
            "launches": len(launches), "last": lines[-1] if lines else "(never started)",
            "checks": checks, "utilization": util, "stack": stack if hung else "",
            "stderr_tail": tail if p.returncode not in (0, None) or hung else ""})
    return out


def add_arguments(p) -> None:
    p.add_argument("--m", type=int, default=16384, help="token count (rows of x)")
    p.add_argument("--tp", type=int, default=2,
                   help="Llama-2-7B's per-rank shapes at this tensor parallel size (1, 2, 4)")
    p.add_argument("--seconds", type=float, default=60, help="launching time a variant")
    p.add_argument("--grace", type=float, default=20,
                   help="seconds past --seconds before a process counts as hung")
    p.add_argument("--gpus", default=None, help="GPU indices (default: all)")
    p.add_argument("--variants", default="default,nopersist",
                   help=f"comma-separated, in order, of: {', '.join(VARIANTS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sync", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--progress", help=argparse.SUPPRESS)
    p.add_argument("--stack", help=argparse.SUPPRESS)


def run_cli(args) -> int:
    if args.child:
        return _child(args)
    import tempfile

    import torch

    if args.m < 1 or args.seconds <= 0:
        print(f"error: --m {args.m} and --seconds {args.seconds} must be positive",
              file=sys.stderr)
        return 2
    try:
        llama7b_shapes(args.tp)
    except ValueError as e:
        print(f"error: --tp {args.tp}: {e}", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        print(f"error: --variants {args.variants!r}: unknown {bad}; choose from "
              f"{', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    count = torch.cuda.device_count()
    try:
        gpus = list(range(count)) if args.gpus is None else \
            [int(v) for v in args.gpus.split(",") if v.strip()]
    except ValueError:
        gpus = []
    if not gpus or any(not 0 <= g < count for g in gpus):
        print(f"error: --gpus {args.gpus!r}: this machine shows {count} CUDA GPU(s); name "
              "indices below that (default: all)", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ternary-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(width=160)
    rows = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("soak", total=len(variants))
        for v in variants:
            bar.update(task, description=f"{v}: {len(gpus)} GPU(s), {args.seconds:.0f} s")
            t0 = time.time()
            res = run_variant(v, gpus, args.m, args.seconds, args.grace, workdir, args.seed,
                              tp=args.tp)
            for r in res:
                r["seconds"] = round(time.time() - t0, 1)
            rows += res
            bar.advance(task)
    t = Table(title=f"kernel soak: linear_fused, Llama-2-7B TP={args.tp} shapes, M={args.m}")
    for c in ("variant", "gpu", "result", "launches", "last progress line", "GPU util, mem"):
        t.add_column(c)
    for r in rows:
        result = "HUNG" if r["hung"] else "ok" if r["ok"] else f"FAILED rc={r['returncode']}"
        t.add_row(r["variant"], str(r["gpu"]), result, str(r["launches"]), r["last"],
                  r["utilization"])
    console.print(t)
    for r in rows:
        if r["stack"]:
            console.print(f"[bold]{r['variant']} GPU {r['gpu']}: Python stack[/]\n{r['stack']}")
        if r["stderr_tail"]:
            console.print(f"[bold]{r['variant']} GPU {r['gpu']}: stderr[/]\n{r['stderr_tail']}")
    if args.json:
        doc = {"m": args.m, "tp": args.tp, "seconds": args.seconds, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1

