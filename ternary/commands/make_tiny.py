"""`ternary make-tiny DIR`: write the tiny deterministic ternary model
(ternary.tools.synthetic.tiny): Llama, or BitNetForCausalLM in 2B-4T's layout (--arch bitnet)."""

from __future__ import annotations

import sys
from pathlib import Path


def _out_dir(text: str) -> Path:
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path would write into the current directory; "
                                         "name the directory to create")
    return Path(text)


def _seed(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is not in 0 .. 2**63 - 1")
    return value


def add_arguments(p) -> None:
    from ternary.tools.synthetic import tiny

    p.add_argument("out", type=_out_dir, help="directory to write (created; a previous "
                   "make-tiny model there is replaced)")
    p.add_argument("--arch", default="llama", choices=tiny.ARCHS,
                   help="llama: LlamaForCausalLM; bitnet: BitNetForCausalLM as "
                        "microsoft/bitnet-b1.58-2B-4T (sub-norms, relu2, tied embeddings, "
                        "bitnet format, autobitlinear)")
    p.add_argument("--format", default=None, choices=tiny.FORMATS,
                   help="ternary: canonical v1; bitnet: transformers' layout (default: ternary "
                        "for --arch llama, bitnet for --arch bitnet)")
    p.add_argument("--online", action="store_true",
                   help="bitnet format: store dense float master weights (quantization_mode "
                        "online, as 2B-4T's -bf16 variant), quantized when loaded")
    p.add_argument("--scale", default="channel", choices=tiny.SCALES,
                   help="scale granularity of the ternary format (bitnet: one per tensor)")
    p.add_argument("--group-size", type=int, default=32, help="with --scale group")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                   help=f"MLP width instead of {tiny.SHAPE['intermediate_size']} (a multiple "
                        f"of 4; e.g. 260 gives a down_proj K that tensor parallel 2 cannot "
                        f"split into whole bytes)")
    p.add_argument("--no-outliers", dest="outliers", action="store_false",
                   help="norm weights without their few outlier channels (20-40x the rest): "
                        "int8 activations then stay near their float32 values at bf16; with "
                        "them, serving float activations instead of int8 changes tokens")


def run(args) -> int:
    import json

    from rich.console import Console

    from ternary.tools.synthetic import tiny

    console = Console()
    try:
        with console.status(f"writing {args.out}"):
            tiny.make(args.out, args.format, args.scale, args.group_size, args.seed,
                      args.intermediate_size, arch=args.arch, online=args.online,
                      outliers=args.outliers)
    except ValueError as e:
        print(f"ternary make-tiny: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ternary make-tiny: cannot write {args.out} ({e.strerror or e}: "
              f"{e.filename or args.out}); choose a directory you can create", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"ternary make-tiny: {e.name or e} is not installed (the tokenizer needs it: "
              "pip install tokenizers)", file=sys.stderr)
        return 2
    for f in sorted(args.out.iterdir()):
        console.print(f"  {f.name:28} {f.stat().st_size:>10,} bytes")
    cfg = json.loads((args.out / "config.json").read_text())
    qc = cfg["quantization_config"]
    mode = f", {qc['quantization_mode']}" if "quantization_mode" in qc else ""
    console.print(f"tiny {cfg['architectures'][0]} ({qc['quant_method']} format{mode}) in "
                  f"{args.out}")
    return 0
