"""The fault matrix's verdicts and the load's models (ternary.tools.fault_matrix), without a
server; the real servers run in tests/tools/test_supervise.py (slow, serve) and
`ternary fault-matrix`."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ternary.commands import fault_matrix as command
from ternary.tools import fault_matrix
from ternary.tools.fault_matrix import LoadRun, Row, table


def test_the_fault_table_fails_a_leftover_or_a_loss():
    good = Row("SIGKILL engine", 137, 1.2, 0, 0, 40, "non-zero", "x")
    assert good.ok
    assert not Row("SIGKILL engine", 137, 1.2, 1, 0, 40, "non-zero").ok  # a leftover
    assert not Row("SIGKILL engine", 137, 6.0, 0, 0, 40, "non-zero").ok  # too slow
    assert not Row("SIGKILL engine", 0, 1.0, 0, 0, 40, "non-zero").ok  # a clean exit
    assert not Row("flood", None, None, 0, 2, 96, "alive").ok  # lost requests
    assert Row("SIGTERM", 0, 3.0, 0, 0, 40, "0").ok
    assert "| SIGKILL engine | 137 | 1.20 | 0 | 0 | 40 | ok | x |" in table([good])


def test_the_load_fails_a_wrong_answer_a_malformed_2xx_or_memory_growth():
    run = LoadRun("bitnet-arch", 2000, 400, 128, 0, 0, 0, 0.5, 0.9, 600, 1000, 1050, 9000)
    assert run.ok  # +5 %: the bar itself
    assert not dataclasses.replace(run, pss_end_kib=1051).ok
    assert not dataclasses.replace(run, pss_end_kib=949).ok
    assert not dataclasses.replace(run, valid_wrong=1).ok
    assert not dataclasses.replace(run, valid_failed=1).ok
    assert not dataclasses.replace(run, malformed_not_4xx=1).ok


def test_the_load_runs_on_all_three_make_tiny_models_by_default():
    """Issue 37's load names a ternary, a Llama bitnet and a BitNetForCausalLM model."""
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    assert p.parse_args([]).formats.split(",") == ["ternary", "bitnet", "bitnet-arch"]


def test_the_bitnet_arch_model_is_bitnet_for_causal_lm(tmp_path):
    b = fault_matrix.Bench(tmp_path, lambda _msg: None, health_timeout=1)
    config = json.loads((b.model("bitnet-arch") / "config.json").read_text())
    assert config["architectures"] == ["BitNetForCausalLM"]
    assert config["quantization_config"]["quant_method"] == "bitnet"


def test_an_unknown_load_model_is_refused_before_anything_starts(tmp_path, capsys):
    work = tmp_path / "work"
    assert fault_matrix.main(False, False, load=True, formats=("bitnet", "llama"),
                             work=work) == 2
    err = capsys.readouterr().err
    assert "--formats: unknown ['llama']" in err and "bitnet-arch" in err, err
    assert not work.exists()


def test_without_setproctitle_the_victims_are_found_by_vllms_log_tags(tmp_path):
    """vLLM names its processes only when setproctitle is installed (the H200's vLLM had
    none): the engine core and the worker are then the PIDs its log prefixes name, and only
    if they are in the server's tree."""
    import subprocess
    import sys
    import time

    from ternary.tools import engine

    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)']); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not engine.descendants(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = engine.descendants(proc.pid)
        log = tmp_path / "server.log"
        log.write_text(f"(APIServer pid={proc.pid}) INFO started\n"
                       f"(EngineCore pid=1) INFO not in the tree\n"
                       f"(EngineCore pid={child}) INFO Initializing a V1 LLM engine\n")
        server = argparse.Namespace(proc=proc, log_path=log)
        assert fault_matrix.find(server, "VLLM::EngineCor") == child
        assert fault_matrix.find(server, "VLLM::Worker") is None  # no tag, no guess
        log.write_text(f"(Worker_TP0 pid={child}) INFO loading\n")
        assert fault_matrix.find(server, "VLLM::Worker") == child
        assert fault_matrix.find(server, "VLLM::EngineCor") is None
    finally:
        for p in engine.descendants(proc.pid) | {proc.pid}:
            subprocess.run(["kill", "-9", str(p)], check=False)
        proc.wait()


