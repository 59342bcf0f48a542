"""The smoke driver (ternary.tools.smoke): its failure paths with stand-in processes (fast), and
the real thing against a vLLM OpenAI server (marker serve: `nox -s smoke-cpu`)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from ternary import cli
from ternary.tools import engine, smoke


def _server(tmp_path, code: str) -> smoke.Server:
    pytest.importorskip("requests", reason="the smoke driver talks HTTP through requests")
    port = engine.free_port()
    return smoke.Server([sys.executable, "-c", code], port, tmp_path / "server.log")


def test_server_exiting_early_is_reported_with_its_log(tmp_path):
    s = _server(tmp_path, "import sys; print('no model here'); sys.exit(3)")
    with pytest.raises(smoke.SmokeError, match="exited with status 3") as e:
        s.wait_healthy(30)
    assert "no model here" in str(e.value)
    s.stop(5, grace=1)


def test_health_timeout_is_bounded(tmp_path):
    s = _server(tmp_path, "import time; time.sleep(60)")
    t = time.monotonic()
    with pytest.raises(smoke.SmokeError, match=r"not healthy after 1 s; raise --health-timeout"):
        s.wait_healthy(1)
    assert time.monotonic() - t < 15
    ok, detail = s.stop(10, grace=1)
    assert ok, detail


def test_stop_reports_children_that_survive_sigterm(tmp_path):
    # the parent exits on SIGTERM; its child ignores SIGTERM and must be reported (then
    # killed). Not a Python child: a Python one dies with its parent (the tree hook's
    # parent-death signal), which is what guarded_popen is for
    code = ("import signal, subprocess, sys, time\n"
            "subprocess.Popen(['sh', '-c', 'trap \"\" TERM; echo 1; sleep 120'])\n"
            "time.sleep(120)\n")
    s = _server(tmp_path, code)
    deadline = time.monotonic() + 20
    while not engine.descendants(s.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)  # let the child install its handler
    children = engine.descendants(s.proc.pid)
    assert children
    ok, detail = s.stop(2, grace=1)
    assert not ok and "still alive" in detail and str(min(children)) in detail
    time.sleep(0.5)
    assert not any(engine.alive(p) for p in children)


def test_unknown_format_is_refused(capsys):
    assert cli.main(["smoke", "--formats", "ternary,gguf"]) == 2
    assert "unknown ['gguf']" in capsys.readouterr().err


@pytest.mark.serve
def test_smoke_cpu(tmp_path, capsys):
    pytest.importorskip("vllm", reason="vLLM is not installed in this environment")
    rc = cli.main(["smoke", "--target", "cpu", "--json", "--keep", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    failed = [(r["format"], c) for r in report["runs"] for c in r["checks"] if not c["ok"]]
    assert rc == 0 and report["ok"], failed


class _Ref:
    """Stands in for smoke.Reference: fixed greedy tokens and per-token margins."""

    def __init__(self, want, margins, tol):
        self.want, self._margins, self.tol = want, margins, tol

    def greedy(self, prompt):
        return self.want

    def margins(self, prompt, got):
        return self._margins


def test_compare_float32_needs_identical_tokens():
    ok, detail = smoke._compare([1, 2, 3], "", [9], _Ref([1, 2, 3], [0, 0, 0], 0.0))
    assert ok and detail == "tokens identical"
    ok, detail = smoke._compare([1, 2, 4], "", [9], _Ref([1, 2, 3], [0, 0, 0.01], 0.0))
    assert not ok and "[1, 2, 4] != reference [1, 2, 3]" in detail


def test_compare_below_float32_accepts_near_ties_only():
    ok, detail = smoke._compare([1, 5, 6], "", [9], _Ref([1, 2, 3], [0, 0.2, 0.1], 0.25))
    assert ok and "from token 1 on" in detail and "0.200" in detail
    ok, detail = smoke._compare([1, 5, 6], "", [9], _Ref([1, 2, 3], [0, 0.1, 1.7], 0.25))
    assert not ok and "token 2 is 1.700 logits below" in detail


def test_kernel_check_reads_the_plugins_log_lines(tmp_path):
    from ternary.vllm import KERNEL_LOG_PREFIX

    log = tmp_path / "server.log"
    fused = f"INFO 11-29 10:00:00 [linear.py:40] {KERNEL_LOG_PREFIX}fused (dequantize + cuBLAS above M=64) for n=384 k=128\n"
    log.write_text("starting\n" + fused)
    ok, detail = smoke.check_kernel(log, "fused")
    assert ok and "1 layer shapes on fused" in detail
    log.write_text(fused + f"{KERNEL_LOG_PREFIX}cublas for n=128 k=384\n")
    ok, detail = smoke.check_kernel(log, "fused")
    assert not ok and "cublas for n=128 k=384" in detail
    log.write_text("starting\n")
    ok, detail = smoke.check_kernel(log, "fused")
    assert not ok and "chose no kernel" in detail


def test_server_command_passes_dtype_and_safe_path(tmp_path, monkeypatch):
    cmd = smoke.server_command(tmp_path, "ternary", 1234, "bfloat16")
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert ("-P" in cmd) == bool(sys.flags.safe_path)


def test_negative_tolerance_is_refused(capsys):
    assert cli.main(["smoke", "--dtype", "bfloat16", "--logit-tol", "-1"]) == 2
    assert "--logit-tol must be >= 0" in capsys.readouterr().err


def test_server_command_passes_tensor_parallel_only_above_one(tmp_path):
    cmd = smoke.server_command(tmp_path, "ternary", 1234, "bfloat16", tp=2)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert "--tensor-parallel-size" not in smoke.server_command(tmp_path, "vllm", 1234)


def _answers_only(tmp_path):
    from ternary.tools.synthetic import bigmodel

    dims = bigmodel.shape("tiny")
    d = bigmodel.write_dense_config(tmp_path / "m", dims)
    return smoke.AnswersOnly(d)


def test_answers_only_checks_count_vocabulary_and_decoding(tmp_path):
    ref = _answers_only(tmp_path)
    assert ref.vocab == 512 and len(ref.tok) == 512  # the tokenizer covers every id
    ids = [5, 300, 511] + [7] * (smoke.MAX_TOKENS - 3)
    text = ref.tok.decode(ids, skip_special_tokens=True)
    ok, detail = smoke._compare(ids, text, [1], ref)
    assert ok and "no reference" in detail
    ok, detail = smoke._compare(ids[:-1], text, [1], ref)
    assert not ok and f"{smoke.MAX_TOKENS - 1} tokens, asked for {smoke.MAX_TOKENS}" in detail
    ok, detail = smoke._compare(ids[:-1] + [512], text, [1], ref)
    assert not ok and "token ids [512] outside the vocabulary of 512" in detail
    ok, detail = smoke._compare(ids, text + "x", [1], ref)
    assert not ok and "is not the decoding of its tokens" in detail
    # a last token that ends inside a UTF-8 character: vLLM holds its bytes back
    partial = ref.tok.decode(ids, skip_special_tokens=True) + "\ufffd"
    ref.tok = type("T", (), {"decode": lambda self, *_a, **_k: partial})()
    ok, _ = smoke._compare(ids, text, [1], ref)
    assert ok
    ok, detail = smoke._compare(ids, text[:-1], [1], ref)
    assert not ok and "is not the decoding" in detail
    ok, detail = smoke._compare(None, text, [1], ref)
    assert not ok and "no token_ids" in detail


@pytest.mark.parametrize("args, match", [
    (["--tp", "0"], "--tp must be >= 1"),
    (["--model", "/nonexistent"], "no config.json there"),
])
def test_smoke_refuses_bad_tp_and_model(args, match, capsys):
    assert cli.main(["smoke", *args]) == 2
    assert match in capsys.readouterr().err


def test_smoke_refuses_more_ranks_than_gpus(monkeypatch, capsys):
    from ternary.tools import engine

    monkeypatch.setattr(engine, "gpus_available", lambda: 1)
    assert cli.main(["smoke", "--tp", "2"]) == 2
    assert "--tp 2: tensor parallel 2 needs 2 GPUs and torch sees 1 here" in capsys.readouterr().err


def test_below_float32_the_tiny_models_have_no_outlier_channels():
    """int8 rounding of outlier-dominated activations makes bf16 tokens chaotic (see
    smoke.tiny_model), so only the float32 smoke serves make-tiny's outliers."""
    for fmt in smoke.TINY_MODELS:
        assert smoke.tiny_model(fmt, "float32")["outliers"] is True
        assert smoke.tiny_model(fmt, "bfloat16")["outliers"] is False
        assert smoke.tiny_model(fmt, "float16")["outliers"] is False
    assert smoke.tiny_model("bitnet-arch", "bfloat16")["arch"] == "bitnet"


