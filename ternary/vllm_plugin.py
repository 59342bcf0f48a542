"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register()` in every
process it starts (API server, engine core, workers), so TernaryConfig is known wherever
a model is built."""

from __future__ import annotations

# Starts the line ternary.vllm.linear logs for each layer shape; ternary.smoke reads it from
# server logs (here, because the smoke must import it without vLLM).
KERNEL_LOG_PREFIX = "ternary kernel: "


def register() -> str:
    """Returns how it registered ("api", "dict" or "already"; `ternary doctor` shows it).
    vLLM runs this in every process it starts (engine core, each tensor-parallel worker),
    which is where a hang's Python stacks are wanted (stacks_on_sigusr1)."""
    from ternary.vllm.register import register as _register

    stacks_on_sigusr1()
    return _register()


STACKS_ENV = "TERNARY_STACKS_ON_SIGUSR1"


def stacks_on_sigusr1() -> bool:
    """With TERNARY_STACKS_ON_SIGUSR1=1, SIGUSR1 makes this process write every thread's
    Python stack to stderr (faulthandler), so a hung multi-process engine shows where each
    rank waits: bench-serve sends it before stopping a model that ran out of time."""
    import os

    if os.environ.get(STACKS_ENV) != "1":
        return False
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    return True
