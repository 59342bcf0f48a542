"""What `ternary inspect` reports about a model directory, as plain data: the format, each
quantized module (shape, stored layout, packing, scale convention, code histogram, group
size) and every problem found, without stopping at the first."""

from __future__ import annotations

import dataclasses
import os

from ternary.formats import dense
from ternary.formats.errors import FormatError
from ternary.formats.reader import Checkpoint


def inspect(model_dir: str | os.PathLike, **overrides) -> dict:
    report = {"dir": str(model_dir), "format": None, "quantization_config": None,
              "activation": None,
              "detected": {}, "modules": [], "problems": []}
    try:
        ckpt = Checkpoint(model_dir, keep_going=True, **overrides)
    except FormatError as e:
        report["problems"].extend(dataclasses.asdict(r) for r in e.records)
        report["ok"] = False
        return report
    with ckpt:
        report["format"] = ckpt.format
        report["quantization_config"] = ckpt.files.quantization_config or None
        report["activation"] = ckpt.activation
        if "code_map" in ckpt.state:
            report["detected"]["code_map"] = ckpt.state["code_map"]
            report["detected"]["code_map_evidence"] = ckpt.state["code_map_evidence"]
        if ckpt.format == dense.NAME:
            problems = list(ckpt.problems)
            for name in ckpt.module_names():
                t = f"{name}.weight"
                try:
                    w = dense.read_dense(ckpt.files, name, problems)
                except FormatError as e:  # a tensor safetensors cannot read
                    problems.extend(e.records)
                    continue
                if w is not None:
                    report["modules"].append({
                        "module": name, "shape": ckpt.files.shape(t),
                        "stored": f"{ckpt.files.dtype(t)} {ckpt.files.shape(t)}",
                        "packing": "dense", "scale": None, "group_size": None,
                        "note": "convert --from dense quantizes it (absmean per channel)",
                        "histogram": None})
        else:
            mods, problems = ckpt.check()
            for mod in mods:
                report["modules"].append({"module": mod.name, "shape": [mod.n, mod.k],
                                          **mod.info, "histogram": mod.histogram()})
        report["problems"] = [dataclasses.asdict(p) for p in problems]
    report["ok"] = not report["problems"]
    return report
