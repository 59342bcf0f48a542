# /// script
# dependencies = ["nox==2026.10.20", "uv==0.13.9"]
# ///
"""Sessions of vllm-ternary. Every target session is generated from envs/targets.toml;
the work itself lives in ternary._build (standard library only), so it also runs without
nox: `python -m ternary._build.pipeline build h100 --toolchain deb`.

  nox -s build-h100                       locked env, pinned CUDA 12.4, compile, SASS check, wheel
  nox -s build-a100 -- --toolchain deb --allow-cuda-minor-mismatch
  nox -s test-h200 -- --host-torch        against the GPU host's own torch
  nox -s reproduce-h100                   two fresh checkouts, two builds, byte-compared
  nox -s tests                            the CPU test suite (README's test command)
  nox -s fault-matrix -- --short          real servers under injected faults (CI's short run)
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
from ternary._build import envs, matrix, pipeline  # noqa: E402  (standard library only)

TARGETS = matrix.load()


def _run_pipeline(session: nox.Session, action: str, target: str) -> None:
    code = pipeline.main([action, target, *session.posargs])
    if code:
        session.error(f"{action}-{target} failed (exit {code})")


def _target_sessions(name: str) -> None:
    t = TARGETS[name]
    if t.arch_list:
        @nox.session(name=f"build-{name}", venv_backend="none", tags=["build"], default=False)
        def build(session: nox.Session) -> None:
            _run_pipeline(session, "build", name)

        build.__doc__ = f"Build the {t.gpu} wheel: CUDA {t.cuda.version}, torch {t.torch}, archs {t.torch_arch_list}."

        @nox.session(name=f"test-{name}", venv_backend="none", tags=["test"], default=False)
        def test(session: nox.Session) -> None:
            _run_pipeline(session, "test", name)

        test.__doc__ = f"Build for {name}, then pytest in its environment (GPU tests where a GPU is)."

    if t.platform == "linux" and (t.arch_list or t.name == "cpu"):
        what = "wheel" if t.arch_list else "reference-only wheel (no ternary._C)"
        if not t.arch_list:
            @nox.session(name=f"build-{name}", venv_backend="none", tags=["build"], default=False)
            def build_reference(session: nox.Session) -> None:
                _run_pipeline(session, "build", name)

            build_reference.__doc__ = f"Build the {what} in the {name} environment."

        @nox.session(name=f"reproduce-{name}", venv_backend="none", tags=["reproduce"],
                     default=False)
        def reproduce(session: nox.Session) -> None:
            _run_pipeline(session, "reproduce", name)

        reproduce.__doc__ = (f"Build the {name} {what} twice in two fresh checkouts (other paths, "
                             "environment, time); fail naming every differing member.")

    if t.platform == "linux" and t.arch_list or t.name == "cpu":
        @nox.session(name=f"docker-{name}", venv_backend="none", tags=["docker"], default=False)
        def docker(session: nox.Session) -> None:
            session.run(sys.executable, "-m", "ternary._build.docker", "build", name,
                        *session.posargs, external=True)

        docker.__doc__ = f"Render targets.toml into build args and build docker/Dockerfile for {name}."

        if t.python == "3.11":
            @nox.session(name=f"docker-base-{name}", venv_backend="none", tags=["docker"],
                         default=False)
            def docker_base(session: nox.Session) -> None:
                session.run(sys.executable, "-m", "ternary._build.images", "base", name,
                            *session.posargs, external=True)

            docker_base.__doc__ = (f"A local base for {name}'s image (debootstrap bookworm, its "
                                   "python" + (f", CUDA {t.cuda.version} toolchain" if t.cuda
                                               else "") + "): `docker-" + name
                                   + " -- --local-base` builds on it.")
    if t.wsl:
        @nox.session(name=f"wsl-{name}", venv_backend="none", tags=["wsl"], default=False)
        def wsl(session: nox.Session) -> None:
            wheels = sorted((REPO / "dist").glob(f"vllm_ternary-*+{t.local_version}-*.whl"))
            if not wheels:
                session.error(f"no wheel for {name} in dist/: run `nox -s build-{name}` first")
            session.run(sys.executable, "-m", "ternary._build.wsl", "build", name, str(wheels[-1]),
                        str(REPO / "dist" / f"vllm-ternary-{name}.tar.gz"), *session.posargs,
                        external=True)

        wsl.__doc__ = f"Build the WSL2 distribution tarball for {name} (needs root and the wheel)."

    if t.vllm:
        @nox.session(name=f"smoke-{name}", venv_backend="none", tags=["smoke"], default=False)
        def smoke(session: nox.Session) -> None:
            _run_pipeline(session, "smoke", name)

        smoke.__doc__ = (f"A real {t.vllm} OpenAI server on a tiny ternary model: HTTP requests "
                         "compared with the reference, 16 concurrent, clean stop"
                         + (" (bf16, every layer on the fused kernel)." if t.arch_list else "."))


for _name in TARGETS:
    _target_sessions(_name)

# One target per vLLM build of the matrix whose environment this machine's Python can create
# (h200's vLLM 0.26.0 needs Python 3.12): the plugin's registration and TP=2 tests run in each.
VLLM_COMPAT = list({t.vllm: t.name for t in reversed(TARGETS.values())
                    if t.vllm and t.python == "3.11"}.values())


@nox.session(name="test-vllm-compat", venv_backend="none", default=False)
@nox.parametrize("target", VLLM_COMPAT, ids=VLLM_COMPAT)
def test_vllm_compat(session: nox.Session, target: str) -> None:
    """The vLLM plugin's tests in the vLLM of each target (7-9 GB environments)."""
    py = envs.ensure(TARGETS[target])
    pipeline.install_reference(py)
    session.run(str(py), "-P", "-m", "pytest", str(REPO / "tests" / "vllm"),
                "-m", "not serve and not build and not gpu", *session.posargs,
                external=True)