def test_parallel_runs_every_format_at_once_in_order(monkeypatch, capsys):
    """--parallel: each format's smoke_one runs in its own thread at the same time (a barrier
    both must reach), and the report keeps the formats' order."""
    import threading

    barrier = threading.Barrier(3, timeout=20)
    calls = []

    def fake(fmt, launcher, work, health_timeout, say, status, dtype, tol, expect_kernel, tp,
             model_dir, server_args=()):
        calls.append((fmt, tuple(server_args)))
        barrier.wait()
        return smoke.ServerRun(fmt, launcher, 0, [smoke.Check("healthy", True, 0.0)])

    monkeypatch.setattr(smoke, "smoke_one", fake)
    rc = cli.main(["smoke", "--formats", "ternary,bitnet,bitnet-arch", "--parallel", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["format"] for r in report["runs"]] == ["ternary", "bitnet", "bitnet-arch"]
    assert sorted(f for f, _ in calls) == ["bitnet", "bitnet-arch", "ternary"]


def test_parallel_servers_on_a_gpu_get_a_fixed_kv_cache(monkeypatch, capsys):
    """Side by side on one GPU each server gets a share of the memory and a fixed KV cache
    size: vLLM's free-memory profiling fails when a neighbour frees memory meanwhile."""
    import torch

    seen = []

    def fake(fmt, launcher, work, health_timeout, say, status, dtype, tol, expect_kernel, tp,
             model_dir, server_args=()):
        seen.append(list(server_args))
        return smoke.ServerRun(fmt, launcher, 0, [smoke.Check("healthy", True, 0.0)])

    monkeypatch.setattr(smoke, "smoke_one", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(smoke, "too_few_gpus", lambda tp: None)
    assert cli.main(["smoke", "--formats", "ternary,bitnet", "--parallel", "--json"]) == 0
    capsys.readouterr()
    for args in seen:
        assert args[args.index("--gpu-memory-utilization") + 1] == "0.45"
        assert int(args[args.index("--kv-cache-memory-bytes") + 1]) == smoke.PARALLEL_KV_CACHE_BYTES
    # a vLLM without the option (the 0.6 builds) gets the memory share alone
    monkeypatch.setattr(smoke, "_vllm_takes", lambda option: False)
    assert smoke.parallel_server_args(3) == ("--gpu-memory-utilization", "0.30")


def test_ports_handed_out_are_never_repeated():
    ports = {engine.free_port() for _ in range(200)}
    assert len(ports) == 200
