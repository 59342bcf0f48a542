"""The toolchain cache: ~/.cache/vllm-ternary/toolchains/<name> (TERNARY_CACHE moves the
root). A toolchain directory counts only once its stamp exists, and the stamp is written
last, listing every file with its size and sha256, so an interrupted assembly is never
reused, and every use checks the contents: a changed byte in a cached nvcc or header is
found, named, and the toolchain reassembled."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from ternary import settings
from ternary._build.hashing import sha256

STAMP = ".ternary-toolchain.json"


def root() -> Path:
    base = settings.raw("TERNARY_CACHE")
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
    """Every file with its size (-1: a symlink)."""
    out = {}
    for p in sorted(home.rglob("*")):
        rel = p.relative_to(home).as_posix()
        if rel in (STAMP, STAMP + ".tmp"):
            continue
        if p.is_symlink():
            out[rel] = -1
        elif p.is_file():
            out[rel] = p.stat().st_size
    return out


def _digests(home: Path, files: dict[str, int]) -> dict[str, str]:
    """sha256 of every regular file; a symlink by where it points."""
    return {rel: ("-> " + os.readlink(home / rel)) if size == -1 else sha256(home / rel)
            for rel, size in files.items()}


def _write_stamp(home: Path, stamp: dict) -> None:
    tmp = home / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1, sort_keys=True))
    tmp.rename(home / STAMP)


def check(home: Path, inputs: dict[str, str]) -> str | None:
    """None when home was completed from exactly these inputs and every file is still there
    with the size and sha256 the stamp recorded; else why not, naming the files.

    A stamp written before the sha256 were recorded (sizes only) gets them now, from the
    files as they are, when every size still matches: the cache is shared by checkouts of
    older commits, so it is upgraded in place rather than rebuilt under them."""
    try:
        stamp = json.loads((home / STAMP).read_text())
    except FileNotFoundError:
        return f"{home} has no {STAMP} (never completed)"
    except (OSError, ValueError) as e:
        return f"{home / STAMP} cannot be read ({e})"
    if stamp.get("inputs") != inputs:
        return f"{home} was assembled from other inputs ({stamp.get('inputs')}, now {inputs})"
    files = stamp.get("files", {})
    if not files:
        return f"{home / STAMP} lists no files"
    problems = []
    for rel, size in files.items():
        p = home / rel
        if size == -1:
            if not p.is_symlink():
                problems.append(f"{rel} is no longer a symlink")
        elif not p.is_file():
            problems.append(f"{rel} is missing")
        elif p.stat().st_size != size:
            problems.append(f"{rel} changed size ({p.stat().st_size} bytes, stamp {size})")
    if not problems:
        digests = stamp.get("sha256")
        if digests is None:
            stamp["sha256"] = _digests(home, files)
            _write_stamp(home, stamp)
            return None
        now = _digests(home, files)
        problems = [f"{rel} has sha256 {now.get(rel, 'none')[:16]}..., the stamp "
                    f"{want[:16]}... (same size: its contents changed)"
                    for rel, want in digests.items() if now.get(rel) != want]
    if problems:
        more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        return f"in {home}: " + "; ".join(problems[:5]) + more
    return None


def valid(home: Path, inputs: dict[str, str]) -> bool:
    """True when check() finds nothing wrong."""
    return check(home, inputs) is None


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
    files = _listing(home)
    _write_stamp(home, {"inputs": inputs, "files": files, "sha256": _digests(home, files)})
