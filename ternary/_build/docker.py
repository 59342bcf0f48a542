"""Build arguments of docker/Dockerfile, rendered from envs/targets.toml (the Dockerfile has
no fact of its own: every ARG defaults to `notset` and a RUN refuses to go on with one).

    python -m ternary._build.docker args TARGET      # --build-arg lines (what `nox -s
                                                     # docker-TARGET` passes to docker/podman)
    python -m ternary._build.docker build TARGET [--engine podman] [--target STAGE]
        [--local-base]                               # bases built here (ternary/_build/images.py)
    python -m ternary._build.docker check            # Dockerfile ARGs == rendered keys
Standard library only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from ternary._build import matrix
from ternary._build.hashing import sha256

DOCKERFILE = matrix.REPO / "docker" / "Dockerfile"
NOTSET = "notset"
# podman/buildah on this project's machines: crun fails, runc works; default ulimits are
# above what the rootful runtime may set.
# --format docker: the OCI format drops SHELL, and with it pipefail.
PODMAN_FLAGS = ["--format", "docker", "--runtime", "runc", "--ulimit", "nofile=1024:1024",
                "--ulimit", "nproc=1024:1024"]
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
_DIGEST = re.compile(r"^[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}$")


LINKS_DIR = matrix.REPO / ".cache" / "docker-links"  # bind-mounted into the env stage's RUN

BUILD_ARGS = ("BASE_IMAGE", "TARGET", "PYTHON_VERSION", "CUDA_VERSION", "TERNARY_ARCH_LIST",
              "TERNARY_LOCAL_VERSION", "TORCH", "VLLM")


class DockerError(RuntimeError):
    """The target cannot be rendered into an image; the message says why and what to do."""


def base_image(target: matrix.Target) -> str:
    """The digest-pinned base of the target: [cuda."X.Y"].image, or the target's own image."""
    _, data = matrix._read(None)
    if target.cuda is not None:
        image = data["cuda"][target.cuda.version].get("image", NOTSET)
        where = f'[cuda."{target.cuda.version}"] image'
    else:
        image = data["targets"][target.name].get("image", NOTSET)
        where = f"[targets.{target.name}] image"
    if image == NOTSET:
        raise DockerError(f"envs/targets.toml {where} is notset for target {target.name!r}: no "
                          "digest of its base image is known. Add one looked up with "
                          "`docker buildx imagetools inspect` (never a guessed digest)")
    if not _DIGEST.match(image):
        raise DockerError(f"envs/targets.toml {where} = {image!r} is not pinned by digest "
                          "(NAME:TAG@sha256:<64 hex>); pin it so builds are reproducible")
    return image


def render_build_args(target: matrix.Target | str) -> dict[str, str]:
    """The --build-arg values for docker/Dockerfile, every one from targets.toml."""
    if isinstance(target, str):
        target = matrix.get(target)
    if target.platform != "linux":
        raise DockerError(f"target {target.name!r} is platform {target.platform!r}: "
                          "docker/Dockerfile builds Linux images only (native Windows builds "
                          "with `nox -s build-windows` on a Windows host)")
    args = {
        "BASE_IMAGE": base_image(target),
        "TARGET": target.name,
        "PYTHON_VERSION": target.python,
        "CUDA_VERSION": target.cuda.version if target.cuda else "none",
        "TERNARY_ARCH_LIST": target.torch_arch_list or "none",
        "TERNARY_LOCAL_VERSION": target.local_version,
        "TORCH": target.torch,
        "VLLM": target.vllm or "none",
    }
    assert tuple(args) == BUILD_ARGS
    return args


def dockerfile_args(path: Path = DOCKERFILE) -> dict[str, str]:
    """ARG NAME=DEFAULT of the Dockerfile (the first declaration of each)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^ARG\s+(\w+)(?:=(\S*))?", path.read_text(), re.M):
        out.setdefault(m.group(1), m.group(2) or "")
    return out


def drift(path: Path = DOCKERFILE) -> list[str]:
    """Differences between the Dockerfile's ARGs and what render_build_args produces."""
    args = dockerfile_args(path)
    keys = set(BUILD_ARGS)
    problems = [f"{path.name}: ARG {k} has default {v!r}, expected {NOTSET!r} (every value "
                "comes from envs/targets.toml)" for k, v in args.items() if v != NOTSET]
    problems += [f"{path.name}: ARG {k} is not rendered by ternary/_build/docker.py"
                 for k in sorted(set(args) - keys)]
    problems += [f"{path.name}: lacks ARG {k}=notset that docker.py renders"
                 for k in sorted(keys - set(args))]
    for t in matrix.load().values():
        if t.platform == "linux":
            try:
                render_build_args(t)
            except DockerError as e:
                problems.append(str(e))
    return problems


def lock_hashes(target: matrix.Target) -> set[str]:
    """Every sha256 the target's requirements.lock allows."""
    lock = matrix.REPO / "envs" / target.name / "requirements.lock"
    return set(re.findall(r"--hash=sha256:([0-9a-f]{64})", lock.read_text()))


