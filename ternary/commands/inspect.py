"""`ternary inspect DIR`: format, modules, packing, scales, code histograms, detected group
size and code map, and every problem found. Exit status 1 when there is a problem."""

from __future__ import annotations

import json


def add_arguments(p) -> None:
    from ternary.commands import positive_int

    p.add_argument("dir", help="model directory")
    p.add_argument("--code-map", choices=("neg-zero-pos", "zero-pos-neg"),
                   help="vendor-int8: the code map, when detection cannot tell")
    p.add_argument("--group-size", type=positive_int,
                   help="vendor-int8: the group size the scale columns are stored at")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    from ternary.formats.inspection import inspect

    report = inspect(args.dir, code_map=args.code_map, group_size=args.group_size)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["ok"] else 1
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"{report['dir']}: format {report['format'] or 'unknown'}", highlight=False)
    if report.get("activation"):
        console.print(f"  activation: {report['activation']}", highlight=False)
    for key, value in report["detected"].items():
        console.print(f"  {key}: {value}", highlight=False, markup=False,
                      soft_wrap=True)
    if report["modules"]:
        table = Table(title="modules")
        table.add_column("module", overflow="fold")
        for col in ("N x K", "stored", "packing", "scale", "group", "-1 / 0 / +1"):
            table.add_column(col)
        for mod in report["modules"]:
            h = mod["histogram"]
            table.add_row(mod["module"], "{} x {}".format(*mod["shape"]), mod["stored"],
                          mod["packing"], mod["scale"] or "", str(mod["group_size"] or ""),
                          " / ".join(str(h[c]) for c in ("-1", "0", "+1")) if h else "")
        console.print(table)
        notes = {}
        for mod in report["modules"]:
            if mod.get("note"):
                notes.setdefault(mod["note"], []).append(mod["module"])
        for note, mods in notes.items():
            console.print(f"  {note}: {len(mods)} module(s), e.g. {mods[0]}", highlight=False,
                          markup=False, soft_wrap=True)
    if report["problems"]:
        table = Table(title=f"{len(report['problems'])} problem(s)")
        for col in ("file", "tensor", "problem", "what to do"):
            table.add_column(col)
        for p in report["problems"]:
            table.add_row(p["file"], p["tensor"] or "", p["problem"], p["hint"])
        console.print(table)
    else:
        console.print("no problems found")
    return 0 if report["ok"] else 1
