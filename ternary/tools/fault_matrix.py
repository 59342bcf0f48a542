"""The fault matrix: real `ternary serve` servers on make-tiny models, each fault injected
for real, and what the server did about it.

    ternary fault-matrix [--short] [--json] [--load [--soak-s 600]]

Faults: SIGKILL of vLLM's engine core, of its worker, of the server (the supervisor) itself;
SIGTERM under load; 200 streams opened and dropped; a flood of requests past
--max-num-seqs. Each row: fault, exit code, seconds from the fault to the exit, processes
left (this process is a child subreaper, so every orphan of the server's tree comes here and
is counted), valid requests lost. A row fails on a leftover, a loss, a slow or wrong exit.

"Lost": an answer that differs from the server's own sequential baseline for that prompt,
always; and, where the fault is not a kill (SIGTERM, dropped streams, a flood), a request
started before the fault that got neither an answer nor a 503. Requests in flight when the
engine is killed cannot be answered; they count only if answered wrongly.

--parallel: each group of faults (the one served server's streams, flood and SIGTERM; each
SIGKILL) on its own server at the same time, in its own process (on the H200 a server takes
100-120 s to start, so the full matrix takes about one start instead of four).

--short: one server, three faults (dropped streams, flood, SIGKILL of the engine), a few
minutes on 2 cores (.ci/run). --load: instead, issue 37's 10x load on each make-tiny model
(ternary and bitnet: Llama; bitnet-arch: BitNetForCausalLM): 2,000 requests from 128
clients, a fifth malformed (each must be a 4xx), answers equal to the sequential baseline,
p50/p99 latency, and the server tree's memory (PSS) over a soak.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from ternary.tools import supervise
from ternary.tools.engine import alive, cpu_env_defaults, descendants, free_port
from ternary.tools.smoke import TINY_MODELS, Server, server_command, tiny_model

HEALTH_TIMEOUT_S = 600
EXIT_WITHIN_S = 5.0
REQUEST_TIMEOUT_S = 120
MAX_TOKENS = 8
MAX_NUM_SEQS = 8
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron "
         "pi rho sigma tau upsilon phi chi psi omega").split()


def prompts(n: int) -> list[str]:
    """`n` distinct prompts."""
    return [f"{WORDS[i % len(WORDS)]} {WORDS[(i * 7 + 3) % len(WORDS)]} number {i}"
            for i in range(n)]


def body(prompt: str, **kw) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, **kw}


@dataclasses.dataclass
class Row:
    fault: str
    exit_code: int | None
    seconds_to_exit: float | None
    processes_left: int
    valid_lost: int
    requests: int
    expect_exit: str  # "0", "non-zero", "killed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        if self.expect_exit == "alive":  # a fault the server must survive
            return self.valid_lost == 0 and self.processes_left == 0
        code_ok = {"0": self.exit_code == 0,
                   "non-zero": self.exit_code not in (None, 0),
                   "killed": self.exit_code == -signal.SIGKILL,
                   "alive": True}[self.expect_exit]
        fast = self.expect_exit != "non-zero" or (
            self.seconds_to_exit is not None and self.seconds_to_exit <= EXIT_WITHIN_S)
        return code_ok and fast and self.processes_left == 0 and self.valid_lost == 0


# -- requests ---------------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    prompt: str | None
    start: float
    end: float
    status: int | None  # None: no HTTP answer (connection refused or reset)
    text: str | None = None
    malformed: bool = False


def complete(base: str, prompt: str, session=None) -> Result:
    import requests

    t = time.monotonic()
    try:
        r = (session or requests).post(f"{base}/v1/completions", json=body(prompt),
                                       timeout=REQUEST_TIMEOUT_S)
    except requests.RequestException:
        return Result(prompt, t, time.monotonic(), None)
    text = None
    if r.status_code == 200:
        text = r.json()["choices"][0]["text"]
    return Result(prompt, t, time.monotonic(), r.status_code, text)


MALFORMED = (
    ("no prompt", lambda: {"model": "tiny", "max_tokens": 4}),
    ("negative max_tokens", lambda: body("x", max_tokens=-1)),
    ("unknown model", lambda: {**body("x"), "model": "no-such-model"}),
    ("temperature not a number", lambda: body("x", temperature="hot")),
    ("prompt longer than max-model-len", lambda: body("word " * 2000)),
    ("not JSON", None),
)


def malformed(base: str, i: int, session=None) -> Result:
    import requests

    name, make = MALFORMED[i % len(MALFORMED)]
    t = time.monotonic()
    try:
        if make is None:
            r = (session or requests).post(f"{base}/v1/completions", data=b"{not json",
                                           headers={"Content-Type": "application/json"},
                                           timeout=REQUEST_TIMEOUT_S)
        else:
            r = (session or requests).post(f"{base}/v1/completions", json=make(),
                                           timeout=REQUEST_TIMEOUT_S)
        status = r.status_code
    except requests.RequestException:
        status = None
    return Result(name, t, time.monotonic(), status, malformed=True)


def baseline(base: str, ps: list[str]) -> dict[str, str]:
    """Each prompt's answer, asked one at a time."""
    out = {}
    for p in ps:
        r = complete(base, p)
        if r.status != 200:
            raise RuntimeError(f"baseline request {p!r} answered {r.status}")
        out[p] = r.text
    return out


