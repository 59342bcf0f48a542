"""Nothing half-written: `convert` onto a full filesystem (a small tmpfs) and `convert` or
make-tiny killed with SIGKILL half-way leave no destination, the source untouched, and the
next run removes the dead run's temporary directory and says so."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ternary.formats.convert import convert
from ternary.formats.reader import Checkpoint
from ternary.tools.synthetic import tiny

REPO = Path(__file__).resolve().parents[2]


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return tiny.make(tmp_path_factory.mktemp("src") / "bitnet", "bitnet")


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB tmpfs (root only): smaller than the converted tiny model."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); needs root")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_convert_onto_a_full_filesystem_leaves_nothing(source, small_tmpfs):
    before = _digest(source)
    dst = small_tmpfs / "out"
    with pytest.raises(OSError) as e:
        convert(source, dst)
    assert e.value.errno == errno.ENOSPC or "No space" in str(e.value), e.value
    assert list(small_tmpfs.iterdir()) == []  # no destination, no temporary directory
    assert _digest(source) == before


def _killed_half_way(cmd: list[str], parent: Path, temp_prefix: str) -> Path:
    """Runs `cmd` slowed down (TERNARY_TEST_SLOW_WRITE_S: 2 s after each tensor), SIGKILLs
    it once its temporary directory exists (then it is between tensors: convert's shards
    are written when it closes them); that directory."""
    env = {**os.environ, "TERNARY_TEST_SLOW_WRITE_S": "2",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    tmp = parent / f"{temp_prefix}-{proc.pid}"
    deadline = time.monotonic() + 240
    while not tmp.is_dir():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no temporary directory appeared"
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, "it finished before the kill: raise the slow-down"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return tmp


def test_convert_killed_half_way_then_rerun(source, tmp_path):
    before = _digest(source)
    dst = tmp_path / "out"
    tmp = _killed_half_way([sys.executable, "-m", "ternary", "convert", str(source), str(dst)],
                           tmp_path, ".out.converting")
    assert not dst.exists() and tmp.exists()
    assert _digest(source) == before
    report = convert(source, dst)
    assert any(f"removed {tmp}" in n and "stale" in n for n in report.notes), report.notes
    assert not tmp.exists()
    assert not Checkpoint(dst).problems
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_make_tiny_killed_half_way_then_rerun(tmp_path, capsys):
    dst = tmp_path / "m"
    tmp = _killed_half_way([sys.executable, "-m", "ternary", "make-tiny", str(dst)], tmp_path,
                           ".m.making")
    assert not dst.exists() and tmp.exists()
    tiny.make(dst)
    assert f"removed {tmp}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert (dst / "config.json").is_file()