@nox.session(name="ci-matrix", venv_backend="none", default=False)
def ci_matrix(session: nox.Session) -> None:
    """Print the CI matrix from targets.toml and regenerate ci/ (workflow, matrix.json)."""
    session.run(sys.executable, "-m", "ternary._build.ci_matrix", "write", external=True)
    session.run(sys.executable, "-m", "ternary._build.ci_matrix", "json", external=True)


@nox.session(venv_backend="none", default=False)
def setup(session: nox.Session) -> None:
    """Fresh-machine set-up: the cpu test environment and the pinned toolchains CI builds with."""
    from ternary._build import toolchains

    envs.ensure(TARGETS["cpu"])
    for name in ("h100", "current"):
        tc = toolchains.resolve(TARGETS[name], "auto")
        session.log(f"{name}: {tc.provider} CUDA {tc.nvcc_version} at {tc.cuda_home}")


@nox.session(name="kernel-lab", venv_backend="none", default=False)
def kernel_lab(session: nox.Session) -> None:
    """bench/kernel_lab.cu (the kernels' templates on raw CUDA, run on the GPU machine only)
    compiled for sm_90a with h100's toolchain, so a change to a kernel's signature that
    breaks it fails here rather than in a later device call. Compiled, not linked: the deb
    toolchain has no static CUDA runtime, and csrc's files are the wheel's builds."""
    import tempfile

    from ternary._build import toolchains

    tc = toolchains.resolve(TARGETS["h100"], "auto")
    with tempfile.TemporaryDirectory(prefix="kernel-lab-") as tmp:
        session.run("bash", str(REPO / "bench" / "kernel_lab.sh"), external=True,
                    env={**tc.env, "NVCC": str(tc.cuda_home / "bin" / "nvcc"),
                         "LAB_COMPILE_ONLY": str(Path(tmp) / "kernel_lab.o")})


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The CPU test suite in the cpu target's locked environment (README's test command)."""
    py = envs.ensure(TARGETS["cpu"])
    pipeline.install_reference(py)
    session.run(str(py), "-m", "pytest", str(REPO / "tests"), *session.posargs, external=True)


@nox.session(name="fault-matrix", venv_backend="none", default=False)
def fault_matrix(session: nox.Session) -> None:
    """Real CPU servers under injected faults (SIGKILLs, SIGTERM, dropped streams, a flood);
    `-- --short` for CI, `-- --load` for the 10x load and soak."""
    py = envs.ensure(TARGETS["cpu"])
    pipeline.install_reference(py)
    session.run(str(py), "-P", "-m", "ternary", "fault-matrix", *session.posargs, external=True)


@nox.session(venv_backend="none", default=False)
def lock(session: nox.Session) -> None:
    """Regenerate every generated file of envs/ from targets.toml (pip locks, toolchain locks)."""
    from ternary._build import ci_matrix, conda_env

    envs.lock_dev()
    for t in TARGETS.values():
        envs.lock(t)
        conda_env.write_environment_files(t)
    for t in TARGETS.values():
        conda_env.conda_lock(t)
    ci_matrix.write()
    from ternary._build.toolchains import wheels

    for version in sorted({t.cuda.version for t in TARGETS.values() if t.cuda}):
        if version in wheels.LOCKED_VERSIONS:
            wheels.write_lock(version)


if __name__ == "__main__":
    nox.main()
