"""Where the pinned toolchains come from, beyond what envs/targets.toml says about CUDA
versions. The wheel pins live in the generated envs/toolchains/cuda-X.Y.lock files."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DebPin:
    cuda_version: str  # the [cuda."X.Y"] table of targets.toml it provides
    package: str
    version: str
    suite: str
    component: str
    arch: str
    size: int
    sha256: str  # measured on the downloaded file (docs/build.md), not from an index

    @property
    def filename(self) -> str:
        return f"{self.package}_{self.version}_{self.arch}.deb".replace(":", "%3a")


# NVIDIA's CUDA 12.4.131 binaries (nvcc, cicc, cudafe++, fatbinary, nvlink, cuobjdump) as
# Debian packages them; the only reachable source of a CUDA 12 compiler driver here.
DEB = DebPin(
    cuda_version="12.4",
    package="nvidia-cuda-toolkit",
    version="12.4.131~12.4.1-2",
    suite="trixie",
    component="non-free",
    arch="amd64",
    size=87_240_108,
    sha256="cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319",
)

# The pip provider: CUDA majors whose nvidia-cuda-nvcc wheels hold the full compiler driver
# (the -cu12 ones hold ptxas only).
PIP_CUDA_MAJORS = (13,)