def stage_links(target: matrix.Target | str, links: Path = LINKS_DIR) -> list[Path]:
    """Fill the build context's find-links directory with the wheels of pip's configured
    find-links whose sha256 the target's lock names (torch 2.13.0+cpu for cpu; nothing for a
    target whose lock is all PyPI); returns them. A find_links target whose lock names a
    wheel found nowhere is refused."""
    from ternary._build import envs

    if isinstance(target, str):
        target = matrix.get(target)
    links.mkdir(parents=True, exist_ok=True)
    wanted = lock_hashes(target) if target.find_links else set()
    keep: dict[str, Path] = {}
    for d in envs.find_links() if target.find_links else []:
        for whl in sorted(Path(d.removeprefix("file://")).glob("*.whl")):
            if (links / whl.name).is_file() and sha256(links / whl.name) in wanted:
                keep[whl.name] = links / whl.name
                continue
            if sha256(whl) in wanted:
                shutil.copyfile(whl, links / whl.name)
                keep[whl.name] = links / whl.name
    for old in links.iterdir():
        if old.name not in keep:
            old.unlink()
    if target.find_links and not keep:
        raise DockerError(f"target {target.name} needs wheels from pip's find-links "
                          f"({', '.join(envs.find_links()) or 'none configured'}) and none there "
                          f"has a sha256 of envs/{target.name}/requirements.lock")
    return sorted(keep.values())


def local_base_overrides(target: matrix.Target | str, toolchain: str = "auto") -> dict[str, str]:
    """BASE_IMAGE built here (ternary/_build/images.py) for a machine that cannot pull the
    pinned one: debootstrap + the target's python (+ its CUDA toolchain)."""
    from ternary._build import images

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    return {"BASE_IMAGE": images.ensure_base(target, toolchain=toolchain, say=say)}


def build_command(target: matrix.Target | str, *, engine: str = "podman", tag: str | None = None,
                  stage: str | None = None, overrides: dict[str, str] | None = None,
                  host_ca: str | None = None) -> list[str]:
    """The docker/podman build command. host_ca mounts this machine's CA bundle at
    /run/host-ca.crt for the RUN steps (networks that intercept TLS): the Dockerfile's
    downloading RUNs use it as PIP_CERT/SSL_CERT_FILE where it exists (podman 4.3's `build
    --env` reaches the image's config, not the RUN steps)."""
    if isinstance(target, str):
        target = matrix.get(target)
    args = {**render_build_args(target), **(overrides or {})}
    cmd = [engine, "build", "-f", str(DOCKERFILE)]
    if engine in ("podman", "buildah"):
        cmd += PODMAN_FLAGS
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    if host_ca:
        cmd += ["-v", f"{host_ca}:/run/host-ca.crt:ro"]
    if stage:
        cmd += ["--target", stage]
    cmd += ["-t", tag or f"vllm-ternary:{target.name}", str(matrix.REPO)]
    return cmd


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ternary._build.docker")
    p.add_argument("command", choices=["args", "build", "check"])
    p.add_argument("target", nargs="?")
    p.add_argument("--engine", default=None, help="docker or podman (default: whichever exists)")
    p.add_argument("--target", dest="stage", help="build only up to this Dockerfile stage")
    p.add_argument("--base-image", help="override BASE_IMAGE (e.g. a locally imported image)")
    p.add_argument("--local-base", action="store_true",
                   help="build BASE_IMAGE here (debootstrap, the target's python "
                        "and CUDA toolchain) instead of pulling the pinned images")
    p.add_argument("--toolchain", default="auto", help="with --local-base: the CUDA toolchain")
    p.add_argument("-t", "--tag", help="image tag (default vllm-ternary:TARGET)")
    p.add_argument("--no-cache", action="store_true", help="build every layer anew (cold build)")
    p.add_argument("--host-ca", nargs="?", const=HOST_CA, default=None,
                   help=f"mount this machine's CA bundle into RUN steps (default {HOST_CA})")
    a = p.parse_args(argv)
    if a.command == "check":
        problems = drift()
        for line in problems:
            print(line)
        return 1 if problems else 0
    if not a.target:
        p.error(f"{a.command} needs a TARGET (one of {', '.join(matrix.load())})")
    if a.command == "args":
        for k, v in render_build_args(a.target).items():
            print(f"--build-arg {k}={v}")
        return 0
    engine = a.engine or next((e for e in ("docker", "podman") if shutil.which(e)), None)
    if engine is None:
        print("neither docker nor podman is on PATH: install one (apt install podman)")
        return 1
    from ternary._build.images import ImageError

    try:
        overrides = local_base_overrides(a.target, a.toolchain) if a.local_base else {}
        if a.base_image:
            overrides["BASE_IMAGE"] = a.base_image
        stage_links(a.target)
        cmd = build_command(a.target, engine=engine, stage=a.stage, overrides=overrides or None,
                            host_ca=a.host_ca, tag=a.tag)
    except (DockerError, ImageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if a.no_cache:
        cmd.insert(2, "--no-cache")
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
