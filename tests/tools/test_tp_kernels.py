"""ternary.tools.tp_kernels: the fused kernel between NCCL all-reduces on two GPUs, each rank's
layer outputs against float64 (gpu), and its refusal where the GPUs are missing (CPU)."""

from __future__ import annotations

import pytest
import torch

from ternary import cli
from ternary.tools import tp_kernels


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has 2 GPUs")
def test_refuses_without_enough_gpus(capsys):
    assert cli.main(["tp-kernels", "--world", "2", "--m", "1"]) == 2
    err = capsys.readouterr().err
    assert "--world 2 needs 2 GPUs" in err and f"has {torch.cuda.device_count()}" in err


def test_rank_logic_on_the_reference_ops_over_gloo(tmp_path):
    """The whole rank program (weights, the layer pattern, float64 checks before and after
    each all-reduce, progress, the report) on the CPU reference ops: what the GPU run
    executes, minus the kernels."""
    # a Llama of hidden 256 (attention 128 and MLP 320 a rank), so the reference ops are quick
    small = (("qkv", 256, 384), ("o_proj", 128, 256), ("gate_up", 256, 640),
             ("down_proj", 320, 256))
    r = tp_kernels.run(2, (1, 3), layers=2, timeout=240, workdir=tmp_path, device="cpu",
                       say=lambda *_: None, shapes=small)
    assert r["ok"] and not r["hung"], r
    for d in r["ranks"]:
        assert d["last"] == "exit"
        assert [c["what"] for c in d["checks"]] == [
            f"{name}{tail} M={m}" for m in (1, 3) for name in ("o_proj", "down_proj")
            for tail in ("", " + all_reduce")]
        assert all(c["finite"] and c["rel_err"] < tp_kernels.TOL for c in d["checks"])
    # both ranks summed the same thing
    assert [c["rel_err"] for c in r["ranks"][0]["checks"][1::2]] == pytest.approx(
        [c["rel_err"] for c in r["ranks"][1]["checks"][1::2]])
    progress = (tmp_path / "rank1.progress").read_text()
    assert "all_reduce down_proj M=3 (3, 256) torch.bfloat16 (c10d)" in progress
    assert "gate_up M=3 K=256" in progress and "down_proj M=3 K=320" in progress


def test_bad_token_counts_are_named(capsys):
    assert cli.main(["tp-kernels", "--m", "1,x"]) == 2
    assert "invalid literal" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (tensor parallel 2)")
@pytest.mark.parametrize("sync, comm", [(False, "c10d"), (True, "c10d"), (False, "pynccl")],
                         ids=["queued", "sync-each-op", "pynccl"])
def test_llama7b_tp2_layers_with_all_reduce(sync, comm, tmp_path):
    """Decode, prefill and vLLM's profiling-run token counts (8192 server, 16384 LLM class)
    through the per-rank Llama-2-7B shapes with NCCL all-reduces between them (torch's, or
    vLLM's on the compute stream as its workers run them); a rank that stops names its op."""
    if comm == "pynccl":
        pytest.importorskip("vllm", reason="--comm pynccl needs vLLM")
    r = tp_kernels.run(2, (1, 16, 128, 2048, 8192, 16384), layers=2, sync=sync, timeout=240,
                       workdir=tmp_path, comm=comm)
    why = "; ".join(f"rank {d['rank']}: {d.get('error', 'ok')} (last: {d['last']})"
                    for d in r["ranks"])
    assert r["ok"], f"seed {r['seed']}, {'hung' if r['hung'] else 'failed'}: {why}"
    for d in r["ranks"]:
        assert len(d["checks"]) == 4 * 6, d["checks"]


def test_cpu_dry_run_takes_c10d_only():
    with pytest.raises(tp_kernels.TpKernelsError, match="CPU dry run sums through"):
        tp_kernels.run(2, (1,), comm="pynccl", device="cpu")


def test_unknown_comm_is_refused():
    with pytest.raises(tp_kernels.TpKernelsError, match="--comm 'mpi': use c10d or pynccl"):
        tp_kernels.run(2, (1,), comm="mpi")


def test_pynccl_without_vllm_is_refused(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(tp_kernels.TpKernelsError, match="vLLM is not importable"):
        tp_kernels.run(2, (1,), comm="pynccl")


def test_llama7b_shapes_per_rank():
    assert tp_kernels.llama7b_shapes(2) == (("qkv", 4096, 6144), ("o_proj", 2048, 4096),
                                            ("gate_up", 4096, 11008), ("down_proj", 5504, 4096))
    # TP=4: down_proj's K of 43 k tiles, one more than whole rounds of wgmma_big's 6 stages
    assert tp_kernels.llama7b_shapes(4)[3] == ("down_proj", 2752, 4096)
    with pytest.raises(ValueError, match="tensor parallel 3 does not divide"):
        tp_kernels.llama7b_shapes(3)
