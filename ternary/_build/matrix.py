"""The target matrix, read from envs/targets.toml (the only place that states it)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from ternary import settings

# The checkout: this file's, or TERNARY_REPO's where the package is installed from a wheel
# and the tests of a checkout run against it (test-<target>).
REPO = Path(settings.raw("TERNARY_REPO") or Path(__file__).resolve().parents[2])
# A checkout reads envs/targets.toml itself; an installed wheel carries the copy that
# setup.py puts beside this module at build time.
TARGETS_TOML = next((p for p in (REPO / "envs" / "targets.toml", Path(__file__).with_name("targets.toml"))
                     if p.is_file()), REPO / "envs" / "targets.toml")


class MatrixError(ValueError):
    """targets.toml is inconsistent or a name is not in it."""


@dataclasses.dataclass(frozen=True)
class CudaVersion:
    version: str  # "12.4"
    full_version: str  # "12.4.131"
    max_gcc: int
    msvc_max: str
    archs: tuple[str, ...]

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    gpu: str
    arch_list: tuple[str, ...]
    cuda: CudaVersion | None
    torch: str
    torch_cuda: str
    vllm: str
    pins: tuple[str, ...]
    platform: str
    python: str
    wsl: bool
    notes: str
    exclude: tuple[str, ...] = ()
    find_links: bool = False
    torch_source: str = "pypi"
    tooling: tuple[str, ...] = ()

    @property
    def torch_arch_list(self) -> str:
        """TORCH_CUDA_ARCH_LIST as torch.utils.cpp_extension reads it."""
        return ";".join(self.arch_list)

    @property
    def sm_list(self) -> tuple[str, ...]:
        """The SASS names cuobjdump reports for arch_list: 9.0a -> sm_90a."""
        return tuple(arch_to_sm(a) for a in self.arch_list)

    @property
    def local_version(self) -> str:
        """Wheel local version: +cu124torch2.5 (cpu: +cputorch2.13)."""
        torch_mm = ".".join(self.torch.split("+")[0].split(".")[:2])
        if self.cuda is None:
            return f"cputorch{torch_mm}"
        return f"cu{self.cuda.version.replace('.', '')}torch{torch_mm}"

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch}"

    @property
    def requirements(self) -> list[str]:
        """Top-level requirements of the target's pip layer (the input of `nox -s lock`):
        the torch/vLLM stack, its resolver pins and the shared tooling."""
        reqs = [self.torch_requirement]
        if self.vllm:
            reqs.append(self.vllm)
        reqs += list(self.pins)
        return reqs + list(self.tooling)


def arch_to_sm(arch: str) -> str:
    """'9.0a' -> 'sm_90a', '8.0' -> 'sm_80'."""
    base, _, rest = arch.partition(".")
    if not base.isdigit() or not rest or not rest[0].isdigit():
        raise MatrixError(f"arch {arch!r} is not of the form MAJOR.MINOR[a] (e.g. 8.0, 9.0a)")
    return f"sm_{base}{rest}"


def _read(path: Path | None) -> tuple[Path, dict]:
    env = settings.raw("TERNARY_TARGETS_TOML")
    src = f"{path or env} (from TERNARY_TARGETS_TOML)" if env and not path else None
    path = Path(path or env or TARGETS_TOML)
    src = src or str(path)
    try:
        with open(path, "rb") as f:
            return path, tomllib.load(f)
    except OSError as e:
        raise MatrixError(f"{src}: cannot read the target matrix ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise MatrixError(f"{src}: not valid TOML ({e})") from None


def cuda_versions(path: Path | None = None) -> dict[str, CudaVersion]:
    """The [cuda."X.Y"] tables: what each CUDA version accepts and targets."""
    _, data = _read(path)
    return {
        v: CudaVersion(v, c["full_version"], int(c["max_gcc"]), c["msvc_max"], tuple(c["archs"]))
        for v, c in data.get("cuda", {}).items()
    }


def load(path: Path | None = None) -> dict[str, Target]:
    path, data = _read(path)
    cudas = cuda_versions(path)
    defaults = data.get("defaults", {})
    out: dict[str, Target] = {}
    if not isinstance(data.get("targets"), dict):
        raise MatrixError(f"{path}: no [targets] table; each target is a [targets.NAME] table")
    for name, t in data["targets"].items():
        t = {**defaults, **t}
        cuda = None
        if t["cuda"]:
            if t["cuda"] not in cudas:
                raise MatrixError(
                    f"{path}: target {name!r} uses CUDA {t['cuda']!r}, which has no "
                    f"[cuda.\"{t['cuda']}\"] table (known: {sorted(cudas)})"
                )
            cuda = cudas[t["cuda"]]
        if bool(t["arch_list"]) != bool(cuda):
            raise MatrixError(f"{path}: target {name!r} needs both arch_list and cuda, or neither")
        for a in t["arch_list"]:
            arch_to_sm(a)
        out[name] = Target(
            name=name,
            gpu=t["gpu"],
            arch_list=tuple(t["arch_list"]),
            cuda=cuda,
            torch=t["torch"],
            torch_cuda=t["torch_cuda"],
            vllm=t["vllm"],
            pins=tuple(t["pins"]),
            platform=t["platform"],
            python=t["python"],
            wsl=bool(t["wsl"]),
            notes=t.get("notes", ""),
            exclude=tuple(t["exclude"]),
            find_links=bool(t["find_links"]),
            torch_source=t["torch_source"],
            tooling=tuple(data.get("env", {}).get("tooling", ())),
        )
    return out


def get(name: str) -> Target:
    targets = load()
    if name not in targets:
        raise MatrixError(f"unknown target {name!r}; envs/targets.toml has {sorted(targets)}")
    return targets[name]
