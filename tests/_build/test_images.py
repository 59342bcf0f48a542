"""Local base images (ternary/_build/images.py) and the images docker/Dockerfile builds on
them: the lock files pin what is imported; the runtime image runs `ternary doctor`,
`ternary build-info` and, for cpu, serves a make-tiny model to the host over 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ternary._build import docker, images, matrix

# ---- lock files and the build context (no podman needed) ------------------------------------


def test_lock_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "LOCK_DIR", tmp_path)
    text = images.render_lock("b", "ab" * 32, {"suite": "bookworm"}, ["apt=2.6.1", "bash=5.2"])
    (tmp_path / "b.lock").write_text(text)
    facts, manifest = images.read_lock("b")
    assert facts == {"tar_sha256": "ab" * 32, "suite": "bookworm"}
    assert manifest == ["apt=2.6.1", "bash=5.2"]
    assert images.read_lock("missing") is None


def test_manifest_diff_names_both_sides():
    assert images.manifest_diff(["a=1", "b=1"], ["a=1", "b=2", "c=1"]) == ["-b=1", "+b=2", "+c=1"]


@pytest.mark.parametrize("name", ["vllm-ternary-base-bookworm-py3.11",
                                  "vllm-ternary-base-bookworm-py3.11-cuda12.4.131",
                                  "vllm-ternary-base-bookworm-py3.11-cuda13.0.88"])
def test_committed_locks_pin_a_tarball_and_packages(name):
    lock = images.read_lock(name)
    assert lock is not None, f"docker/bases/{name}.lock is not committed"
    facts, manifest = lock
    assert len(facts["tar_sha256"]) == 64
    assert any(p.startswith("python3.11=") for p in manifest)
    if "cuda" in name:
        assert facts["nvcc"] == name.rsplit("cuda", 1)[1]
        assert facts["base_tar_sha256"] == images.read_lock(images.python_base_name())[0][
            "tar_sha256"]


def test_import_refuses_a_tarball_other_than_the_locked_one(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(images, "image_layer", lambda ref: None)
    tar = tmp_path / "b.tar"
    tar.write_bytes(b"not the tarball")
    (tmp_path / "b.lock").write_text(images.render_lock("b", "0" * 64, {}, []))
    with pytest.raises(images.ImageError, match="records 0000.*--relock"):
        images.import_base(tar, "b")


def test_local_base_refuses_another_python(monkeypatch):
    with pytest.raises(images.ImageError, match="h200 pins python 3.12.*no local base"):
        images.ensure_base("h200")


@pytest.mark.parametrize("target,name", [
    ("cpu", "vllm-ternary-base-bookworm-py3.11"),
    ("h100", "vllm-ternary-base-bookworm-py3.11-cuda12.4.131")])
def test_an_imported_locked_base_needs_no_tarball(target, name, monkeypatch):
    from types import SimpleNamespace

    from ternary._build import toolchains

    def no_tarball(*a, **kw):
        raise AssertionError("built a tarball for a base podman holds as locked")

    layers = {images.image_ref(name): images.read_lock(name)[0]["tar_sha256"]}
    monkeypatch.setattr(images, "image_layer", layers.get)
    monkeypatch.setattr(images, "python_base_tar", no_tarball)
    monkeypatch.setattr(images, "cuda_base_tar", no_tarball)
    monkeypatch.setattr(toolchains, "resolve", lambda t, c, progress: SimpleNamespace(
        nvcc_version=name.rsplit("cuda", 1)[1]))
    assert images.ensure_base(target) == images.image_ref(name)
    # another layer under that name is not the locked base: it is built and imported anew
    layers[images.image_ref(name)] = "0" * 64
    with pytest.raises(AssertionError, match="built a tarball"):
        images.ensure_base(target)


def test_stage_links_brings_the_locked_wheel_by_sha256(tmp_path, monkeypatch):
    links, src = tmp_path / "links", tmp_path / "src"
    src.mkdir()
    wanted = src / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wanted.write_bytes(b"the locked wheel")
    (src / "other-1.0-py3-none-any.whl").write_bytes(b"a wheel the lock does not name")
    links.mkdir()
    (links / "stale.whl").write_bytes(b"left from another target")
    monkeypatch.setattr("ternary._build.envs.find_links", lambda: [str(src)])
    monkeypatch.setattr(docker, "lock_hashes", lambda t: {docker.sha256(wanted)})
    assert [p.name for p in docker.stage_links("cpu", links)] == [wanted.name]
    assert sorted(p.name for p in links.iterdir()) == [wanted.name]
    # a target whose lock is all PyPI gets an empty directory (the Dockerfile COPYs it)
    assert docker.stage_links("h100", links) == [] and not any(links.iterdir())


def test_stage_links_refuses_when_no_wheel_has_a_locked_hash(tmp_path, monkeypatch):
    monkeypatch.setattr("ternary._build.envs.find_links", lambda: [str(tmp_path)])
    with pytest.raises(docker.DockerError, match="none there has a sha256 of envs/cpu"):
        docker.stage_links("cpu", tmp_path / "links")


def test_cpu_lock_names_torch_cpu_by_sha256():
    assert "torch==2.13.0+cpu" in (matrix.REPO / "envs/cpu/requirements.lock").read_text()
    assert len(docker.lock_hashes(matrix.get("cpu"))) > 100


def test_dockerignore_keeps_checkout_debris_out_and_the_links_in():
    lines = (matrix.REPO / ".dockerignore").read_text().splitlines()
    for path in (".git", ".venvs", ".nox", "build", "dist", ".cache/*"):
        assert path in lines
    assert "!.cache/docker-links" in lines


def test_env_layer_comes_before_the_source_copy():
    text = docker.DOCKERFILE.read_text()
    env = text.index("FROM base AS env")
    assert env < text.index("uv pip sync") < text.index("FROM env AS wheel") < \
        text.index("COPY . /src")
    # the runtime is the env stage (its venv layer cached while the lock is) plus the
    # wheel's own files, never the wheel stage's venv
    runtime = text[text.index("FROM env AS runtime"):]
    assert "COPY --from=wheel /opt/overlay/ /opt/venv/" in runtime
    assert "--from=wheel /opt/venv" not in runtime


def test_find_links_wheels_reach_the_env_run_without_a_layer():
    """A COPY of them would stay in the runtime (cpu: the 192 MB torch wheel) whatever a later
    rm does; a bind mount lasts one RUN."""
    text = docker.DOCKERFILE.read_text()
    env = text[text.index("FROM base AS env"):text.index("FROM env AS wheel")]
    run = env[env.index("RUN --mount=type=bind,source=.cache/docker-links,target=/wheels"):]
    assert "--find-links /wheels" in run[:run.index("\nRUN ")]
    assert not [line for line in text.splitlines()
                if line.startswith(("COPY", "ADD")) and "docker-links" in line]


def test_every_image_the_dockerfile_pulls_is_pinned():
    """FROM is the digest-pinned BASE_IMAGE (docker.render_build_args refuses an unpinned one)
    or an earlier stage; a `# syntax=` frontend is an image too."""
    text = docker.DOCKERFILE.read_text()
    stages = set()
    for m in re.finditer(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M):
        assert m.group(1) == "${BASE_IMAGE}" or m.group(1) in stages, m.group(0)
        stages.add(m.group(2))
    for m in re.finditer(r"^#\s*syntax=(\S+)", text, re.M):
        assert re.search(r"@sha256:[0-9a-f]{64}$", m.group(1)), m.group(0)


# ---- built images (podman, root; slow) -------------------------------------------------------

# vLLM's engine needs 160 MiB of /dev/shm at least (podman's default is 64 MiB)
RUN = ["podman", "run", "--rm", "--runtime", "runc", "--ulimit", "nofile=1024:1024",
       "--ulimit", "nproc=1024:1024", "--no-healthcheck", "--shm-size", "1g"]


def _podman_image(ref: str, how: str) -> str:
    """ref, where podman holds it; else the test is skipped with the command that makes it."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    if subprocess.run(["podman", "image", "exists", ref]).returncode != 0:
        pytest.skip(f"{ref} is not built: `{how}`")
    return ref