class Load:
    """`clients` threads sending the baseline's prompts in turn until stopped."""

    def __init__(self, base: str, ref: dict[str, str], clients: int):
        self.base, self.ref = base, ref
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        ps = list(ref)
        self.threads = [threading.Thread(target=self._client, args=(ps[i % len(ps):] + ps,),
                                         daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, ps: list[str]) -> None:
        import requests

        s = requests.Session()
        i = 0
        while not self._stop.is_set():
            r = complete(self.base, ps[i % len(ps)], s)
            with self._lock:
                self.results.append(r)
            i += 1
            if r.status in (None, 503):
                time.sleep(0.05)  # the server is gone or going: do not spin

    def stop(self, timeout: float = REQUEST_TIMEOUT_S) -> list[Result]:
        self._stop.set()
        for t in self.threads:
            t.join(timeout)
        return self.results


def wrong(results: list[Result], ref: dict[str, str]) -> list[Result]:
    return [r for r in results if r.status == 200 and r.text != ref.get(r.prompt)]


# -- the server's tree ------------------------------------------------------------------

# vLLM's log prefix for each process it starts, "(EngineCore pid=N)": where setproctitle is
# missing (it is optional to vLLM) the processes keep python's name and only the log says
# which is which
LOG_TAGS = {"VLLM::EngineCor": "EngineCore", "VLLM::Worker": "Worker"}


def find(server: Server, token: str) -> int | None:
    """The PID of the vLLM process named `token` (VLLM::EngineCore's comm is cut to 15
    characters), not a fork that inherited the name; else the one the server's log tags
    with LOG_TAGS[token], if it is in the server's tree."""
    tree = descendants(server.proc.pid)
    names = {p: supervise.proc_name(p) for p in tree}
    for p in sorted(tree):
        ppid = supervise._ppid(p)
        if names[p].startswith(token) and names.get(ppid) != names[p]:
            return p
    tag = LOG_TAGS.get(token)
    if tag is None:
        return None
    log = server.log_path.read_text(errors="replace")
    for m in re.finditer(rf"\({re.escape(tag)}[\w]* pid=(\d+)\)", log):
        if int(m.group(1)) in tree:
            return int(m.group(1))
    return None


def wait_exit(server: Server, t0: float, timeout: float = 60) -> tuple[int | None, float | None]:
    try:
        code = server.proc.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 (subprocess.TimeoutExpired)
        return None, None
    return code, time.monotonic() - t0


def leftovers(before: set[int], settle: float = 3.0) -> set[int]:
    """Processes of the server's tree still running `settle` s after it exited: those seen
    in it before the fault, and any orphan reparented to this process (a subreaper)."""
    deadline = time.monotonic() + settle
    while True:
        supervise.reap()  # the orphans reparented here
        left = {p for p in before | descendants(os.getpid()) if alive(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _kill(pids: set[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tree_pss_kib(root: int) -> int:
    """The proportional set size of `root` and its descendants (shared pages counted once)."""
    total = 0
    for p in descendants(root) | {root}:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


# -- the faults -------------------------------------------------------------------------

class Bench:
    def __init__(self, work: Path, say, health_timeout: float, n_prompts: int = 16,
                 dtype: str = "float32", server_args: tuple[str, ...] = ()):
        self.work, self.say, self.health_timeout = work, say, health_timeout
        self.dtype, self.server_args = dtype, server_args
        self.n_prompts = n_prompts
        self.models: dict[str, Path] = {}
        self.refs: dict[str, dict[str, str]] = {}

    def model(self, fmt: str) -> Path:
        """make-tiny's model `fmt`, a key of smoke's TINY_MODELS (bitnet-arch:
        BitNetForCausalLM), written once."""
        from ternary.tools.synthetic import tiny

        if fmt not in self.models:
            self.say(f"writing the tiny {fmt} model")
            # below float32 without outlier channels, whose int8 rounding is chaotic there
            # (smoke.tiny_model): a batch-dependent token would count as a lost request
            self.models[fmt] = tiny.make(self.work / f"tiny-{fmt}", **tiny_model(fmt, self.dtype))
        return self.models[fmt]

    def start(self, tag: str, fmt: str = "ternary", max_num_seqs: int | None = MAX_NUM_SEQS
              ) -> Server:
        port = free_port()
        cmd = server_command(self.model(fmt), "ternary", port, self.dtype) + [
            *(["--max-num-seqs", str(max_num_seqs)] if max_num_seqs else []), "--enforce-eager",
            *self.server_args]
        server = Server(cmd, port, self.work / f"server-{tag}.log")
        self.say(f"[{tag}] started ternary serve (PID {server.proc.pid}); waiting for /health")
        t = time.monotonic()
        server.wait_healthy(self.health_timeout)
        self.say(f"[{tag}] healthy after {time.monotonic() - t:.0f} s")
        if fmt not in self.refs:
            self.refs[fmt] = baseline(server.base, prompts(self.n_prompts))
        return server

    def kill(self, tag: str, victim: str, server: Server | None = None) -> Row:
        """SIGKILL of the engine core, the worker or the server, under load from 8 clients
        (on `server`, or a new one)."""
        server = server or self.start(tag)
        ref = self.refs["ternary"]
        load = Load(server.base, ref, 8)
        time.sleep(2)
        pid = server.proc.pid if victim == "server" else find(server, victim)
        before = descendants(server.proc.pid) | {server.proc.pid}
        if pid is None:
            load.stop()
            server.stop(30)
            return Row(tag, None, None, 0, 0, 0, "non-zero", f"no {victim} process found")
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        code, took = wait_exit(server, t0)
        results = load.stop()
        left = leftovers(before)
        _kill(left)
        server.log.close()
        log = server.log_path.read_text(errors="replace")
        line = [ln for ln in log.splitlines() if "died:" in ln]
        detail = line[0] if line else "no 'died:' line in the server log"
        if victim == "server":  # nothing can print: what is checked is that nothing is left
            detail = "the supervisor SIGKILLed; its tree went with it (parent-death signal)"
        expect = "killed" if victim == "server" else "non-zero"
        if victim != "server" and not line:
            code = None  # not what the supervisor must say
        return Row(tag, code, took, len(left), len(wrong(results, ref)), len(results), expect,
                   detail[:160])

    def sigterm_under_load(self, server: Server) -> Row:
        ref = self.refs["ternary"]
        load = Load(server.base, ref, 16)
        time.sleep(3)
        before = descendants(server.proc.pid) | {server.proc.pid}
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code, took = wait_exit(server, t0, timeout=120)
        results = load.stop()
        left = leftovers(before)
        _kill(left)
        server.log.close()
        # in flight at the signal: answered (exactly) or 503; sent after it: 503 or refused
        inflight = [r for r in results if r.start < t0]
        later = [r for r in results if r.start >= t0]
        lost = ([r for r in inflight if r.status not in (200, 503)]
                + [r for r in later if r.status not in (None, 200, 503)] + wrong(results, ref))
        answered = sum(r.status == 200 for r in inflight)
        return Row("SIGTERM under load (16 clients)", code, took, len(left), len(lost),
                   len(results), "0", f"{answered}/{len(inflight)} sent before it answered, "
                   f"{sum(r.status == 503 for r in inflight)} 503; after it: "
                   f"{sum(r.status == 503 for r in later)} 503, "
                   f"{sum(r.status is None for r in later)} refused, "
                   f"{sum(r.status not in (None, 200, 503) for r in later)} other")

    def drop_streams(self, server: Server, n: int = 200) -> Row:
        """`n` streaming requests opened, their first bytes read, the sockets closed; then
        the server must still answer every prompt exactly."""
        ref = self.refs["ternary"]
        payload = json.dumps(body(prompts(1)[0], stream=True, max_tokens=64)).encode()
        req = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
        socks, opened = [], 0
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            s.sendall(req)
            socks.append(s)
            opened += 1
        first = 0
        for s in socks[:20]:  # some have started streaming
            try:
                first += bool(s.recv(256))
            except OSError:
                pass
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # RST: the client is gone
        time.sleep(2)
        after = [complete(server.base, p) for p in ref]
        lost = [r for r in after if r.status != 200] + wrong(after, ref)
        alive_ok = server.proc.poll() is None
        return Row(f"{n} streams opened and dropped", None, None, 0,
                   len(lost) + (0 if alive_ok else 1), opened + len(after), "alive",
                   f"{first}/20 streams had started; then {len(after) - len(lost)}/{len(after)} "
                   f"prompts answered exactly; server {'alive' if alive_ok else 'DEAD'}")

    def flood(self, server: Server, n: int = 96) -> Row:
        """`n` concurrent requests against --max-num-seqs 8: every one answered exactly."""
        ref = self.refs["ternary"]
        ps = list(ref)
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            results = list(pool.map(lambda i: complete(server.base, ps[i % len(ps)]), range(n)))
        lost = [r for r in results if r.status != 200] + wrong(results, ref)
        lat = sorted(r.end - r.start for r in results)
        return Row(f"flood: {n} at once, max_num_seqs {MAX_NUM_SEQS}", None, None, 0, len(lost),
                   n, "alive", f"{n - len(lost)}/{n} exact; latency p50 "
                   f"{statistics.median(lat):.2f} s, max {lat[-1]:.2f} s")


def _row_ok(row: Row) -> bool:
    return row.ok


KILLS = {"engine": ("SIGKILL engine core (8 clients)", "VLLM::EngineCor"),
         "worker": ("SIGKILL worker (8 clients)", "VLLM::Worker"),
         "server": ("SIGKILL server (8 clients)", "server")}
FAULTS = ("streams", "flood", "sigterm", *KILLS)


class _Rows(list):
    """The matrix's rows, each said (as its table line) when it is added: a run cut short
    by a time limit still shows the faults it finished."""

    def __init__(self, say):
        super().__init__()
        self.say = say

    def append(self, row: Row) -> None:
        super().append(row)
        self.say("row: " + table([row]).splitlines()[-1])


def matrix(work: Path, short: bool, say, health_timeout: float = HEALTH_TIMEOUT_S,
           only: tuple[str, ...] = (), dtype: str = "float32",
           server_args: tuple[str, ...] = ()) -> list[Row]:
    b = Bench(work, say, health_timeout, dtype=dtype, server_args=server_args)
    rows = _Rows(say)
    if short:
        server = b.start("short")
        rows.append(b.drop_streams(server, 200))
        rows.append(b.flood(server))
        rows.append(b.kill(*KILLS["engine"], server=server))
        return rows
    only = set(only or FAULTS)
    if only & {"streams", "flood", "sigterm"}:
        server = b.start("serve")
        if "streams" in only:
            rows.append(b.drop_streams(server, 200))
        if "flood" in only:
            rows.append(b.flood(server))
        rows.append(b.sigterm_under_load(server))  # it also stops this server
    for key, (tag, victim) in KILLS.items():
        if key in only:
            rows.append(b.kill(tag, victim))
    return rows


def groups(only: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The matrix's independent parts, each on a server of its own: the faults one server
    takes in turn (streams, flood, then SIGTERM, which stops it), and each SIGKILL."""
    only = set(only or FAULTS)
    served = tuple(f for f in ("streams", "flood", "sigterm") if f in only)
    return ([served] if served else []) + [(k,) for k in KILLS if k in only]


def parallel(work: Path, say, health_timeout: float, only: tuple[str, ...], dtype: str,
             server_args: tuple[str, ...], timeout_s: float | None = None) -> list[Row]:
    """Every group of `groups(only)` at once, each in a `ternary fault-matrix --only GROUP
    --json` process of its own: each is its own subreaper, so one fault's orphans (counted
    as its leftovers) and the children it reaps are never another's. On a GPU each server
    gets 0.9 / N of the memory and a fixed KV cache, as smoke --parallel does (vLLM's
    profiling of free memory fails when a neighbour frees memory meanwhile). A group that
    gives no rows, exits abnormally or runs past `timeout_s` (default: the health timeout
    plus 10 minutes) is a failing row; a stopped one takes its servers with it (their
    parent-death signal)."""
    import shlex
    import subprocess

    from ternary.tools.smoke import parallel_server_args

    todo = groups(only)
    share = parallel_server_args(len(todo))
    me = os.getpid()
    deadline = time.monotonic() + (health_timeout + 600 if timeout_s is None else timeout_s)
    started = []
    for g in todo:
        name = "-".join(g)
        (work / name).mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", "ternary",
               "fault-matrix", "--only", ",".join(g), "--json", "--work", str(work / name),
               "--dtype", dtype, "--health-timeout", str(health_timeout),
               f"--server-args={shlex.join([*server_args, *share])}"]
        out = open(work / name / "rows.json", "w+")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: supervise.arm_parent_death(me))
        started.append((g, name, proc, out))
    # (the relays start once every child is forked: preexec_fn runs between fork and exec)
    relays = [threading.Thread(target=_relay, args=(proc.stderr, say, name), daemon=True)
              for _, name, proc, _ in started]
    for t in relays:
        t.start()
    rows = []
    for (g, name, proc, out), relay in zip(started, relays):
        what = f"{','.join(g)}: the matrix process"
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rows.append(Row(what, None, None, 0, 1, 0, "0", "stopped: it ran past the matrix's "
                            "time limit (its servers go with it)"))
            continue
        finally:
            relay.join(10)
        out.seek(0)
        text = out.read()
        out.close()
        try:
            got = [Row(**{k: v for k, v in r.items() if k != "ok"}) for r in json.loads(text)]
        except (ValueError, TypeError, AttributeError):
            got = [Row(what, code, None, 0, 1, 0, "0", f"exited {code} without its rows; "
                       f"stdout: {text[-200:]!r}")]
        if code not in (0, 1) and got and got[0].fault != what:
            got.append(Row(what, code, None, 0, 1, 0, "0", f"exited {code} after its rows"))
        rows += got
    return rows


def _relay(stream, say, name: str) -> None:
    for line in stream:
        line = line.rstrip()
        if line:
            say(f"[{name}] {line.removeprefix('fault-matrix: ')}")


def table(rows: list[Row]) -> str:
    head = ("| fault | exit code | s to exit | processes left | valid lost | requests | ok "
            "| detail |")
    out = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.fault} | {'alive' if r.expect_exit == 'alive' else r.exit_code} | "
                   f"{'' if r.seconds_to_exit is None else f'{r.seconds_to_exit:.2f}'} | "
                   f"{r.processes_left} | {r.valid_lost} | {r.requests} | "
                   f"{'ok' if _row_ok(r) else 'FAIL'} | {r.detail} |")
    return "\n".join(out)


# -- the 10x load -----------------------------------------------------------------------

@dataclasses.dataclass
class LoadRun:
    model: str
    requests: int
    malformed: int
    clients: int
    valid_wrong: int
    valid_failed: int
    malformed_not_4xx: int
    p50_s: float
    p99_s: float
    soak_s: float
    pss_1min_kib: int
    pss_end_kib: int
    soak_requests: int

    @property
    def growth(self) -> float:
        return (self.pss_end_kib - self.pss_1min_kib) / max(1, self.pss_1min_kib)

    @property
    def ok(self) -> bool:
        return (self.valid_wrong == 0 and self.valid_failed == 0 and self.malformed_not_4xx == 0
                and abs(self.growth) <= 0.05)


def load_run(b: Bench, fmt: str, total: int, clients: int, soak_s: float) -> LoadRun:
    server = b.start(f"load-{fmt}", fmt, max_num_seqs=None)  # vLLM's default batch
    ref = b.refs[fmt]
    ps = list(ref)
    try:
        jobs = [("bad", i) if i % 5 == 4 else ("ok", i) for i in range(total)]

        def one(job, session=None):
            kind, i = job
            return (malformed(server.base, i, session) if kind == "bad"
                    else complete(server.base, ps[i % len(ps)], session))

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(one, jobs))
        b.say(f"[load-{fmt}] {total} requests in {time.monotonic() - t0:.0f} s")
        valid = [r for r in results if not r.malformed]
        lat = sorted(r.end - r.start for r in valid if r.status == 200)
        p50 = statistics.median(lat) if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        bad_4xx = [r for r in results if r.malformed and not (r.status and 400 <= r.status < 500)]
        # the soak: the same mix from `clients` clients for soak_s, memory at 1 min and the end
        load = Load(server.base, ref, min(clients, 32))
        t1 = time.monotonic()
        pss_1 = 0
        while time.monotonic() - t1 < soak_s:
            time.sleep(1)
            if not pss_1 and time.monotonic() - t1 >= min(60, soak_s / 2):
                pss_1 = tree_pss_kib(server.proc.pid)
                b.say(f"[load-{fmt}] PSS at {time.monotonic() - t1:.0f} s: {pss_1 / 1024:.0f} MiB")
        pss_end = tree_pss_kib(server.proc.pid)
        soak = load.stop()
        b.say(f"[load-{fmt}] PSS at the end ({time.monotonic() - t1:.0f} s): "
              f"{pss_end / 1024:.0f} MiB")
        wrong_all = wrong(valid, ref) + wrong(soak, ref)
        failed = [r for r in valid + soak if r.status != 200]
        return LoadRun(fmt, total, len(results) - len(valid), clients, len(wrong_all),
                       len(failed), len(bad_4xx), p50, p99, time.monotonic() - t1, pss_1,
                       pss_end, len(soak))
    finally:
        server.stop(60)


def main(short: bool, as_json: bool, load: bool = False, soak_s: float = 600,
         total: int = 2000, clients: int = 128, formats: tuple[str, ...] = tuple(TINY_MODELS),
         work: Path | None = None, health_timeout: float = HEALTH_TIMEOUT_S,
         only: tuple[str, ...] = (), dtype: str = "float32",
         server_args: tuple[str, ...] = (), in_parallel: bool = False) -> int:
    unknown = [f for f in formats if f not in TINY_MODELS]
    if load and unknown:  # before any model is written or server started
        print(f"ternary fault-matrix: error: --formats: unknown {unknown}; choose from "
              f"{list(TINY_MODELS)}", file=sys.stderr)
        return 2
    supervise._prctl(supervise.PR_SET_CHILD_SUBREAPER, 1)  # orphans come here, counted
    cpu_env_defaults()
    work = work or Path(tempfile.mkdtemp(prefix="ternary-faults-"))
    work.mkdir(parents=True, exist_ok=True)

    def say(msg):
        print(f"fault-matrix: {msg}", file=sys.stderr, flush=True)

    if load:
        b = Bench(work, say, health_timeout, n_prompts=64, dtype=dtype, server_args=server_args)
        runs = [load_run(b, f, total, clients, soak_s) for f in formats]
        if as_json:
            print(json.dumps([dict(dataclasses.asdict(r), growth=r.growth, ok=r.ok)
                              for r in runs], indent=2))
        else:
            print("| model | requests (malformed) | clients | valid wrong | valid failed | "
                  "malformed not 4xx | p50 s | p99 s | soak s (requests) | PSS 1 min MiB | "
                  "PSS end MiB | growth | ok |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in runs:
                print(f"| {r.model} | {r.requests} ({r.malformed}) | {r.clients} | "
                      f"{r.valid_wrong} | {r.valid_failed} | {r.malformed_not_4xx} | "
                      f"{r.p50_s:.2f} | {r.p99_s:.2f} | {r.soak_s:.0f} ({r.soak_requests}) | "
                      f"{r.pss_1min_kib / 1024:.0f} | {r.pss_end_kib / 1024:.0f} | "
                      f"{100 * r.growth:+.1f} % | {'ok' if r.ok else 'FAIL'} |")
        return 0 if all(r.ok for r in runs) else 1
    if in_parallel and not short and len(groups(only)) > 1:
        rows = _Rows(say)
        for row in parallel(work, say, health_timeout, only, dtype, server_args):
            rows.append(row)
    else:
        rows = matrix(work, short, say, health_timeout, only, dtype, server_args)
    if as_json:
        print(json.dumps([dict(dataclasses.asdict(r), ok=_row_ok(r)) for r in rows], indent=2))
    else:
        print(table(rows))
    ok = all(_row_ok(r) for r in rows)
    print(f"fault-matrix: {'PASSED' if ok else 'FAILED'}; server logs in {work}",
          file=sys.stderr, flush=True)
    return 0 if ok else 1
