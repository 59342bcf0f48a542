"""Writing under a temporary name, renamed into place only when complete: a writer killed
half-way (SIGKILL, a full disk) leaves no file or directory with a final name, and the next
run removes what a dead writer left and says so (docs/faults.md). Used by `convert`,
`make-tiny` and the wheel build. Standard library only."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path


def temp_dir_for(dst: Path, what: str) -> Path:
    """Where a writer of `dst` works until its final rename: next to it (the same
    filesystem, so the rename is atomic), hidden, named after this process
    (`.DST.WHAT-PID`), so a later run can tell a dead writer's leftovers from a live one's."""
    return dst.with_name(f".{dst.name}.{what}-{os.getpid()}")


def remove_stale_temp_dirs(dst: Path, what: str) -> list[str]:
    """Removes the temporary directories of `dst` whose writer process is gone (killed
    half-way); one message for each."""
    said = []
    prefix = f".{dst.name}.{what}-"
    if not dst.parent.is_dir():
        return said
    for p in sorted(dst.parent.glob(f"{glob.escape(prefix)}*")):
        pid = p.name[len(prefix):]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        said.append(f"removed {p}: a stale temporary directory of {dst.name} left by process "
                    f"{pid}, which is gone")
    return said


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True
