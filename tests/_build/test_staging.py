"""ternary._build.staging: temporary names a dead writer's next run removes, a live one's kept."""

from __future__ import annotations

import os
import subprocess
import sys

from ternary._build import staging


def test_a_dead_writers_directory_is_removed_and_named_a_live_ones_kept(tmp_path):
    dst = tmp_path / "wheel"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    gone = tmp_path / f".wheel.building-{dead}"
    mine = staging.temp_dir_for(dst, "building")
    live = tmp_path / f".wheel.building-{os.getppid()}"
    other = tmp_path / f".other.building-{dead}"
    for d in (gone, mine, live, other):
        d.mkdir()
    said = staging.remove_stale_temp_dirs(dst, "building")
    assert said == [f"removed {gone}: a stale temporary directory of wheel left by process "
                    f"{dead}, which is gone"]
    assert not gone.exists() and mine.exists() and live.exists() and other.exists()
    assert mine.name == f".wheel.building-{os.getpid()}"


def test_nothing_to_do_without_the_parent_directory(tmp_path):
    assert staging.remove_stale_temp_dirs(tmp_path / "no" / "x", "making") == []
