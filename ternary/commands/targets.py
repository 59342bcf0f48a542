"""`ternary targets`: the target matrix as envs/targets.toml states it."""

from __future__ import annotations

import dataclasses
import json


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--markdown", action="store_true",
                   help="print README's targets table (tests/test_readme.py checks it)")


COLUMNS = ("target", "GPU", "archs", "CUDA", "torch", "vLLM", "notes")


def rows(targets) -> list[tuple[str, ...]]:
    return [(t.name, t.gpu, ";".join(t.arch_list) or "none",
             t.cuda.version if t.cuda else "none", t.torch, t.vllm or "none", t.notes)
            for t in targets.values()]


def markdown(targets) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(targets)]
    return "\n".join(lines) + "\n"


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
    if args.markdown:
        sys.stdout.write(markdown(targets))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=str(matrix.TARGETS_TOML))
    for col in COLUMNS:
        table.add_column(col)
    for r in rows(targets):
        table.add_row(*r)
    Console().print(table)
    return 0