def _image(target: str) -> str:
    ref = os.environ.get(f"TERNARY_TEST_IMAGE_{target.upper()}", f"localhost/vllm-ternary:{target}")
    return _podman_image(ref, f"nox -s docker-{target} -- --local-base --host-ca")


@pytest.fixture
def python_base() -> str:
    """The local python base, on which the cpu target builds here."""
    return _podman_image(images.image_ref(images.python_base_name()),
                         "python -m ternary._build.images base cpu")


@pytest.mark.build
@pytest.mark.slow
def test_podman_builds_base_stage_of_cpu_target(python_base):
    cmd = docker.build_command("cpu", engine="podman", stage="base", host_ca=docker.HOST_CA,
                               overrides={"BASE_IMAGE": python_base},
                               tag="vllm-ternary:test-base")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.build
@pytest.mark.slow
def test_podman_build_without_args_fails_loudly(python_base):
    cmd = ["podman", "build", "-f", str(docker.DOCKERFILE), *docker.PODMAN_FLAGS,
           "--build-arg", f"BASE_IMAGE={python_base}", "--target", "base", str(matrix.REPO)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "build arg TARGET is notset" in r.stdout + r.stderr


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "h100", "current"])
def test_runtime_image_runs_doctor_and_build_info(target):
    ref = _image(target)
    r = subprocess.run([*RUN, "--entrypoint", "ternary", ref, "doctor", "--json"],
                       capture_output=True, text=True, timeout=300)
    # doctor exits 1 on a machine without the target's GPU; vLLM 0.6.x logs a warning about
    # libcuda.so.1 to stdout before the report
    report = json.loads(r.stdout[r.stdout.find("{"):])
    assert report, r.stderr[-2000:]
    r = subprocess.run([*RUN, "--entrypoint", "ternary", ref, "build-info", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    info = json.loads(r.stdout)
    t = matrix.get(target)
    assert info["extension"] is bool(t.arch_list), info
    r = subprocess.run([*RUN, "--entrypoint", "python", ref, "-c", "import importlib.metadata "
                        "as m; print(m.version('vllm-ternary'))"],
                       capture_output=True, text=True, timeout=300)
    assert r.stdout.strip().endswith("+" + t.local_version), r.stdout + r.stderr[-2000:]


@pytest.mark.build
@pytest.mark.slow
@pytest.mark.serve
def test_cpu_image_serves_make_tiny_to_the_host(tmp_path):
    """make-tiny in the image into a mounted directory, `ternary serve` in the image on the
    host's loopback only, completions from the host compared with the transformers
    reference (ternary.smoke's helpers), SIGTERM, the container gone."""
    ref = _image("cpu")
    from ternary.tools import smoke

    models = tmp_path / "models"
    models.mkdir()
    models.chmod(0o777)  # the image runs as uid 1000
    r = subprocess.run([*RUN, "-v", f"{models}:/models", "--entrypoint", "ternary", ref,
                        "make-tiny", "/models/tiny"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    model = models / "tiny"
    port = smoke.free_port()
    name = f"ternary-serve-test-{os.getpid()}"
    # --network host with the server on 127.0.0.1: reachable from this host's loopback only
    cmd = [*RUN[:2], "-d", "--name", name, *RUN[3:], "--network", "host",
           "-v", f"{models}:/models:ro", "--entrypoint", "ternary", ref,
           "serve", "/models/tiny", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "256", "--served-model-name", "tiny",
           "--seed", "0"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    base = f"http://127.0.0.1:{port}"
    try:
        import requests

        deadline = time.monotonic() + smoke.HEALTH_TIMEOUT_S
        while True:
            try:
                if requests.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert _state(name) in ("running", "unknown"), _logs(name)
            assert time.monotonic() < deadline, "not healthy in time\n" + _logs(name)
            time.sleep(2)
        reference = smoke.Reference(model)
        for prompt in (smoke.PROMPTS[0], reference.ids(smoke.PROMPTS[1])):
            got, text = smoke._completion(base, prompt)
            ids = prompt if isinstance(prompt, list) else reference.ids(prompt)
            ok, detail = smoke._compare(got, text, ids, reference)
            assert ok, f"{prompt!r}: {detail}"
        t = time.monotonic()
        subprocess.run(["podman", "kill", "--signal", "TERM", name], check=True,
                       capture_output=True, timeout=120)
        code = subprocess.run(["podman", "wait", name], capture_output=True, text=True,
                              timeout=smoke.STOP_TIMEOUT_S + 30).stdout.strip()
        stopped = time.monotonic() - t
        assert stopped < smoke.STOP_TIMEOUT_S, f"SIGTERM took {stopped:.0f} s"
        assert code in ("0", "143"), f"exit code {code}\n" + _logs(name)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)
    assert subprocess.run(["podman", "container", "exists", name]).returncode != 0


def _state(name: str) -> str:
    """The container's state; "unknown" while podman waits for its storage lock (another
    build committing a layer holds it for minutes)."""
    try:
        return subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", name],
                              capture_output=True, text=True, timeout=60).stdout.strip()
    except subprocess.TimeoutExpired:
        return "unknown"


def _logs(name: str) -> str:
    r = subprocess.run(["podman", "logs", "--tail", "40", name], capture_output=True, text=True,
                       timeout=30)
    return r.stdout + r.stderr
