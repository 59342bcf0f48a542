"""`ternary validate MODEL_DIR`: vLLM against a transformers reference on the dequantized
weights (greedy tokens, per-position logits, KL; first divergent layer on failure).
With `--against-tp M`: vLLM at tensor parallel --tp against vLLM at M (ternary.tools.tp_compare)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from rich.console import Console


def add_arguments(p) -> None:
    from ternary.commands import positive_int

    p.add_argument("model_dir", type=Path, help="Hugging Face model directory (ternary or bitnet)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-tokens", type=positive_int, default=16, help="greedy tokens per prompt")
    p.add_argument("--tp", type=positive_int, default=1, metavar="N",
                   help="vLLM tensor_parallel_size (the weights are sharded by vLLM's loaders)")
    p.add_argument("--against-tp", type=positive_int, default=None, metavar="M",
                   help="compare vLLM at --tp N with vLLM at tensor parallel M instead of the "
                        "transformers reference: greedy tokens and KL(M || N) per position")
    p.add_argument("--timeout", type=_positive_seconds, default=900,
                   help="seconds for each engine of --against-tp at most")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--verbose", action="store_true", help="keep vLLM's INFO log")


def _positive_seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} s: give a positive number of seconds")
    return value


def _report_stream():
    """vLLM and its worker processes log on stdout (file descriptor 1, inherited, also at
    exit); from here on fd 1 points at stderr, and the report goes to the real stdout
    returned here, so `--json` output is JSON alone."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def _refusal(model_dir: Path) -> str | None:
    """Why validate cannot run on this directory, before vLLM starts (minutes on a CPU)."""
    config = model_dir / "config.json"
    if not config.is_file():
        return (f"{model_dir}: no config.json; pass a Hugging Face model directory (make one "
                "with `ternary make-tiny DIR`)")
    try:
        qc = json.loads(config.read_text()).get("quantization_config") or {}
    except (ValueError, AttributeError) as e:
        return f"{config}: not a JSON object ({e})"
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method in ("ternary", "bitnet"):
        return None
    if method in ("vendor-int8", "vendor_int8"):
        return (f"{model_dir} is a vendor-int8 checkpoint, which vLLM does not read: "
                "`ternary convert` it to the canonical format first")
    if method is None:
        return (f"{model_dir} has no quantization_config: a dense model has nothing ternary "
                "to validate (`ternary convert --from dense` quantizes it)")
    return f"{config}: quant_method {method!r} is not ternary or bitnet"


