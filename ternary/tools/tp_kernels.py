"""The fused kernel between tensor-parallel all-reduces, without vLLM: one process a GPU
(NCCL), each running a Llama layer's pattern on its rank's shapes (qkv, o_proj + all-reduce,
gate_up, SiLU-and-mul, down_proj + all-reduce) through `linear_fused`, the op the vLLM plugin
calls, at decode, prefill and profiling-run token counts. Each rank checks its layer outputs
against float64 before and after the all-reduce, and writes a progress line before every op,
so a run that stops names the op and the token count where each rank stopped.

    ternary tp-kernels [--world 2] [--m 1,16,128,2048,8192,16384] [--sync]
                                 [--comm c10d|pynccl] [--device cuda|cpu] [--json F]

--comm pynccl sums through vLLM's PyNcclCommunicator, on the compute stream as vLLM's
workers do (c10d runs NCCL on a stream of its own, which orders it against the kernels
through events); it needs vLLM importable. --device cpu runs the same program on the
reference ops over gloo (a dry run without GPUs).

It tells a hang of the kernels from one of the engine: vLLM's offline engine with ternary
weights at tensor parallel 2 once stopped on two H200s while each kernel alone passed (the
persistent large-M kernel, since fixed: docs/kernels.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

# vLLM's layers (ternary.formats.modules.vllm_layer_shapes) by the names this tool reports,
# with whether each is row-parallel (tensor parallelism splits its K; else its N)
_LAYERS = {"self_attn.qkv_proj": ("qkv", False), "self_attn.o_proj": ("o_proj", True),
           "mlp.gate_up_proj": ("gate_up", False), "mlp.down_proj": ("down_proj", True)}


def llama7b_shapes(tp: int) -> tuple[tuple[str, int, int], ...]:
    """Llama-2-7B's linear layers (bigmodel.SHAPES["llama2-7b"]) on one rank of `tp`: (name,
    K, N) of qkv (column-parallel, merged), o_proj (row-parallel), gate_up (column-parallel,
    merged) and down_proj (row-parallel)."""
    # imported when called: ternary.formats imports torch, which a rank process imports only
    # once it has set NCCL_ENV (_rank_main), after it has imported this module
    from ternary.formats.modules import vllm_layer_shapes
    from ternary.tools.synthetic import bigmodel

    dims = bigmodel.SHAPES["llama2-7b"]
    hidden, inter = dims["hidden_size"], dims["intermediate_size"]
    if tp < 1 or hidden % tp or inter % tp:
        raise ValueError(f"tensor parallel {tp} does not divide Llama-2-7B's hidden size "
                         f"{hidden} and intermediate size {inter}")
    out = []
    for layer, (n, k) in vllm_layer_shapes(bigmodel.widths(dims)).items():
        name, row = _LAYERS[layer]
        out.append((name, k // tp, n) if row else (name, k, n // tp))
    return tuple(out)

DEFAULT_M = (1, 16, 128, 2048, 8192, 16384)
# bf16 operands and outputs (tests/test_ops_gpu.py: TOL)
TOL = 1e-2
# NVLink multicast stays off (device KINDS.md: it can take the host's GPUs out of service)
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


class TpKernelsError(RuntimeError):
    pass


def _progress(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(f"{time.time():.3f} {line}\n")


def _rank_main(rank: int, world: int, init: str, ms: list[int], layers: int, sync: bool,
               workdir: str, seed: int, comm: str, device: str, shapes) -> None:
    os.environ.update(NCCL_ENV)
    import torch
    import torch.distributed as dist

    from ternary import ops
    from ternary.kernels import FUSED_MAX_M

    prog = Path(workdir) / f"rank{rank}.progress"
    result: dict = {"rank": rank, "ok": False, "checks": []}
    cuda = device == "cuda"

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    try:
        if cuda:
            torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if not cuda:  # a dry run of this logic on the reference ops (tests)
            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        elif comm == "pynccl":
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

            dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
            nccl = PyNcclCommunicator(dist.group.WORLD, device=dev)
            if nccl.disabled:
                raise TpKernelsError("vLLM's PyNcclCommunicator found no NCCL library (or "
                                     "VLLM_DISABLE_PYNCCL is set); use --comm c10d")
        else:
            dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world,
                                    device_id=dev)
        torch.manual_seed(seed * 1000 + rank)  # each rank its own weights, like TP shards
        layer = {}
        dims = {name: (k, n) for name, k, n in shapes}
        hidden, attn, inter = dims["qkv"][0], dims["o_proj"][0], dims["down_proj"][0]
        for name, k, n in shapes:
            codes = torch.randint(-1, 2, (n, k), dtype=torch.int8, device=dev)
            scale = (torch.rand(n, device=dev) + 0.5) / k ** 0.5
            packed = ops.pack(codes)
            dense = codes.double() * scale.double().view(-1, 1)
            # as the plugin holds it: the repacked tiles only (its large-M fallback
            # dequantizes those)
            layer[name] = (ops.repack(packed), scale, n, dense)
        _progress(prog, "weights ready")

        def lf(name, x):
            repacked, scale, n, _ = layer[name]
            _progress(prog, f"{name} M={x.shape[0]} K={x.shape[1]}")
            y = ops.linear_fused(x, repacked, None, scale, 0, n, FUSED_MAX_M)
            if sync:
                synchronize()
            return y

        def all_reduce(t, what):
            _progress(prog, f"all_reduce {what} {tuple(t.shape)} {t.dtype} ({comm})")
            if comm == "pynccl":
                t = nccl.all_reduce(t)
            else:
                dist.all_reduce(t)
            if sync:
                synchronize()
            return t

        def check(what, y, ref):
            err = ((y.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            finite = bool(torch.isfinite(y).all())
            result["checks"].append({"what": what, "rel_err": err, "finite": finite})
            if not finite or not err < TOL:
                raise TpKernelsError(f"rank {rank}: {what}: relative error {err:.3g} (limit "
                                     f"{TOL}), finite {finite}")

        def row_parallel(name, x, m, checked):
            """A row-parallel layer: each rank's partial sum, then the all-reduce; checked
            against float64 (the reference summed the same way) where `checked`."""
            y = lf(name, x)
            if checked:
                ref = x.double() @ layer[name][3].t()
                check(f"{name} M={m}", y, ref)
                ref = all_reduce(ref, f"{name} float64 reference")
            y = all_reduce(y, f"{name} M={m}")
            if checked:
                check(f"{name} + all_reduce M={m}", y, ref)
            return y

        for m in ms:
            gen = torch.Generator(device=dev).manual_seed(seed + m)  # the same h on every rank
            h = torch.randn(m, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
            for i in range(layers):
                last = i == layers - 1
                qkv = lf("qkv", h)
                a = qkv[:, :attn].contiguous()  # attention's output has o_proj's K per rank
                o = row_parallel("o_proj", a, m, last)
                gu = lf("gate_up", o)
                act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
                d = row_parallel("down_proj", act, m, last)
                h = (d / d.abs().amax().clamp_min(1e-3)).to(torch.bfloat16)
            synchronize()
            _progress(prog, f"M={m} done")
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 (the parent reports it, with the rank's progress)
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        (Path(workdir) / f"rank{rank}.json").write_text(json.dumps(result))
        _progress(prog, "exit")
        # the result is written; a peer that already left can make the teardown fail
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()


def run(world: int = 2, ms=DEFAULT_M, layers: int = 2, sync: bool = False,
        timeout: float = 240, workdir: Path | None = None, seed: int | None = None,
        say=print, comm: str = "c10d", device: str = "cuda", shapes=None) -> dict:
    """Runs the ranks; returns {"ok", "hung", "ranks": [{rank, ok, error, checks, last}]}
    where `last` is the last progress line of a rank (the op it was in when it stopped).
    device "cpu" runs the same logic on the reference ops over gloo (a dry run, for tests);
    shapes: (name, K, N) of qkv, o_proj, gate_up and down_proj on one rank (default:
    Llama-2-7B's at tensor parallel 2, llama7b_shapes(2))."""
    import importlib.util
    import multiprocessing as mp
    import random
    import socket
    import tempfile

    import torch

    if shapes is None:
        shapes = llama7b_shapes(2)
    if comm not in ("c10d", "pynccl"):
        raise TpKernelsError(f"--comm {comm!r}: use c10d or pynccl")
    if device == "cpu" and comm != "c10d":
        raise TpKernelsError("the CPU dry run sums through torch.distributed (gloo): --comm c10d")
    if comm == "pynccl" and importlib.util.find_spec("vllm") is None:
        raise TpKernelsError("--comm pynccl sums through vLLM's PyNcclCommunicator; vLLM is not "
                             f"importable by {sys.executable} (use --comm c10d)")
    if device == "cuda" and torch.cuda.device_count() < world:
        raise TpKernelsError(f"--world {world} needs {world} GPUs; this machine has "
                             f"{torch.cuda.device_count()}")
    workdir = Path(workdir or tempfile.mkdtemp(prefix="ternary-tp-kernels-"))
    workdir.mkdir(parents=True, exist_ok=True)
    seed = random.randrange(2**31) if seed is None else seed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, world, f"tcp://127.0.0.1:{port}",
                                                   list(ms), layers, sync, str(workdir), seed,
                                                   comm, device, tuple(shapes)))
             for r in range(world)]
    say(f"tp-kernels: {world} ranks, all-reduce through {comm}, M {list(ms)}, {layers} layers, "
        f"{'a sync after every op' if sync else 'no syncs (as vLLM queues)'}, seed {seed}, "
        f"at most {timeout:.0f} s")
    start = time.time()
    for p in procs:
        p.start()
    hung = False
    for p in procs:
        p.join(max(1.0, timeout - (time.time() - start)))
        hung = hung or p.is_alive()
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    ranks = []
    for r in range(world):
        f, prog = workdir / f"rank{r}.json", workdir / f"rank{r}.progress"
        doc = json.loads(f.read_text()) if f.exists() else {
            "rank": r, "ok": False, "checks": [],
            "error": f"no result: stopped after {timeout:.0f} s" if hung else
                     f"no result (exit code {procs[r].exitcode})"}
        lines = prog.read_text().splitlines() if prog.exists() else []
        doc["last"] = lines[-1].split(" ", 1)[1] if lines else "(never started)"
        ranks.append(doc)
    return {"ok": all(d["ok"] for d in ranks) and not hung, "hung": hung, "seed": seed,
            "world": world, "comm": comm, "m": list(ms), "layers": layers, "sync": sync,
            "seconds": round(time.time() - start, 1), "ranks": ranks}


