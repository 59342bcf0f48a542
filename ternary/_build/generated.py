"""Files generated from envs/targets.toml: writing them, and finding the ones that drifted
(the drift tests fail on those and name the nox session that regenerates them)."""

from __future__ import annotations

from pathlib import Path

from ternary._build import matrix


def write(files: dict[Path, str]) -> list[Path]:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


def drift(files: dict[Path, str], session: str) -> list[str]:
    """One line per file that is missing or differs from what targets.toml renders now."""
    problems = []
    for path, text in files.items():
        rel = path.relative_to(matrix.REPO)
        if not path.is_file():
            problems.append(f"{rel} is missing: run `nox -s {session}`")
        elif path.read_text() != text:
            problems.append(f"{rel} differs from envs/targets.toml: run `nox -s {session}`")
    return problems
