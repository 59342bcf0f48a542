"""`ternary doctor [--json]`: checks with a verdict and a fix each; exit 1 when any fails."""

from __future__ import annotations

import dataclasses
import json


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    from ternary.tools import doctor

    checks = doctor.run_checks()
    if args.json:
        print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks],
                          "exit_code": doctor.exit_code(checks)}, indent=2))
        return doctor.exit_code(checks)
    from rich.console import Console
    from rich.table import Table

    style = {doctor.OK: "green", doctor.WARN: "yellow", doctor.FAIL: "bold red"}
    table = Table(title="ternary doctor")
    for col in ("check", "verdict", "found", "fix"):
        table.add_column(col)
    for c in checks:
        table.add_row(c.name, f"[{style[c.verdict]}]{c.verdict}[/]", c.detail, c.fix)
    Console().print(table)
    return doctor.exit_code(checks)
