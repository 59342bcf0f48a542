"""Conversion of any supported checkpoint to the canonical `ternary` format, tensor by
tensor: one module is in memory at a time and output shards are written as they fill."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from ternary._build.staging import remove_stale_temp_dirs, temp_dir_for
from ternary.formats import canonical, dense, vendor_int8
from ternary.formats.errors import FormatError
from ternary.formats.files import CONFIG, INDEX, ShardWriter, iter_tensor_names, test_pause
from ternary.formats.modules import not_converted, split_fused_layers
from ternary.formats.reader import Checkpoint, plan_scale

# Weight files of other serializations are not copied: the output holds its own weights.
_NOT_COPIED = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf",
               ".partial")


@dataclasses.dataclass
class ConvertReport:
    source: str
    source_format: str
    destination: str
    scale: str
    group_size: int | None
    activation: str
    modules: int
    kept_dense: list[str]
    tensors_copied: int
    files_copied: list[str]
    shards: list[str]
    bytes_written: int
    notes: list[str]


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, source_format: str | None = None,
            code_map: str | None = None, group_size: int | None = None,
            not_convert: list[str] | tuple = (), max_shard_bytes: int = 2 << 30,
            activation: str | None = None,
            progress: Callable[[int, int, str], None] | None = None) -> ConvertReport:
    """Write `src` (bitnet, vendor-int8 or dense) to `dst` in the canonical format.
    `activation` (canonical.ACTIVATIONS) is the source's own by default: int8_per_token for
    bitnet, none otherwise; a dense export of a model trained with int8 activations (BitNet
    master weights) needs int8_per_token said, and a bitnet source refuses "none".
    `progress(done_bytes, total_bytes, tensor)` is called after each source tensor."""
    src, dst = Path(src), Path(dst)
    stale = remove_stale_temp_dirs(dst, "converting")  # of a run killed half-way
    if dst.exists() and not dst.is_dir():
        raise FormatError(dst, None, "destination exists and is not a directory",
                          "choose a new directory")
    if dst.exists() and (dst.resolve() == src.resolve() or any(dst.iterdir())):
        raise FormatError(dst, None, "destination exists and is not empty",
                          "choose a new directory or remove it first")
    if activation is not None and activation not in canonical.ACTIVATIONS:
        raise FormatError(src, None, f"activation {activation!r} is not one of "
                          f"{list(canonical.ACTIVATIONS)}", "pass --activation none or "
                          "int8_per_token")
    ckpt = Checkpoint(src, format=source_format, code_map=code_map, group_size=group_size)
    if activation is None:
        activation = ckpt.activation
    elif activation != ckpt.activation and ckpt.activation != "none":
        raise FormatError(src / CONFIG, None, f"the {ckpt.format} source computes with "
                          f"activation {ckpt.activation!r}; writing {activation!r} would change "
                          "what the model computes", "drop --activation")
    if ckpt.format == canonical.NAME:
        raise FormatError(src / CONFIG, None, "already in the canonical ternary format",
                          "nothing to convert; `ternary inspect` checks it")
    if ckpt.problems:
        raise FormatError.of(ckpt.problems[0])
    files = ckpt.files
    src_skip = (ckpt.state["modules_to_not_convert"] if ckpt.format == dense.NAME
                else files.quantization_config.get("modules_to_not_convert") or [])
    skip = list(dict.fromkeys(list(src_skip) + list(not_convert)
                              + (["lm_head"] if "lm_head.weight" in files else [])))
    linear = [t[: -len(".weight")] for t in files.names() if t.endswith(".weight")]
    split = split_fused_layers(linear, skip)
    if split:
        fused, listed, missing = split[0]
        raise FormatError(src / CONFIG, None, f"modules_to_not_convert of the result would list "
                          f"{listed} but not {missing}, which vLLM loads as one layer "
                          f"{fused!r}", "pass --not-convert for all of them or for none")
    names = ckpt.module_names()
    quantized = [n for n in names if not not_converted(n, list(not_convert))]
    # all at once: module by module, each retry of a large model would find the next one
    odd = [n for n in quantized
           if len(files.shape(f"{n}.weight")) == 2 and files.shape(f"{n}.weight")[1] % 4]
    if odd:
        kinds = sorted({".".join(n.split(".")[-2:]) for n in odd})
        raise FormatError(files.file_of(f"{odd[0]}.weight"), f"{odd[0]}.weight",
                          f"K={files.shape(odd[0] + '.weight')[1]} is not a multiple of 4 here "
                          f"and in {len(odd) - 1} more module(s) ({', '.join(kinds)}), so the "
                          "canonical [N, K/4] packing cannot hold them",
                          f"keep them dense: --not-convert {' '.join(kinds)}")
    # Listed modules of a dense source are copied untouched; of a packed source, stored
    # dense (float32, exactly as the source defines them), since nothing else reads them.
    kept = [] if ckpt.format == dense.NAME else [n for n in names if n not in quantized]
    names = quantized + kept
    notes = list(stale)
    if ckpt.format == "bitnet":
        mode, g = "tensor", None
    elif ckpt.format == dense.NAME:
        mode, g = "channel", None
    else:
        # vendor-int8 modules may differ in group size; one layout must hold them all.
        mode, g = plan_scale(ckpt)
        notes.append(f"code map: {ckpt.state['code_map']} ({ckpt.state['code_map_evidence']})")

    # everything goes into a temporary directory next to dst, renamed to dst at the very
    # end: a full disk or a kill leaves no directory any reader would take for the model
    tmp = temp_dir_for(dst, "converting")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        writer = ShardWriter(tmp, max_shard_bytes)
        total = sum(files.nbytes(t) for t in files.names())
        done, copied = 0, 0
        group_notes: dict[str, int] = {}  # how each vendor-int8 module's group size was read
        role = {}
        for n in names:
            role[f"{n}.weight"], role[f"{n}.weight_scale"] = n, n
        for t in iter_tensor_names(files):
            done += files.nbytes(t)
            mod_name = role.get(t)
            if mod_name is None:
                # a copy: a view would keep its source shard mapped until the output flushes
                writer.add(t, files.get(t).clone())
                copied += 1
            elif t == f"{mod_name}.weight":
                mod = ckpt.module(mod_name)
                if mod_name in kept:
                    writer.add(t, mod.dense())
                else:
                    if ckpt.format == vendor_int8.NAME and mod.info.get("note"):
                        group_notes[mod.info["note"]] = group_notes.get(mod.info["note"], 0) + 1
                    packed, scale = mod.canonical(mode, g)
                    writer.add(f"{mod_name}.weight", packed)
                    writer.add(f"{mod_name}.weight_scale", scale)
                del mod
            if progress:
                progress(done, total, t)
            test_pause()
        shards = writer.close()
        notes += [f"scale of {c} module(s): {why}" for why, c in group_notes.items()]
        copied_files = _copy_side_files(src, tmp)
        config = dict(files.config)
        config["quantization_config"] = canonical.quantization_config(mode, g, skip, activation)
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        ckpt.close()
        if dst.exists():
            dst.rmdir()
        tmp.replace(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ConvertReport(str(src), ckpt.format, str(dst), mode, g, activation, len(quantized), kept,
                         copied, copied_files, [str(dst / s.name) for s in shards],
                         writer.total_bytes, notes)


def _left_behind(name: str) -> bool:
    return name.startswith(".") or name.endswith(_NOT_COPIED)


def _copy_side_files(src: Path, dst: Path) -> list[str]:
    """Tokenizer, generation config and anything else that is not a weight file, at any
    depth (Meta's repositories keep the original dense weights in original/)."""
    copied = []
    for p in sorted(src.iterdir()):
        if p.name in (CONFIG, INDEX) or _left_behind(p.name):
            continue
        if p.is_dir():
            shutil.copytree(p, dst / p.name,
                            ignore=lambda _d, names: [n for n in names if _left_behind(n)])
        else:
            shutil.copy2(p, dst / p.name)
        copied.append(p.name)
    return copied
