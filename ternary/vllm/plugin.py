"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register()` in every
process it starts (API server, engine core, workers), so TernaryConfig is known wherever
a model is built."""

from __future__ import annotations


def register() -> str:
    """Returns how it registered ("api", "dict" or "already"; `ternary doctor` shows it)."""
    from ternary.vllm.register import register as _register

    return _register()