def add_arguments(p) -> None:
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--m", default=",".join(map(str, DEFAULT_M)), help="token counts")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sync", action="store_true", help="synchronize after every op")
    p.add_argument("--comm", default="c10d", choices=["c10d", "pynccl"],
                   help="the all-reduce: torch.distributed's NCCL, or vLLM's PyNcclCommunicator")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a dry run of the same program on the reference ops over gloo")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", type=Path)


def run_cli(args) -> int:
    try:
        ms = [int(v) for v in args.m.split(",") if v.strip()]
        report = run(args.world, ms, args.layers, args.sync, args.timeout, seed=args.seed,
                     comm=args.comm, device=args.device)
    except (ValueError, TpKernelsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"tp-kernels: {report['world']} ranks, {report['comm']}, "
                    f"{'sync after each op' if report['sync'] else 'queued'}, "
                    f"{report['seconds']} s"
                    f"{', HUNG' if report['hung'] else ''}")
    for c in ("rank", "ok", "last op", "worst rel err", "error"):
        t.add_column(c)
    for d in report["ranks"]:
        worst = max((c["rel_err"] for c in d["checks"]), default=float("nan"))
        t.add_row(str(d["rank"]), "yes" if d["ok"] else "NO", d["last"], f"{worst:.2e}",
                  d.get("error", ""))
    Console(width=160).print(t)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1

