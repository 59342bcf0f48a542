"""What `nox -s build-<target>` and `nox -s test-<target>` do: locked environment, pinned
toolchain, refusals, compile, SASS check, wheel, report. Standard library only (it runs in
the noxfile's own interpreter); torch is asked about through the target environment's python.

Runnable without nox too: `python -m ternary._build.pipeline build h100 --toolchain deb`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ternary import settings
from ternary._build import archs, checks, envs, matrix, reproducible, sass, sass_order, staging

DIST = matrix.REPO / "dist"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options after `--` of `nox -s build-<target>` / `test-<target>`."""
    p = argparse.ArgumentParser(prog="nox -s build-<target> --", add_help=True)
    p.add_argument("--toolchain", default="auto", choices=["auto", "conda", "system", "pip", "deb"],
                   help="where the pinned CUDA toolchain comes from (default: auto)")
    p.add_argument("--allow-cuda-minor-mismatch", action="store_true",
                   help="build with a CUDA minor version other than torch's (the report says so)")
    p.add_argument("--host-torch", action="store_true",
                   help="build and test against the torch already installed on this host "
                        "(GPU hosts whose torch must not be replaced); implies nothing is installed")
    p.add_argument("--host-python", default="python3",
                   help="with --host-torch: the python that holds the host's torch")
    p.add_argument("--ptx-arch", default=None, metavar="MAJOR.MINOR",
                   help="compile the device code as PTX of this arch only (8.0: compute_80), "
                        "no SASS: the driver JIT-compiles it, so an sm_90 GPU runs the sm_80 "
                        "code path (docs/build.md, PTX builds)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--workdir", type=Path, default=None,
                   help="reproduce-<target>: where the two fresh checkouts go (default: "
                        "<TMPDIR>/vllm-ternary-reproduce-<target>; emptied first)")
    p.add_argument("--keep", action="store_true",
                   help="reproduce-<target>: keep the two checkouts (wheels and reports are "
                        "kept in dist/reproduce-<target>/ either way)")
    p.add_argument("pytest_args", nargs="*",
                   help="test-<target>: extra arguments for pytest; smoke-<target>: for `ternary smoke`")
    return p.parse_args(argv)


