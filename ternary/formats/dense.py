"""`dense`: an ordinary floating-point checkpoint. Its linear layers (modules.is_linear) are
what `ternary convert --from dense` quantizes with absmean per output channel."""

from __future__ import annotations

import torch

from ternary.formats import module as m
from ternary.formats.absmean import quantize
from ternary.formats.errors import Problem
from ternary.formats.files import ModelFiles
from ternary.formats.modules import expected_shape, is_linear

NAME = "dense"
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def prepare(files: ModelFiles, problems: list[Problem], **_overrides) -> dict:
    """modules_to_not_convert from quantization_config, else from the top level of
    config.json (where some dense exports keep it)."""
    qc = files.quantization_config
    where, holder = (("quantization_config.", qc) if qc.get("modules_to_not_convert")
                     else ("", files.config))
    found = m.skip_list_problems(holder, where)
    m.config_ok(files, found, problems)
    return {"modules_to_not_convert": [] if found else holder.get("modules_to_not_convert") or []}


def module_names(files: ModelFiles, extra_not_convert: list[str] | None = None) -> list[str]:
    skip = list(prepare(files, []).get("modules_to_not_convert")) + list(extra_not_convert or [])
    return sorted(t[: -len(".weight")] for t in files.names()
                  if t.endswith(".weight") and files.dtype(t) in FLOAT_DTYPES
                  and is_linear(t[: -len(".weight")], files.shape(t), skip))


def read_dense(files: ModelFiles, name: str, problems: list[Problem]) -> torch.Tensor | None:
    wt = f"{name}.weight"
    if not m.require(files, wt, "weight", problems):
        return None
    if not m.check_dtype(files, wt, FLOAT_DTYPES, "a dense weight", problems):
        return None
    shape = files.shape(wt)
    if len(shape) != 2:
        problems.append(m.problem(files, wt, f"weight has shape {shape}; a linear weight is "
                                  "2-D [N, K]", "list it in modules_to_not_convert"))
        return None
    if not m.check_config_shape(files, wt, shape[0], shape[1],
                                expected_shape(files.config, name), problems):
        return None
    w = files.get(wt).to(torch.float32)
    # cheaper than isfinite on every element: a float64 sum of |float32| values stays finite
    if not torch.isfinite(w.abs().sum(dtype=torch.float64)):
        bad = ~torch.isfinite(w)
        first = bad.nonzero()[0].tolist()
        problems.append(m.problem(files, wt, f"{int(bad.sum())} weight values are NaN/inf "
                                  f"(first at [n, k] = {first})", "fix the source checkpoint"))
        return None
    return w


def read(files: ModelFiles, name: str, state: dict,
         problems: list[Problem]) -> m.TernaryModule | None:
    """The module quantized (absmean, per channel), for conversion."""
    w = read_dense(files, name, problems)
    if w is None:
        return None
    codes, scale = quantize(w)
    n, k = codes.shape
    return m.TernaryModule(name, n, k, scale, 0, str(files.file_of(f"{name}.weight")),
                           codes_=codes,
                           info={"stored": f"{files.dtype(name + '.weight')} {[n, k]}",
                                 "packing": "dense", "scale": "absmean channel x",
                                 "group_size": None, "note": "quantized on conversion"})
