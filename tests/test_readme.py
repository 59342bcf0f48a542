"""README's generated tables are the generated ones: the targets table from
envs/targets.toml (`ternary targets --markdown`) and the environment variables from
ternary.settings (`python -m ternary.settings --markdown`)."""

from __future__ import annotations

from pathlib import Path

from ternary import settings
from ternary._build import matrix
from ternary.commands import targets

README = Path(__file__).resolve().parents[1] / "README.md"


def test_targets_table_is_generated_from_the_matrix():
    assert targets.markdown(matrix.load()) in README.read_text(), (
        "README's targets table differs from envs/targets.toml: paste `ternary targets "
        "--markdown` into it")


def test_environment_table_is_generated_from_the_registry():
    assert settings.markdown() in README.read_text(), (
        "README's environment-variable table differs from ternary/settings.py: paste "
        "`python -m ternary.settings --markdown` into it")


def test_readme_stays_a_user_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README has {len(lines)} lines; move detail to docs/"
