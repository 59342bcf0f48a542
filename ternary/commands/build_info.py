"""`ternary build-info`: the facts compiled into the installed ternary._C."""

from __future__ import annotations

import json


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def facts() -> dict[str, object]:
    import torch

    from ternary import __version__, _ext

    info = _ext.build_info()
    out: dict[str, object] = {
        "vllm_ternary": __version__,
        "torch_runtime": torch.__version__,
        "torch_runtime_cuda": torch.version.cuda,
        "extension": info is not None,
    }
    if info is None:
        err = _ext.load_error()
        out["extension_status"] = f"present but fails to load: {err}" if err else (
            "not present: the ops run the PyTorch reference")
    else:
        out.update({"cuda_version": info["cuda_version"], "torch_version": info["torch_version"],
                    "arch_list": info["arch_list"], "git_revision": info["git_revision"]})
    return out


def run(args) -> int:
    f = facts()
    if args.json:
        print(json.dumps(f, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ternary build-info", show_header=False)
    for k, v in f.items():
        table.add_row(k, str(v))
    Console().print(table)
    return 0