def torch_facts(py: Path) -> dict[str, str | None]:
    code = ("import json, torch; print(json.dumps({'torch': torch.__version__, "
            "'torch_cuda': torch.version.cuda, 'gpus': [torch.cuda.get_device_name(i) for i in "
            "range(torch.cuda.device_count())] if torch.cuda.is_available() else []}))")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise envs.EnvError(f"`{py} -c 'import torch'` failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check_host_torch(target: matrix.Target, facts: dict) -> list[str]:
    """--host-torch keeps the host's torch: the CUDA major must still match the target."""
    notes = [f"host torch {facts['torch']} used instead of the locked torch {target.torch}"]
    if not facts["torch_cuda"]:
        raise checks.ToolchainError(f"--host-torch: the host's torch {facts['torch']} is a CPU build")
    host_major = facts["torch_cuda"].split(".")[0]
    if target.cuda and host_major != str(target.cuda.major):
        raise checks.ToolchainError(
            f"--host-torch: the host's torch {facts['torch']} is built with CUDA {facts['torch_cuda']}, "
            f"but target {target.name} is CUDA {target.cuda.version}: pick the target whose CUDA "
            "major matches the host (see `ternary targets`)"
        )
    return notes


def build(target: matrix.Target, opts: argparse.Namespace) -> dict:
    from ternary._build import toolchains  # the providers (downloads happen there)

    if target.platform == "windows" and os.name != "nt":
        raise checks.ToolchainError(
            f"target {target.name} builds with MSVC on native Windows; run `nox -s build-{target.name}` there")
    if not target.arch_list:
        return build_reference(target)
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    py = envs.ensure(target, host_torch=opts.host_torch, host_python=opts.host_python)
    timings["environment_s"] = time.monotonic() - t0
    facts = torch_facts(py)
    notes = _check_host_torch(target, facts) if opts.host_torch else []

    t1 = time.monotonic()
    tc = toolchains.resolve(target, opts.toolchain,
                           allow_cuda_minor_mismatch=opts.allow_cuda_minor_mismatch)
    timings["toolchain_s"] = time.monotonic() - t1
    notes += list(tc.notes)
    ptx = archs.ptx_arch(opts.ptx_arch) if opts.ptx_arch else None
    pre = checks.preflight(cuda_home=tc.cuda_home, torch_cuda=facts["torch_cuda"],
                           arch_list=[ptx] if ptx else target.arch_list,
                           allow_cuda_minor_mismatch=opts.allow_cuda_minor_mismatch)
    if pre["minor_mismatch"] != "no" and not tc.minor_mismatch:
        notes.append(f"CUDA {pre['nvcc_version']} compiles for torch built with CUDA "
                     f"{facts['torch_cuda']} (--allow-cuda-minor-mismatch)")

    local = target.local_version + (f".ptx{ptx.replace('.', '')}" if ptx else "")
    epoch, epoch_from = reproducible.source_date_epoch(matrix.REPO)
    env = {**os.environ, **tc.env,
           "SOURCE_DATE_EPOCH": str(epoch),
           "TERNARY_ARCH_LIST": target.torch_arch_list,
           "TERNARY_LOCAL_VERSION": local,
           "TERNARY_BUILD_DIR": str(matrix.REPO / "build" / (
               target.name + (f"-ptx{ptx.replace('.', '')}" if ptx else ""))),
           "TERNARY_PTX_ARCH": ptx or "",
           "TERNARY_ALLOW_CUDA_MINOR_MISMATCH": "1" if opts.allow_cuda_minor_mismatch else "0",
           "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))}
    env.pop("TERNARY_NO_EXTENSION", None)
    DIST.mkdir(exist_ok=True)
    for old in DIST.glob(f"vllm_ternary-*+{local}-*.whl"):
        old.unlink()
    t2 = time.monotonic()
    what = f"{archs.virtual(ptx)} PTX only" if ptx else target.torch_arch_list
    print(f"[{target.name}] compiling ternary._C for {what} with {tc.provider} "
          f"CUDA {tc.nvcc_version} ...", flush=True)
    # the wheel is built into dist/.wheel.building-PID and renamed into dist/ only when
    # complete: a killed build leaves no file with a wheel's final name (the next removes it)
    for msg in staging.remove_stale_temp_dirs(DIST / "wheel", "building"):
        print(f"[{target.name}] {msg}", flush=True)
    building = staging.temp_dir_for(DIST / "wheel", "building")
    shutil.rmtree(building, ignore_errors=True)
    try:
        subprocess.run([str(py), "-m", "build", "--wheel", "--no-isolation",
                        "--skip-dependency-check", "--outdir", str(building), str(matrix.REPO)],
                       env=env, check=True)
        for w in building.glob("*.whl"):
            os.replace(w, DIST / w.name)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    timings["compile_s"] = time.monotonic() - t2
    wheels = sorted(DIST.glob(f"vllm_ternary-*+{local}-*.whl"))
    if len(wheels) != 1:
        raise sass.SassError(f"expected one wheel for +{local} in {DIST}, found {wheels}")
    wheel = wheels[0]
    reproducible.normalize_wheel(wheel, epoch)
    if ptx:
        # cuobjdump --list-ptx names compute_80's PTX sm_80
        found = sass.check_wheel(tc.cuobjdump, wheel, (), ptx=(matrix.arch_to_sm(ptx),))
    else:
        found = sass.check_wheel(tc.cuobjdump, wheel, target.sm_list)
    order = {"checked": False, "why": "a PTX build: the driver compiles it"}
    if not ptx:
        with tempfile.TemporaryDirectory() as tmp:
            order = sass_order.check_library(
                tc.cuobjdump, sass.extension_from_wheel(wheel, Path(tmp)), target.sm_list)
    timings["total_s"] = time.monotonic() - t0
    report = {
        "target": target.name,
        "toolchain": tc.provider,
        "cuda_home": str(tc.cuda_home),
        "nvcc_version": tc.nvcc_version,
        "torch_version": facts["torch"],
        "torch_cuda": facts["torch_cuda"],
        "arch_list": [archs.virtual(ptx)] if ptx else list(target.arch_list),
        "device_code": (f"{archs.virtual(ptx)} PTX only, for JIT: the driver compiles it at "
                        f"first use on any GPU of compute capability {ptx} or later"
                        if ptx else "SASS for " + ", ".join(target.sm_list)),
        "sass_expected": [] if ptx else list(target.sm_list),
        "sass_found": found["sass"],
        "ptx_found": found["ptx"],
        "pdl_load_order": order,
        "wheel": str(wheel.relative_to(matrix.REPO)),
        "wheel_sha256": reproducible.sha256(wheel),
        "source_date_epoch": epoch,
        "source_date_epoch_from": epoch_from,
        "notes": notes,
        **{k: round(v, 1) for k, v in timings.items()},
    }
    out = DIST / f"build-{target.name}.json"
    out.with_suffix(".json.part").write_text(json.dumps(report, indent=2) + "\n")
    os.replace(out.with_suffix(".json.part"), out)
    return report


def build_reference(target: matrix.Target) -> dict:
    """The reference-only wheel (no ternary._C; the ops run the PyTorch reference), built
    with the target's environment: what a target without an arch list ships."""
    t0 = time.monotonic()
    py = envs.ensure(target)
    epoch, epoch_from = reproducible.source_date_epoch(matrix.REPO)
    DIST.mkdir(exist_ok=True)
    pattern = "vllm_ternary-*-py3-none-any.whl"
    for old in DIST.glob(pattern):
        old.unlink()
    env = {**os.environ, "TERNARY_NO_EXTENSION": "1", "SOURCE_DATE_EPOCH": str(epoch),
           "TERNARY_BUILD_DIR": str(matrix.REPO / "build" / target.name)}
    env.pop("TERNARY_LOCAL_VERSION", None)
    print(f"[{target.name}] building the reference-only wheel (no ternary._C) ...", flush=True)
    subprocess.run([str(py), "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                    "--outdir", str(DIST), str(matrix.REPO)], env=env, check=True)
    wheels = sorted(DIST.glob(pattern))
    if len(wheels) != 1:
        raise sass.SassError(f"expected one reference-only wheel ({pattern}) in {DIST}, found {wheels}")
    wheel = wheels[0]
    reproducible.normalize_wheel(wheel, epoch)
    report = {
        "target": target.name,
        "toolchain": "none (reference-only: no ternary._C)",
        "wheel": str(wheel.relative_to(matrix.REPO)),
        "wheel_sha256": reproducible.sha256(wheel),
        "source_date_epoch": epoch,
        "source_date_epoch_from": epoch_from,
        "notes": [],
        "total_s": round(time.monotonic() - t0, 1),
    }
    (DIST / f"build-{target.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def print_report(report: dict, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    width = max(len(k) for k in report)
    print(f"\nbuild report: {report['target']}")
    for k, v in report.items():
        if isinstance(v, list):
            v = ", ".join(map(str, v)) or "none"
        print(f"  {k.ljust(width)}  {v}")


def install_wheel(py: Path, wheel: Path, host_torch: bool) -> None:
    if host_torch:
        cmd = [str(py), "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-index", str(wheel)]
    else:
        cmd = [envs.uv(), "pip", "install", "--python", str(py), "--no-deps", "--reinstall", str(wheel)]
    subprocess.run(cmd, check=True)


def install_reference(py: Path) -> None:
    """This checkout, editable and without ternary._C, into a target environment (CPU
    sessions: the tests, the vLLM compatibility tests, smoke-cpu)."""
    subprocess.run([envs.uv(), "pip", "install", "--quiet", "--python", str(py), "--no-deps",
                    "--no-build-isolation", "-e", str(matrix.REPO)],
                   env={**os.environ, "TERNARY_NO_EXTENSION": "1"}, check=True)


def prepared(target: matrix.Target, opts: argparse.Namespace) -> Path:
    """The target's python with vllm-ternary installed: the freshly built wheel where the
    target has an arch list, else the reference-only package."""
    if not target.arch_list:
        py = envs.ensure(target)
        install_reference(py)
        return py
    report = build(target, opts)
    print_report(report)
    py = envs.ensure(target, host_torch=opts.host_torch, host_python=opts.host_python)
    install_wheel(py, matrix.REPO / report["wheel"], opts.host_torch)
    return py


def smoke_command(target: matrix.Target, py: Path, extra: list[str]) -> list[str]:
    """A target that builds the extension is smoked on what its GPU serves: bf16 through the
    fused kernel. `extra` (after `--`) comes last, so its options win."""
    gpu = ["--dtype", "bfloat16", "--expect-kernel", "fused"] if target.arch_list else []
    return [str(py), "-P", "-m", "ternary", "smoke", "--target", target.name, *gpu, *extra]


def smoke(target: matrix.Target, opts: argparse.Namespace) -> int:
    if not target.vllm:
        raise envs.EnvError(f"target {target.name} has no vLLM: nothing to serve")
    py = prepared(target, opts)
    cmd = smoke_command(target, py, opts.pytest_args)
    print(f"[{target.name}] {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, cwd=matrix.REPO).returncode


def test(target: matrix.Target, opts: argparse.Namespace) -> int:
    py = prepared(target, opts)
    # -P: the checkout must not shadow the installed wheel on sys.path.
    cmd = [str(py), "-P", "-m", "pytest", str(matrix.REPO / "tests"), *opts.pytest_args]
    print(f"[{target.name}] {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, cwd=matrix.REPO).returncode


def reproduce(target: matrix.Target, opts: argparse.Namespace) -> int:
    """Build target twice in two fresh checkouts that differ in path, environment and time;
    0 when the wheels are byte-identical, 1 (with every differing member named) otherwise."""
    build_args = ["--toolchain", opts.toolchain]
    if opts.allow_cuda_minor_mismatch:
        build_args.append("--allow-cuda-minor-mismatch")
    if opts.host_torch:
        build_args += ["--host-torch", "--host-python", opts.host_python]
    if opts.ptx_arch:
        build_args += ["--ptx-arch", opts.ptx_arch]
    workdir = opts.workdir or Path(tempfile.gettempdir()) / f"vllm-ternary-reproduce-{target.name}"
    t0 = time.monotonic()
    result = reproducible.reproduce(matrix.REPO, target.name, build_args, workdir, keep=opts.keep,
                                    log=lambda m: print(m, file=sys.stderr, flush=True))
    result["seconds"] = round(time.monotonic() - t0, 1)
    (DIST / f"reproduce-{target.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    if opts.json:
        print(json.dumps(result, indent=2))
    else:
        reproducible.render(result, f"reproduce-{target.name} at {result['commit'][:12]}")
        if result["uncommitted_changes_ignored"]:
            print("note: this checkout has uncommitted changes; both builds are of the commit "
                  "only", file=sys.stderr)
        print(f"{result['seconds']} s; dist/reproduce-{target.name}.json, wheels in "
              f"dist/reproduce-{target.name}/1 and /2")
    if not result["identical"]:
        print(f"error: the two builds of {target.name} differ (listed above). Compare in depth "
              f"with `diffoscope dist/reproduce-{target.name}/1/*.whl "
              f"dist/reproduce-{target.name}/2/*.whl` (pip install diffoscope)", file=sys.stderr)
        if "-lineinfo" in settings.get("TERNARY_NVCC_FLAGS"):
            print("note: TERNARY_NVCC_FLAGS has -lineinfo, which writes each source's absolute "
                  "path into the device line tables: unset it for a reproducible build",
                  file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("build", "test", "smoke", "reproduce"):
        print("usage: python -m ternary._build.pipeline build|test|smoke|reproduce TARGET [options]",
              file=sys.stderr)
        return 2
    action, name, rest = argv[0], argv[1], argv[2:]
    opts = parse_args(rest)
    try:
        target = matrix.get(name)
        if action == "build":
            print_report(build(target, opts), opts.json)
            return 0
        if action == "reproduce":
            return reproduce(target, opts)
        return (test if action == "test" else smoke)(target, opts)
    except (checks.ToolchainError, envs.EnvError, sass.SassError, sass_order.OrderError,
            matrix.MatrixError, reproducible.ReproError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
