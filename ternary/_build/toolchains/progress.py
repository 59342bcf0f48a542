"""Progress output for long toolchain steps. rich when it is installed (it may not be:
this runs before the build environment exists), plain lines on stderr otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def step(provider: str, message: str, enabled: bool = True) -> None:
    if not enabled:
        return
    try:
        from rich.console import Console
    except ImportError:
        print(f"[{provider}] {message}", file=sys.stderr, flush=True)
        return
    Console(stderr=True).print(f"[bold cyan]\\[{provider}][/] {message}", highlight=False,
                              soft_wrap=True)


def track(items: Iterable[T], description: str, total: int, enabled: bool = True) -> Iterator[T]:
    if not enabled:
        yield from items
        return
    try:
        from rich.console import Console
        from rich.progress import track as rich_track
    except ImportError:
        print(description, file=sys.stderr, flush=True)
        yield from items
        return
    yield from rich_track(items, description=description, total=total,
                          console=Console(stderr=True))
