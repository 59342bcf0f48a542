"""Open any supported checkpoint and hand out its quantized modules in canonical terms,
lazily, one module at a time (what the vLLM plugin, the kernel helpers, convert and inspect
use)."""

from __future__ import annotations

import os
from typing import Iterator

import torch

from ternary.formats import bitnet, canonical, dense, vendor_int8
from ternary.formats.errors import FormatError, Problem
from ternary.formats.files import CONFIG, ModelFiles
from ternary.formats.module import TernaryModule, common_scale

FORMATS = {canonical.NAME: canonical, bitnet.NAME: bitnet, vendor_int8.NAME: vendor_int8,
           dense.NAME: dense}


def detect(files: ModelFiles) -> str:
    """The format, from config.json's quantization_config or, without one, the tensors."""
    qc = files.quantization_config
    method = qc.get("quant_method")
    if method is not None:
        if method in vendor_int8.ALIASES:
            return vendor_int8.NAME
        if method in (canonical.NAME, bitnet.NAME):
            return method
        raise FormatError(files.dir / CONFIG, None, f"quantization_config.quant_method is "
                          f"{method!r}, which vllm-ternary does not read",
                          f"supported: {canonical.NAME}, {bitnet.NAME}, "
                          f"{' / '.join(vendor_int8.ALIASES)}, or no quantization_config (dense)")
    dtypes = {files.dtype(t) for t in files.names() if t.endswith(".weight")}
    scaled = any(t.endswith(".weight_scale") for t in files.names())
    if "I8" in dtypes and scaled:
        return vendor_int8.NAME
    if "U8" in dtypes or scaled:
        raise FormatError(files.dir / CONFIG, None, "packed uint8 weights or weight_scale "
                          "tensors but no quantization_config, so the packing (ternary along "
                          "K or bitnet along N) is unknown",
                          'add quantization_config with quant_method "ternary" or "bitnet"')
    return dense.NAME


class Checkpoint:
    """A model directory in any supported format.

    `code_map` and `group_size` override vendor-int8 detection. Model-level facts are
    settled on open; modules are read on demand. Every problem raises FormatError.
    """

    def __init__(self, model_dir: str | os.PathLike, *, format: str | None = None,
                 code_map: str | None = None, group_size: int | None = None,
                 keep_going: bool = False):
        # keep_going (inspect): a shard with a bad header is a problem on the list, and the
        # other shards are still read; otherwise it raises here
        shard_problems: list[Problem] | None = [] if keep_going else None
        self.files = ModelFiles(model_dir, shard_problems)
        found = detect(self.files)
        if format in vendor_int8.ALIASES:
            format = vendor_int8.NAME
        if format is not None and format != found:
            if format not in FORMATS:
                raise FormatError(self.files.dir, None, f"unknown format {format!r}",
                                  f"choose one of {list(FORMATS)}")
            raise FormatError(self.files.dir / CONFIG, None, f"asked to read it as {format!r} "
                              f"but it is {found!r} (from quantization_config and the tensors)",
                              f"pass --from {found}, or fix config.json")
        self.format = found
        self.impl = FORMATS[found]
        if found != vendor_int8.NAME and (code_map is not None or group_size is not None):
            given = " and ".join(f"{k}={v!r}" for k, v in (("code_map", code_map),
                                                           ("group_size", group_size))
                                 if v is not None)
            raise FormatError(self.files.dir / CONFIG, None, f"{given} given, but those settle "
                              f"vendor-int8 checkpoints and this one is {found!r}",
                              "drop --code-map / --group-size")
        self.problems: list[Problem] = list(shard_problems or ())  # model-level ones
        self.state = self.impl.prepare(self.files, self.problems, code_map=code_map,
                                       group_size=group_size)

    @property
    def dir(self):
        return self.files.dir

    @property
    def config(self) -> dict:
        return self.files.config

    @property
    def activation(self) -> str:
        """How the model's quantized layers treat their input (docs/formats.md): every bitnet
        checkpoint is int8_per_token, a canonical one says so in its quantization_config,
        vendor-int8 and dense ones are float ("none")."""
        if self.format == bitnet.NAME:
            return bitnet.ACTIVATION
        if self.format == canonical.NAME:
            return canonical.activation(self.files.quantization_config)
        return "none"

    def module_names(self) -> list[str]:
        return self.impl.module_names(self.files)

    def _raise_first(self, problems: list[Problem]) -> None:
        if problems:
            raise FormatError.of(problems[0])

    def module(self, name: str) -> TernaryModule:
        """One quantized module (for dense checkpoints: quantized by absmean)."""
        name = _strip(name)
        self._raise_first(self.problems)
        problems: list[Problem] = []
        mod = self.impl.read(self.files, name, self.state, problems)
        self._raise_first(problems)
        return mod

    def __iter__(self) -> Iterator[TernaryModule]:
        for name in self.module_names():
            yield self.module(name)

    def dequantize(self, name: str) -> torch.Tensor:
        """float32 [N, K]: the dense weight exactly as the checkpoint defines it."""
        name = _strip(name)
        self._raise_first(self.problems)  # a config that misreads every module comes first
        if self.format == dense.NAME:
            problems: list[Problem] = []
            w = dense.read_dense(self.files, name, problems)
            self._raise_first(problems)
            return w
        if name not in self.module_names():
            t = f"{name}.weight"
            if t in self.files and self.files.dtype(t) in dense.FLOAT_DTYPES \
                    and len(self.files.shape(t)) == 2:
                # kept unquantized (modules_to_not_convert, lm_head): stored dense
                problems = []
                w = dense.read_dense(self.files, name, problems)
                self._raise_first(problems)
                return w
            raise FormatError(self.files.dir, f"{name}.weight", "not a quantized module of "
                              f"this {self.format} checkpoint",
                              f"quantized modules: {self.module_names()[:8]}...")
        return self.module(name).dense()

    def check(self) -> tuple[list[TernaryModule], list[Problem]]:
        """Every module that reads cleanly and every problem found (nothing raised)."""
        problems = list(self.problems)
        mods = []
        for name in self.module_names():
            try:
                mod = self.impl.read(self.files, name, self.state, problems)
            except FormatError as e:  # a tensor safetensors cannot read: the next one may be fine
                problems.extend(e.records)
                continue
            if mod is not None:
                mods.append(mod)
        return mods, problems

    def close(self) -> None:
        self.files.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _strip(name: str) -> str:
    for suffix in (".weight_scale", ".weight"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def iter_modules(model_dir: str | os.PathLike, **overrides
                 ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor, int]]:
    """(name, packed uint8 [N, K/4], scale float32, group_size) per quantized module, in
    the checkpoint's own scale layout, reading one module at a time."""
    with Checkpoint(model_dir, **overrides) as ckpt:
        for mod in ckpt:
            mode = "group" if mod.group_size else mod.scale_mode
            packed, scale = mod.canonical(mode, mod.group_size)
            yield mod.name, packed, scale, mod.group_size


def plan_scale(ckpt: Checkpoint) -> tuple[str, int | None]:
    """The canonical (scale, group_size) for the whole checkpoint (reads the modules)."""
    pairs = []
    for mod in ckpt:
        pairs.append((mod.group_size, mod.scale.numel() == 1 and mod.n != 1))
    return common_scale(pairs) if pairs else ("channel", None)
