"""The sha256 of a file, read in 1 MiB blocks: what the locks, the toolchain cache, the build
report, the reproduce comparison and the image bases record."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
