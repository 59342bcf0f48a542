"""`ternary targets`: the target matrix as envs/targets.toml states it."""

from __future__ import annotations

import dataclasses
import json


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    import sys

    from ternary._build import matrix

    try:
        targets = matrix.load()
    except matrix.MatrixError as e:
        print(f"ternary targets: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(e)}))
        return 2
    if args.json:
        print(json.dumps({n: dataclasses.asdict(t) for n, t in targets.items()}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=str(matrix.TARGETS_TOML))
    for col in ("target", "GPU", "archs", "CUDA", "torch", "vLLM", "notes"):
        table.add_column(col)
    for t in targets.values():
        table.add_row(t.name, t.gpu, ";".join(t.arch_list) or "none",
                      t.cuda.version if t.cuda else "none", t.torch, t.vllm or "none", t.notes)
    Console().print(table)
    return 0
