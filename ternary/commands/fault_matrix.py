"""`ternary fault-matrix`: real servers, real faults, a table (ternary.tools.fault_matrix)."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    from ternary.tools.fault_matrix import TINY_MODELS

    p.add_argument("--short", action="store_true",
                   help="one server, three faults (dropped streams, flood, SIGKILL of the "
                        "engine): what .ci/run runs")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--only", default="", metavar="FAULTS",
                   help="comma-separated subset of the full matrix: streams, flood, sigterm, "
                        "engine, worker, server (sigterm always runs with the first three)")
    p.add_argument("--parallel", action="store_true",
                   help="each group of faults on its own server at the same time, each in a "
                        "process of its own (streams+flood+sigterm, engine, worker, server)")
    p.add_argument("--load", action="store_true",
                   help="instead: 2,000 requests from 128 clients (a fifth malformed) on each "
                        "model, p50/p99, then a memory soak (slow: not for CI)")
    p.add_argument("--soak-s", type=float, default=600, help="with --load: the soak (s)")
    p.add_argument("--requests", type=int, default=2000, help="with --load")
    p.add_argument("--clients", type=int, default=128, help="with --load")
    p.add_argument("--formats", default=",".join(TINY_MODELS),
                   help=f"with --load: make-tiny models to serve, comma-separated, from "
                        f"{list(TINY_MODELS)} (bitnet-arch: BitNetForCausalLM; default: all)")
    p.add_argument("--work", type=Path, help="models and server logs here (kept)")
    p.add_argument("--health-timeout", type=float, default=600)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the servers' --dtype (bfloat16 on a GPU whose attention takes no float32)")
    p.add_argument("--server-args", default="", metavar="ARGS",
                   help="more `ternary serve` options for every server, one string, e.g. "
                        "'--distributed-executor-backend mp' (a worker process on one GPU)")


def run(args) -> int:
    import shlex

    from ternary.tools import fault_matrix

    return fault_matrix.main(args.short, args.json, load=args.load, soak_s=args.soak_s,
                             total=args.requests, clients=args.clients,
                             formats=tuple(f for f in args.formats.split(",") if f),
                             work=args.work, health_timeout=args.health_timeout,
                             only=tuple(f for f in args.only.split(",") if f),
                             dtype=args.dtype, server_args=tuple(shlex.split(args.server_args)),
                             in_parallel=args.parallel)
