"""`ternary make-tiny DIR`: write the tiny deterministic ternary Llama model (ternary.tiny)."""

from __future__ import annotations

import sys
from pathlib import Path


def add_arguments(p) -> None:
    from ternary import tiny

    p.add_argument("out", type=Path, help="directory to write (created; files overwritten)")
    p.add_argument("--format", default="ternary", choices=tiny.FORMATS,
                   help="ternary: canonical v1; bitnet: transformers' layout (Llama arch)")
    p.add_argument("--scale", default="channel", choices=tiny.SCALES,
                   help="scale granularity of the ternary format (bitnet: one per tensor)")
    p.add_argument("--group-size", type=int, default=32, help="with --scale group")
    p.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    from rich.console import Console

    from ternary import tiny

    console = Console()
    try:
        with console.status(f"writing {args.out}"):
            tiny.make(args.out, args.format, args.scale, args.group_size, args.seed)
    except ValueError as e:
        print(f"ternary make-tiny: {e}", file=sys.stderr)
        return 2
    for f in sorted(args.out.iterdir()):
        console.print(f"  {f.name:28} {f.stat().st_size:>10,} bytes")
    console.print(f"tiny {args.format} model in {args.out}")
    return 0
