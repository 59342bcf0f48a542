"""`ternary convert SRC DST`: a bitnet, vendor-int8 or dense checkpoint to the canonical
ternary format, streamed tensor by tensor."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path


def add_arguments(p) -> None:
    from ternary.commands import positive_int

    p.add_argument("src", help="source model directory")
    p.add_argument("dst", help="output directory (new or empty)")
    p.add_argument("--from", dest="source_format", choices=("bitnet", "vendor-int8", "dense"),
                   help="source format (default: detected; an explicit one must match)")
    p.add_argument("--code-map", choices=("neg-zero-pos", "zero-pos-neg"),
                   help="vendor-int8: the code map, when detection cannot tell")
    p.add_argument("--group-size", type=positive_int,
                   help="vendor-int8: the group size the scale columns are stored at")
    p.add_argument("--not-convert", action="append", default=[], metavar="MODULE",
                   help="keep MODULE (and what is inside it) unquantized; repeatable")
    p.add_argument("--activation", choices=("none", "int8_per_token"),
                   help="how the layers treat their input (default: the source's own: "
                   "int8_per_token for bitnet, none otherwise); int8_per_token for a dense "
                   "export of a model trained with int8 activations")
    p.add_argument("--max-shard-size", type=positive_int, default=2 << 30, metavar="BYTES",
                   help="largest output shard (default 2 GiB)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from ternary.formats import FormatError
    from ternary.formats.convert import convert

    err = Console(stderr=True)
    with Progress(TextColumn("converting"), BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), TextColumn("{task.description}"),
                  console=err, transient=True) as bar:
        # until the first tensor is written (a vendor-int8 source is read once before that,
        # to settle its code map and scale layout)
        task = bar.add_task(f"reading {args.src}", total=None)

        def progress(done: int, total: int, tensor: str) -> None:
            bar.update(task, completed=done, total=total, description=tensor)

        try:
            report = convert(args.src, args.dst, source_format=args.source_format,
                             code_map=args.code_map, group_size=args.group_size,
                             not_convert=args.not_convert, max_shard_bytes=args.max_shard_size,
                             activation=args.activation, progress=progress)
        except (FormatError, OSError) as e:
            if isinstance(e, FormatError):
                why = str(e)
            elif e.filename and Path(os.path.abspath(e.filename)).is_relative_to(
                    os.path.abspath(args.src)):  # (abspath: a dangling link is the source's)
                why = (f"{e.filename}: cannot read it ({e.strerror or e}); check the source "
                       "model's files and their permissions")
            else:
                why = (f"{e.filename or args.dst}: cannot write the converted model "
                       f"({e.strerror or e}); choose a destination you can create")
            err.print(f"error: {why}", markup=False, highlight=False, soft_wrap=True)
            if args.json:
                print(json.dumps({"ok": False, "error": why}))
            return 2
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0
    table = Table(title=f"{report.source} ({report.source_format}) -> {report.destination}",
                  show_header=False)
    for key, value in (("modules quantized", report.modules),
                       ("modules kept dense", ", ".join(report.kept_dense) or "none"),
                       ("scale", report.scale + (f", group_size {report.group_size}"
                                                 if report.group_size else "")),
                       ("activation", report.activation),
                       ("tensors copied", report.tensors_copied),
                       ("files copied", ", ".join(report.files_copied) or "none"),
                       ("shards", len(report.shards)),
                       ("bytes written", f"{report.bytes_written:,}"),
                       *(("note", n) for n in report.notes)):
        table.add_row(key, str(value))
    Console(file=sys.stdout).print(table)
    return 0
