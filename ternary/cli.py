"""The `ternary` command. Each subcommand lives in ternary/commands/<name>.py with
`add_arguments(parser)` and `run(args) -> int`, imported only when used (startup stays fast
and a command's heavy imports never break another)."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module under ternary.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-info": ("build_info", "what the installed ternary._C was built with"),
    "targets": ("targets", "the target matrix of envs/targets.toml"),
    "bench": ("bench", "time the gemm kernels against cuBLAS bf16 and gemlite (GPU)"),
    "make-tiny": ("make_tiny", "write a tiny deterministic ternary model (Llama or BitNetForCausalLM)"),
    "validate": ("validate", "compare vLLM with a transformers reference on a model"),
    "serve": ("serve", "vLLM's OpenAI server with the ternary method registered first"),
    "bench-serve": ("bench_serve", "serving tokens/s, TTFT, weight memory: ternary vs bf16 in vLLM"),
    "doctor": ("doctor", "check driver, torch, toolchain, GPU archs, vLLM plugin; a fix each"),
    "convert": ("convert", "a bitnet, vendor-int8 or dense checkpoint to the canonical ternary format"),
    "inspect": ("inspect", "a checkpoint's format, modules, packing, scales and every problem found"),
    "smoke": ("smoke", "real vLLM servers on make-tiny models: requests against transformers, clean stop"),
    "tp-kernels": ("tp_kernels", "the fused kernel between NCCL all-reduces on N GPUs, without vLLM"),
    "fault-matrix": ("fault_matrix", "real servers under injected faults: exit codes, leftovers, lost requests"),
    "kernel-soak": ("kernel_soak", "linear_fused launched over and over on every GPU, hangs named"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ternary", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if name == chosen:  # only the command being run imports its module
            mod = importlib.import_module(f"ternary.commands.{module}")
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
