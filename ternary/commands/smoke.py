"""`ternary smoke`: the serving smoke test (ternary.tools.smoke)."""

from __future__ import annotations


def add_arguments(p) -> None:
    from ternary.tools import smoke

    smoke.add_arguments(p)


def run(args) -> int:
    from ternary.tools import smoke

    return smoke.run_cli(args)
