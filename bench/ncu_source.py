#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by code region: reads the per-instruction CSV of

    ncu --section SourceCounters --section WarpStateStats --page source --print-source sass \\
        --csv -k regex:KERNEL --launch-count 1 bench/kernel_lab --only VARIANT ... > F.csv

and groups the SASS instructions by how often each was executed. Instructions run equally
often form one region: the k loop, the prologue, the epilogue that every warp runs once.
For each region it prints the instruction count, the warp-stall samples (share of all) and
the leading stall reasons, then the instructions with the most samples. This found the
wgmma_big epilogue: 2866 instructions run once a warp, 40 % of the samples, nearly all
stall_no_inst (docs/kernels.md).

    python3 bench/ncu_source.py F.csv[.gz] [--top 15] [--json]
"""

import argparse
import csv
import gzip
import io
import json
import sys
from collections import Counter
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


class NcuSourceError(ValueError):
    pass


def read_rows(path: Path) -> tuple[str, list[dict[str, str]]]:
    """The kernel name and one dict per SASS instruction."""
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    rows = list(csv.reader(io.StringIO(text)))
    kernel = next((r[1] for r in rows if len(r) > 1 and r[0] == "Kernel Name"), "?")
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        raise NcuSourceError(
            f"{path}: no 'Address' header row; expected the CSV of ncu --page source "
            f"--print-source sass --csv (with --section SourceCounters)")
    names = rows[head]
    for col in (SAMPLES, EXECUTED, "Source"):
        if col not in names:
            raise NcuSourceError(f"{path}: column {col!r} missing (have {names[:6]}...); "
                                 f"profile with --section SourceCounters --section WarpStateStats")
    return kernel, [dict(zip(names, r)) for r in rows[head + 1:] if len(r) == len(names)]


def _int(v: str) -> int:
    return int(v.replace(",", "")) if v and v.strip() else 0


def summarize(rows: list[dict[str, str]], top: int = 15) -> dict:
    reasons = [c for c in (rows[0] if rows else {})
               if c.startswith("stall_") and "Not Issued" not in c]
    regions: dict[int, dict] = {}
    total = 0
    for r in rows:
        ex, s = _int(r[EXECUTED]), _int(r[SAMPLES])
        total += s
        g = regions.setdefault(ex, {"executed": ex, "instructions": 0, "samples": 0,
                                    "stalls": Counter()})
        g["instructions"] += 1
        g["samples"] += s
        for c in reasons:
            g["stalls"][c] += _int(r[c])
    out = []
    for g in sorted(regions.values(), key=lambda g: -g["samples"]):
        out.append({**g, "share": g["samples"] / total if total else 0.0,
                    "stalls": dict(g["stalls"].most_common(3))})
    hot = sorted(rows, key=lambda r: -_int(r[SAMPLES]))[:top]
    return {
        "samples": total, "instructions": len(rows), "regions": out,
        "hot": [{"address": r.get("Address", ""), "samples": _int(r[SAMPLES]),
                 "executed": _int(r[EXECUTED]), "source": r["Source"].strip()} for r in hot],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path)
    p.add_argument("--top", type=int, default=15, help="hottest instructions to list")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    a = p.parse_args(argv)
    try:
        kernel, rows = read_rows(a.csv)
    except (OSError, NcuSourceError, UnicodeDecodeError) as e:
        print(f"ncu_source: {e}", file=sys.stderr)
        return 2
    s = summarize(rows, a.top)
    if a.json:
        print(json.dumps({"kernel": kernel, **s}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(width=140)
    con.print(f"{kernel[:130]}\n{s['instructions']} SASS instructions, {s['samples']} samples")
    t = Table(title="regions (instructions executed equally often)")
    for col in ("executed", "instructions", "samples", "share %", "leading stalls"):
        t.add_column(col, justify="left" if col == "leading stalls" else "right")
    for g in s["regions"]:
        if not g["samples"]:
            continue
        t.add_row(f"{g['executed']:,}", str(g["instructions"]), str(g["samples"]),
                  f"{100 * g['share']:.1f}",
                  ", ".join(f"{k[6:]} {v}" for k, v in g["stalls"].items() if v))
    con.print(t)
    h = Table(title=f"the {len(s['hot'])} instructions with the most samples")
    for col in ("samples", "executed", "SASS"):
        h.add_column(col, justify="left" if col == "SASS" else "right")
    for r in s["hot"]:
        h.add_row(str(r["samples"]), f"{r['executed']:,}", r["source"][:90])
    con.print(h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