def test_each_row_is_said_when_it_finishes():
    said = []
    rows = fault_matrix._Rows(said.append)
    rows.append(Row("SIGKILL engine", 137, 1.2, 0, 0, 40, "non-zero", "x"))
    assert said == ["row: | SIGKILL engine | 137 | 1.20 | 0 | 0 | 40 | ok | x |"]
    assert len(rows) == 1


def test_below_float32_the_servers_models_have_no_outlier_channels(tmp_path):
    from safetensors.torch import load_file

    for dtype, outliers in (("float32", True), ("bfloat16", False)):
        b = fault_matrix.Bench(tmp_path / dtype, lambda _msg: None, health_timeout=1,
                               dtype=dtype)
        w = load_file(str(b.model("bitnet-arch") / "model.safetensors"))
        big = max(float(t.max()) for n, t in w.items() if n.endswith("layernorm.weight"))
        assert (big >= 20) is outliers, (dtype, big)


def test_groups_each_kill_apart_from_the_served_server():
    assert fault_matrix.groups() == [("streams", "flood", "sigterm"), ("engine",), ("worker",),
                                     ("server",)]
    assert fault_matrix.groups(("server", "sigterm", "engine")) == [("sigterm",), ("engine",),
                                                                     ("server",)]


CHILD = """\
import json, sys
args = sys.argv[1:]
only = args[args.index("--only") + 1]
print(f"fault-matrix: row for {only}; {args[-1]}", file=sys.stderr, flush=True)
if only == "worker":
    sys.exit(3)  # a matrix process that dies without its rows
if only == "server":
    print("not the rows")  # exits 0, but gives no rows: must not pass
    sys.exit(0)
if only == "streams":
    import time
    time.sleep(60)  # hangs: stopped at the matrix's time limit
print(json.dumps([{"fault": f, "exit_code": 137, "seconds_to_exit": 0.5, "processes_left": 0,
                   "valid_lost": 0, "requests": 9, "expect_exit": "non-zero", "detail": "d",
                   "ok": True} for f in only.split(",")]))
"""


def test_parallel_runs_each_group_in_its_own_process_and_merges_the_rows(tmp_path, monkeypatch):
    """parallel(): one process a group (here a stand-in for `python -m ternary fault-matrix`,
    which the matrix starts with sys.executable), its stderr relayed with the group's name,
    its JSON rows merged in group order; one that exits without rows is a failing row. On a
    GPU every server gets its share of the memory and a fixed KV cache."""
    import sys

    import torch

    from ternary.tools.smoke import PARALLEL_KV_CACHE_BYTES

    child = tmp_path / "child.py"
    child.write_text(CHILD)
    (tmp_path / "py").write_text(f"#!/bin/sh\nshift 3\nexec {sys.executable} {child} \"$@\"\n")
    (tmp_path / "py").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "py"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    said = []
    rows = fault_matrix.parallel(tmp_path, said.append, 60, ("engine", "worker", "flood"),
                                 "bfloat16", ("--distributed-executor-backend", "mp"))
    assert [r.fault for r in rows] == ["flood", "engine", "worker: the matrix process"]
    assert [r.ok for r in rows] == [True, True, False]
    assert "exited 3 without its rows" in rows[2].detail
    share = (f"--server-args=--distributed-executor-backend mp --gpu-memory-utilization 0.30 "
             f"--kv-cache-memory-bytes {PARALLEL_KV_CACHE_BYTES}")
    assert sorted(said) == sorted(f"[{g}] row for {g}; {share}" for g in ("flood", "engine", "worker"))
    # no rows with exit 0, and a group that hangs past the time limit: both fail
    rows = fault_matrix.parallel(tmp_path, said.append, 60, ("server", "streams"), "bfloat16",
                                 (), timeout_s=5)
    assert [(r.fault, r.ok) for r in rows] == [("streams: the matrix process", False),
                                               ("server: the matrix process", False)]
    assert "ran past the matrix's time limit" in rows[0].detail
    assert "exited 0 without its rows" in rows[1].detail
