"""The toolchain cache: ~/.cache/vllm-ternary/toolchains/<name> (TERNARY_CACHE moves the
root). A toolchain directory counts only once its stamp exists, and the stamp is written
last, listing every file with its size, so an interrupted assembly is never reused."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

STAMP = ".ternary-toolchain.json"


def root() -> Path:
    base = os.environ.get("TERNARY_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "vllm-ternary") / "toolchains"


@contextlib.contextmanager
def locked(name: str) -> Iterator[Path]:
    """Hold an exclusive lock on toolchain <name> (two builds assembling one toolchain at
    once would each see the other's half-written files)."""
    base = root()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield base / name
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _listing(home: Path) -> dict[str, int]:
    out = {}
    for p in sorted(home.rglob("*")):
        rel = p.relative_to(home).as_posix()
        if rel == STAMP:
            continue
        if p.is_symlink():
            out[rel] = -1
        elif p.is_file():
            out[rel] = p.stat().st_size
    return out


def valid(home: Path, inputs: dict[str, str]) -> bool:
    """True when home was completed from exactly these inputs and no file went missing
    or changed size since."""
    try:
        stamp = json.loads((home / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if stamp.get("inputs") != inputs:
        return False
    files = stamp.get("files", {})
    for rel, size in files.items():
        p = home / rel
        if size == -1:
            if not p.is_symlink():
                return False
        elif not p.is_file() or p.stat().st_size != size:
            return False
    return bool(files)


def size(home: Path) -> int:
    return sum(p.stat().st_size for p in home.rglob("*") if p.is_file() and not p.is_symlink())


def build(home: Path, inputs: dict[str, str], assemble: Callable[[Path, Path], None]) -> None:
    """Run assemble(partial_dir, downloads_dir), then move the result to home and stamp it."""
    partial = home.with_name(home.name + ".partial")
    downloads = home.with_name(home.name + ".downloads")
    for d in (home, partial, downloads):
        shutil.rmtree(d, ignore_errors=True)
    partial.mkdir(parents=True)
    downloads.mkdir(parents=True)
    assemble(partial, downloads)
    partial.rename(home)
    shutil.rmtree(downloads, ignore_errors=True)
    stamp = {"inputs": inputs, "files": _listing(home)}
    tmp = home / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True))
    tmp.rename(home / STAMP)