def _fail(args, why: str, out=None) -> int:
    print(f"ternary validate: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps({"ok": False, "error": why}), file=out or sys.stdout, flush=True)
    return 2


def run(args) -> int:
    from rich.table import Table

    from ternary.tools.engine import cpu_env_defaults

    cpu_env_defaults()
    if not args.verbose:  # vLLM logs every engine setting at INFO, on stdout
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    console = Console(stderr=True)
    why = _refusal(args.model_dir)
    if why:
        return _fail(args, why)
    if args.against_tp is not None:
        if args.against_tp == args.tp:
            return _fail(args, f"--tp {args.tp} and --against-tp {args.against_tp} are the same "
                               f"size: compare two different tensor-parallel sizes")
        from ternary.tools.engine import too_few_gpus

        why = too_few_gpus(max(args.tp, args.against_tp))
        if why:
            return _fail(args, why)
        return _run_tp_compare(args, console)
    from ternary.tools.validate import validate

    out = _report_stream()
    try:
        with console.status("validating") as status:
            report = validate(args.model_dir, args.dtype, args.max_tokens,
                              progress=lambda m: (status.update(m), console.log(m)), tp=args.tp)
    except Exception as e:  # one line, not a traceback (--verbose keeps it)
        if args.verbose:
            raise
        return _fail(args, f"{args.model_dir}: {type(e).__name__}: {e} (--verbose shows where)",
                     out)
    if args.json:
        d = dataclasses.asdict(report)
        d["ok"] = report.ok
        print(json.dumps(d, indent=2), file=out, flush=True)
        return 0 if report.ok else 1
    t = Table(title=f"{report.model_dir} ({report.quant_method}, activation "
                    f"{report.activation}, {report.dtype}, tensor parallel "
                    f"{report.tensor_parallel}; reference: {report.reference})")
    for c in ("prompt", "greedy tokens", "max |logit diff|", "KL(ref||vLLM) max",
              "KL per position (median, worst at)"):
        t.add_column(c)
    for r in report.results:
        t.add_row(repr(r.prompt), "identical" if r.tokens_equal else
                  f"[red]differ[/]: vLLM {r.vllm_tokens} ref {r.ref_tokens}",
                  f"{r.max_abs_logit_diff:.3g}",
                  f"{r.kl_ref_vllm:.3g}" + ("" if r.kl_ref_vllm < report.kl_limit else " [red]>limit"),
                  _per_position(r.kl_per_position))
    show = Console(file=out)
    show.print(t)
    if not report.ok:
        show.print(f"first divergent layer: {report.first_divergent_layer}")
        for name, d in report.layer_diffs:
            show.print(f"  {name}: max |diff| {d:.3g}")
    show.print("[green]OK[/]" if report.ok else "[red]FAILED[/]",
               f"({'identical greedy tokens and ' if report.tokens_required else ''}"
               f"KL < {report.kl_limit:g} required in {report.dtype})")
    out.flush()
    return 0 if report.ok else 1


def _per_position(kl: list[float]) -> str:
    """The per-position KL in one cell (--json has every position)."""
    if not kl:
        return "-"
    worst = max(range(len(kl)), key=kl.__getitem__)
    return f"{sorted(kl)[len(kl) // 2]:.1e}, position {worst}"


def _run_tp_compare(args, console) -> int:
    from rich.table import Table

    from ternary.tools import tp_compare

    out = _report_stream()
    try:
        with console.status("comparing tensor-parallel sizes") as status:
            report = tp_compare.compare(args.model_dir, args.dtype, args.tp, args.against_tp,
                                        args.max_tokens, timeout=args.timeout,
                                        progress=lambda m: (status.update(m), console.log(m)))
    except Exception as e:  # one line, not a traceback (--verbose keeps it)
        if args.verbose:
            raise
        return _fail(args, f"{args.model_dir}: {type(e).__name__}: {e}", out)
    a, b = report.tp_a, report.tp_b
    if args.json:
        d = dataclasses.asdict(report)
        d["ok"] = report.ok
        for r, row in zip(report.results, d["results"]):
            row.update(tokens_equal=r.tokens_equal, first_difference=r.first_difference,
                       kl_max=r.kl_max)
        print(json.dumps(d, indent=2), file=out, flush=True)
        return 0 if report.ok else 1
    t = Table(title=f"{report.model_dir} ({report.dtype}): vLLM at tensor parallel {b} against "
                    f"{a}, {report.kind}")
    for c in ("prompt", "greedy tokens", "positions", f"KL(tp{a}||tp{b}) max", "max |diff|",
              "KL per position"):
        t.add_column(c)
    for r in report.results:
        same = "identical" if r.tokens_equal else \
            f"[red]differ[/] from position {r.first_difference}"
        t.add_row(repr(r.prompt), same, str(len(r.kl_per_position)), f"{r.kl_max:.3g}"
                  + ("" if r.kl_max < report.kl_limit else " [red]>limit"),
                  f"{r.max_abs_logit_diff:.3g}",
                  _per_position(r.kl_per_position))
    show = Console(file=out, width=200)
    show.print(t)
    show.print("[green]OK[/]" if report.ok else "[red]FAILED[/]",
               f"({'identical greedy tokens and ' if report.tokens_required else ''}"
               f"KL < {report.kl_limit:g} at every position required in {report.dtype})")
    out.flush()
    return 0 if report.ok else 1
