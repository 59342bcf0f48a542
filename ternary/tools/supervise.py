"""A process tree that cannot outlive its supervisor or hide a death: what `ternary serve`,
smoke's Server and bench-serve's workers run vLLM under.

    code = supervise.Supervisor(cmd, label="ternary serve").run()

The supervisor (Linux):
- becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so a process whose parent dies
  (vLLM's engine core after the API server, a resource tracker) is reparented to it, where
  it is reaped and killed instead of orphaned;
- starts the command in a new session (its own process group) with PR_SET_PDEATHSIG(SIGKILL)
  set before exec (`guarded_popen`: smoke and bench-serve start their servers the same way),
  and marks the tree (TERNARY_SUPERVISED=1 and tree_hook/ first on
  PYTHONPATH): every Python process of the tree, however vLLM starts it (multiprocessing
  spawn and fork included), arms PR_SET_PDEATHSIG(SIGKILL) itself at interpreter start
  (`guard_process`), so SIGKILL of the supervisor takes the whole tree down;
- watches the tree every WATCH_S: the child's own exit, and every descendant that
  disappears while the child lives. How it died comes from waitpid (the child, orphans
  reparented here), from /proc/<pid>/stat while it is a zombie, or from the file where the
  tree's Python processes record each child they reap (TERNARY_SUPERVISED_DEATHS). A
  descendant that dies by a signal or a non-zero exit, or a vLLM process (VLLM::*, a
  multiprocessing child; not a fork that inherited its name) that disappears at all, and
  that did not die because its parent had (an orphan reparented here, killed by the
  parent-death signal), stops the server, in preference to the server's own exit seen in
  the same scan: one line `<label>: <name> (pid N) died: <how>; stopping the server`,
  SIGTERM to the tree, DEATH_GRACE_S, SIGKILL to every process left and the process group;
  exit status 128+signal or the exit code (1 when it was 0);
- SIGTERM/SIGINT to the supervisor: the draining marker (TERNARY_SUPERVISED_DRAINING: new
  requests get 503, ternary.vllm.drain), DRAIN_NOTICE_S later SIGTERM to the child only
  (vLLM drains the requests in flight and stops its own processes), at most DRAIN_S, then
  SIGTERM/SIGKILL to what is left; exit 0 only when the child exited 0 and nothing of the
  tree was left to kill.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ternary import settings
from ternary.tools.engine import alive, descendants

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MARK = "TERNARY_SUPERVISED"
PARENT = "TERNARY_SUPERVISED_PARENT"
DEATHS = "TERNARY_SUPERVISED_DEATHS"
DRAINING = "TERNARY_SUPERVISED_DRAINING"
DRAIN_NOTICE_S = 0.5  # between the draining marker and SIGTERM: requests past it reach vLLM
HOOK_DIR = Path(__file__).resolve().parent / "tree_hook"
WATCH_S = 0.1
STOP_GRACE_S = 3.0
DEATH_GRACE_S = 1.0
RECORD_WAIT_S = 0.5  # for a reaped process's status to reach the record file
DRAIN_S = 60.0
# processes whose disappearance while the server lives is a failure, whatever their status
VITAL = ("VLLM", "EngineCore", "multiprocessing.spawn", "multiprocessing.resource_tracker",
         "multiprocessing.forkserver")


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def arm_parent_death(expected_parent: int | None) -> None:
    """PR_SET_PDEATHSIG(SIGKILL) for this process; if the parent it was started by is
    already gone (it died before the prctl: the race the check closes), die now."""
    if not _prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), signal.SIGKILL)


def guard_process() -> None:
    """Run at interpreter start (tree_hook/sitecustomize.py) in every Python process of a
    supervised tree: die with the parent, and pass the same guarantee to children, spawned
    (their hook reads PARENT) or forked (os.register_at_fork)."""
    if not settings.flag(MARK):
        return
    parent = settings.raw(PARENT)
    arm_parent_death(int(parent) if parent.isdigit() else None)
    os.environ[PARENT] = str(os.getpid())  # what this process's children check
    _record_reaps(settings.raw(DEATHS))
    before: list[int] = []
    os.register_at_fork(before=lambda: before.append(os.getpid()),
                        after_in_parent=lambda: before and before.pop(),
                        after_in_child=lambda: _after_fork(before.pop() if before else None))


def _record_reaps(path: str) -> None:
    """os.waitpid that also appends `pid status` of each child it reaps to `path`: how a
    process died, which the supervisor cannot read once its own parent (vLLM) reaped it.
    Installed before multiprocessing and subprocess are imported (they bind os.waitpid)."""
    if not path or getattr(os.waitpid, "_ternary", False):
        return
    real = os.waitpid

    def waitpid(pid, options):
        got, status = real(pid, options)
        if got > 0:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, f"{got} {status}\n".encode())
                finally:
                    os.close(fd)
            except OSError:
                pass
        return got, status

    waitpid._ternary = True
    os.waitpid = waitpid


def _after_fork(parent: int | None) -> None:
    os.environ[PARENT] = str(os.getpid())
    arm_parent_death(parent)  # PR_SET_PDEATHSIG is cleared across fork


def supervised_env(env: dict[str, str] | None = None, deaths: str = "") -> dict[str, str]:
    """`env` (os.environ by default) marked as a supervised tree whose top process's
    parent is this process; its processes record the children they reap in `deaths`."""
    env = dict(os.environ if env is None else env)
    env[DEATHS] = deaths
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(HOOK_DIR) + (os.pathsep + path if path else "")
    env[MARK] = "1"
    env[PARENT] = str(os.getpid())
    return env


def guarded_popen(cmd: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """`cmd` in a new session whose every Python process dies with its parent, down to the
    caller: a harness killed with SIGKILL (smoke, bench-serve) takes its servers with it."""
    me = os.getpid()
    return subprocess.Popen(cmd, env=supervised_env(env), start_new_session=True,
                            preexec_fn=lambda: arm_parent_death(me), **kw)


def proc_name(pid: int) -> str:
    """vLLM's name for the process (comm, e.g. VLLM::EngineCore) or its command line."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return "?"
    if cmd.startswith(comm) and cmd.startswith("VLLM"):  # its full title (setproctitle)
        return cmd.split()[0]
    if comm.startswith("VLLM") or not cmd:
        return comm
    return f"{comm} ({cmd[:80]})" if comm not in cmd else cmd[:100]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def zombie_status(pid: int) -> tuple[int, int] | None:
    """(wait status, parent PID) of a zombie (fields 52 and 4 of /proc/<pid>/stat, read
    together: who holds it says whether its parent outlived it); None if it is not one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    try:
        return int(fields[49]), int(fields[1])
    except ValueError:
        return None


def reap() -> list[tuple[int, int]]:
    """(pid, wait status) of every child of this process that has exited, reaped now
    without waiting (a subreaper's orphans among them)."""
    out = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def describe(status: int | None) -> str:
    if status is None:
        return "exited (its status was reaped by its parent before it could be read)"
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return f"exit code {os.WEXITSTATUS(status)}"


def exit_code(status: int | None) -> int:
    if status is not None and os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    code = os.WEXITSTATUS(status) if status is not None else 1
    return code or 1


def failed(status: int | None) -> bool:
    return status is not None and (os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0)


def kill_tree(pids: set[int], pgid: int | None, grace: float = STOP_GRACE_S,
              reap=None) -> set[int]:
    """SIGTERM to `pids` (and the process group), `grace` seconds, SIGKILL to what is left;
    the PIDs that were running when called. `reap()` is called while waiting (a
    subreaper's zombies)."""
    def signal_all(sig):
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if pgid is not None:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    running = {p for p in pids if alive(p)}
    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        if reap:
            reap()
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    if left:
        pids = left
        signal_all(signal.SIGKILL)
        end = time.monotonic() + 5
        while {p for p in left if alive(p)} and time.monotonic() < end:
            if reap:
                reap()
            time.sleep(0.05)
    if reap:
        reap()
    return running


@dataclass
class Death:
    pid: int
    name: str
    status: int | None
    ppid: int = 0

    def line(self, label: str) -> str:
        return (f"{label}: {self.name} (pid {self.pid}) died: {describe(self.status)}; "
                "stopping the server")


class Supervisor:
    """Runs `cmd` as a supervised tree (see the module docstring)."""

    def __init__(self, cmd: list[str], label: str = "ternary serve",
                 env: dict[str, str] | None = None, drain_s: float = DRAIN_S,
                 stdout=None, stderr=None, say=None):
        self.cmd, self.label, self.drain_s = cmd, label, drain_s
        fd, self.deaths_path = tempfile.mkstemp(prefix="ternary-supervise-", suffix=".reaped")
        os.close(fd)
        self.deaths_offset = 0
        self.env = supervised_env(env, self.deaths_path)
        self.draining_path = self.deaths_path[:-len(".reaped")] + ".draining"
        self.env[DRAINING] = self.draining_path
        self.stdout, self.stderr = stdout, stderr
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.proc: subprocess.Popen | None = None
        self.stopping: str | None = None  # the signal that asked us to stop
        self.forward_at: float | None = None  # when to pass SIGTERM on
        self.known: dict[int, str] = {}  # pid -> name, the tree as last seen
        self.parents: dict[int, int] = {}  # pid -> its parent when last seen alive
        self.reaped: dict[int, int] = {}  # pid -> wait status (reaped here or in the tree)
        self.zombies: dict[int, int] = {}  # pid -> wait status read from /proc
        # descendants whose status this process collected (reaped, or a zombie it holds):
        # they died reparented here, after their own parent had exited
        self.orphans: set[int] = set()
        self.names_of_dead: dict[int, str] = {}
        self.dead: set[int] = set()  # descendants already seen gone (or zombies)

    # -- the tree ----------------------------------------------------------------------
    def _reap(self) -> None:
        for pid, status in reap():
            if self.proc is not None and pid == self.proc.pid:
                self.proc.returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                                        else os.WEXITSTATUS(status))
            else:
                self.orphans.add(pid)
            self.reaped[pid] = status

    def _read_reaps(self) -> None:
        try:
            with open(self.deaths_path, "rb") as f:
                f.seek(self.deaths_offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.deaths_offset += end
        for line in data[:end].decode().splitlines():
            pid, status = line.split()
            self.reaped.setdefault(int(pid), int(status))

    def _child_status(self) -> int | None:
        return self.reaped.get(self.proc.pid) if self.proc else None

    def _scan(self) -> Death | None:
        """Updates the known tree; the death that stops the server, if any: a descendant's
        that failed (a signal, a non-zero exit) or a vital process gone, and not the
        consequence of its parent's death (the parent-death signal kills the rest); else
        the server's own exit. A descendant's death comes first: vLLM's server exits 0
        right after its engine died, and both can be seen in one scan."""
        me = os.getpid()
        self._read_reaps()
        current = descendants(me)
        for pid in current:
            st = zombie_status(pid)
            if pid in self.dead and st is not None:
                continue
            if st is None and pid not in self.known:
                # first seen alive: what is held for its PID (a status read before this
                # listing, a death) was an earlier process's; PIDs are reused (pid_max is
                # often 32768), and a helper reaped unseen left its status in the record
                self.dead.discard(pid)
                self.reaped.pop(pid, None)
                self.zombies.pop(pid, None)
                self.orphans.discard(pid)
            if st is not None:
                self.zombies[pid] = st[0]
                if st[1] == me and pid != self.proc.pid:
                    self.orphans.add(pid)
            else:  # re-read: a process names itself after it starts (VLLM::EngineCore)
                name, ppid = proc_name(pid), _ppid(pid)
                if name != "?":  # "?": it died while being read; keep what was seen
                    self.known[pid] = name
                if ppid:
                    self.parents[pid] = ppid
                self.known.setdefault(pid, name)
        gone = [pid for pid in self.known
                if pid not in current or pid in self.zombies or pid in self.reaped]
        self._await_records([pid for pid in gone if pid != self.proc.pid])
        deaths = []
        for pid in gone:
            if pid == self.proc.pid and self._child_status() is None:
                continue
            status = self.reaped.get(pid, self.zombies.get(pid))
            name = self.known.pop(pid)
            self.names_of_dead[pid] = name
            deaths.append(Death(pid, name, status, self.parents.get(pid, 0)))
            self.dead.add(pid)
        server = None
        for d in deaths:
            if d.pid == self.proc.pid:
                server = d
            elif not self._consequence(d) and (
                    failed(d.status) or (d.status is None and self._vital(d))):
                return d
        return server

    def _consequence(self, d: Death) -> bool:
        """Whether `d` died because its parent did (the parent-death signal): it died an
        orphan, reparented here from a parent in the tree. A status its parent recorded,
        or a zombie its parent holds, says the parent outlived it, even when the parent's
        own end is seen in the same scan."""
        if d.ppid in (0, os.getpid()):
            return False
        if d.status is None:  # whoever reaped it did not say: go by what was seen
            return d.ppid in self.dead
        return d.pid in self.orphans

    def _await_records(self, pids: list[int]) -> None:
        """A process its parent reaped between our read of the record file and our listing
        of the tree has vanished with its status not yet written (the hook writes right after
        waitpid returns): give the record RECORD_WAIT_S to arrive before calling it unknown."""
        deadline = time.monotonic() + RECORD_WAIT_S
        while any(p not in self.reaped and p not in self.zombies for p in pids):
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)
            self._read_reaps()

    def _vital(self, d: Death) -> bool:
        """A process vLLM started as one of its own (VLLM::EngineCore, VLLM::Worker, a
        multiprocessing child); not a fork of one (a helper that inherited its name)."""
        parent = self.known.get(d.ppid) or self.names_of_dead.get(d.ppid)
        return any(v in d.name for v in VITAL) and d.name != parent

    def _tree(self, settle: float = 0.0) -> set[int]:
        """The supervisor's descendants, after waiting up to `settle` seconds for them to
        exit on their own (a resource tracker finishing its clean-up)."""
        deadline = time.monotonic() + settle
        while True:
            self._reap()
            tree = descendants(os.getpid())
            if not tree or time.monotonic() >= deadline:
                return {p for p in tree if alive(p)}
            time.sleep(0.05)

    # -- signals -----------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        if self.stopping is None:
            self.stopping = signal.Signals(signum).name
            Path(self.draining_path).touch()  # new requests: 503 (ternary.vllm.drain)
            self.forward_at = time.monotonic() + DRAIN_NOTICE_S

    def _forward(self) -> None:
        """SIGTERM to the server, DRAIN_NOTICE_S after the draining marker."""
        if self.forward_at is not None and time.monotonic() >= self.forward_at:
            self.forward_at = None
            if self.proc is not None and self.proc.returncode is None:
                try:
                    os.kill(self.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def run(self) -> int:
        """Starts the tree and supervises it until it ends; the exit status to report."""
        sub = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if not sub:
            self.say(f"{self.label}: warning: not a child subreaper here (not Linux?): "
                     "orphaned processes cannot be collected")
        me = os.getpid()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.proc = subprocess.Popen(
                self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=self.stdout,
                stderr=self.stderr, start_new_session=True,
                preexec_fn=lambda: arm_parent_death(me))
            return self._watch()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            Path(self.deaths_path).unlink(missing_ok=True)
            Path(self.draining_path).unlink(missing_ok=True)

    def _watch(self) -> int:
        pgid = self.proc.pid
        drain_deadline = None
        while True:
            self._reap()
            death = self._scan()
            child = self._child_status()
            if self.stopping is not None:
                self._forward()
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + self.drain_s
                    self.say(f"{self.label}: {self.stopping}: stopping the server (at most "
                             f"{self.drain_s:.0f} s for requests in flight)")
                if child is not None or time.monotonic() > drain_deadline:
                    left = kill_tree(self._tree(settle=2.0), pgid, grace=STOP_GRACE_S,
                                     reap=self._reap)
                    child = self._child_status()
                    if child is None:
                        self.say(f"{self.label}: the server did not stop within "
                                 f"{self.drain_s:.0f} s of {self.stopping}; killed")
                        return 1
                    if left:
                        self.say(f"{self.label}: {len(left)} process(es) of the server were "
                                 f"still running after it exited; killed: PIDs {sorted(left)}")
                    if failed(child):
                        self.say(f"{self.label}: the server exited with {describe(child)} "
                                 f"after {self.stopping}")
                        return exit_code(child)
                    return 1 if left else 0
            elif death is not None or child is not None:
                if death is None or death.pid == self.proc.pid:  # the server itself ended
                    death = Death(self.proc.pid, "the server process", child)
                    if not failed(child):
                        left = kill_tree(self._tree(settle=2.0), pgid, reap=self._reap)
                        if not left:
                            return 0
                        self.say(f"{self.label}: the server exited 0 but left "
                                 f"{len(left)} process(es) running; killed: PIDs "
                                 f"{sorted(left)}")
                        return 1
                self.say(death.line(self.label))
                # the tree is broken already: a short grace keeps the exit within seconds
                kill_tree(self._tree(), pgid, grace=DEATH_GRACE_S, reap=self._reap)
                return exit_code(death.status)
            time.sleep(WATCH_S)
