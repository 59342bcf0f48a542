"""A stand-in for vLLM's server process tree, plain Python: this script (the "API server")
spawns an engine (comm VLLM::EngineCore), which spawns a worker (VLLM::Worker); a spawn
Lock starts multiprocessing's resource tracker. It writes every PID to argv[1] as JSON, then
waits. Like vLLM 0.32 on CPU, when the engine dies the server exits 0 argv[2] seconds later
(0.5 by default; 0: at once, so a supervisor sees both ends in one scan) and leaves the
worker running; SIGTERM stops it all and exits 0."""

import ctypes
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import time


def _name(name: str) -> None:
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def worker(q) -> None:
    _name("VLLM::Worker")
    q.put(("worker", os.getpid()))
    while True:
        time.sleep(1)


def engine(q, lock) -> None:
    _name("VLLM::EngineCore")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctx = mp.get_context("spawn")
    w = ctx.Process(target=worker, args=(q,), daemon=False)
    w.start()
    q.put(("engine", os.getpid()))
    while True:
        time.sleep(1)


def main() -> None:
    out = sys.argv[1]
    exit_after = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    ctx = mp.get_context("spawn")
    q, lock = ctx.Queue(), ctx.Lock()
    e = ctx.Process(target=engine, args=(q, lock))
    e.start()
    pids = {"server": os.getpid()}
    for _ in range(2):
        k, v = q.get(timeout=60)
        pids[k] = v
    from multiprocessing import resource_tracker

    pids["tracker"] = resource_tracker._resource_tracker._pid
    with open(out + ".tmp", "w") as f:
        json.dump(pids, f)
    os.replace(out + ".tmp", out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        # woken by the engine's end and reaping it at once, as vLLM's engine monitor does
        if mp.connection.wait([e.sentinel], timeout=0.1) and not e.is_alive():
            time.sleep(exit_after)
            os._exit(0)  # vLLM's bug: a clean exit, the worker left behind
    os.kill(pids["worker"], signal.SIGTERM)
    e.terminate()
    e.join()
    sys.exit(0)


if __name__ == "__main__":
    main()
