"""Hugging Face transformers' `bitnet` format (microsoft/bitnet-b1.58-2B-4T,
tiiuae/Falcon3-*-1.58bit, HF1BitLLM/Llama3-8B-1.58): P.weight uint8 [ceil(N/4), K] packed
along N in four row blocks (byte row r, bits 2i..2i+1 hold logical row i*R + r, R =
ceil(N/4)), code w + 1; P.weight_scale one bf16 value. quantization_config.linear_class
"autobitlinear" multiplies by the scale, "bitlinear" (the default) divides by it."""

from __future__ import annotations

import torch

from ternary.formats import module as m
from ternary.formats.errors import Problem
from ternary.formats.files import ModelFiles
from ternary.formats.modules import expected_shape

NAME = "bitnet"
LINEAR_CLASSES = ("bitlinear", "autobitlinear")
SCALE_DTYPES = ("BF16", "F16", "F32")


def pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes [N, K] -> uint8 [ceil(N/4), K] in the four-row-block layout."""
    n, k = codes.shape
    r = -(-n // 4)
    c = torch.zeros(4 * r, k, dtype=torch.uint8)
    c[:n] = (codes + 1).to(torch.uint8)
    c = c.view(4, r, k)
    return c[0] | (c[1] << 2) | (c[2] << 4) | (c[3] << 6)


def unpack_rows(packed: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [R, K] -> the 2-bit fields [n, K] (values 0..3) in logical row order."""
    return torch.cat(m.two_bit_planes(packed), dim=0)[:n]


def encode(codes: torch.Tensor, scale: float, dtype: torch.dtype = torch.bfloat16
           ) -> dict[str, torch.Tensor]:
    """The tensors of one module from int8 codes [N, K] and the stored scale value (what
    the checkpoint holds: the divisor for bitlinear, the factor for autobitlinear)."""
    return {"weight": pack_rows(codes), "weight_scale": torch.tensor([scale], dtype=dtype)}


def config_problems(qc: dict) -> list[tuple[str, str]]:
    """What is wrong with a bitnet quantization_config, as (problem, what to do) pairs; the
    format reader reports them all, the vLLM plugin (ternary.vllm.spec) refuses on the first."""
    out = []
    cls = qc.get("linear_class") or "bitlinear"
    if cls not in LINEAR_CLASSES:
        out.append((f"quantization_config.linear_class is {cls!r}; expected one of "
                     f"{LINEAR_CLASSES}", "fix config.json"))
    if qc.get("quantization_mode", "offline") != "offline":
        out.append((f"quantization_config.quantization_mode is {qc['quantization_mode']!r}: the "
                    "weights are stored dense and quantized on the fly, there is nothing packed "
                    "to read", "convert it with `ternary convert --from dense`"))
    out.extend(m.skip_list_problems(qc))
    return out


def prepare(files: ModelFiles, problems: list[Problem], **_overrides) -> dict:
    qc = files.quantization_config
    ok = m.config_ok(files, config_problems(qc), problems)
    return {"linear_class": (qc.get("linear_class") or "bitlinear") if ok else None}


def module_names(files: ModelFiles) -> list[str]:
    return m.quantized_module_names(files, "U8")


def _padding_rows(files: ModelFiles, wt: str, fields: torch.Tensor, problems: list[Problem]
                  ) -> bool:
    """Without N from config.json the module reads as all 4 R rows of its packing (fields).
    Rows whose codes are 0 across all of K (w = -1 everywhere) at the end are what padding N
    up to a multiple of 4 leaves, so N is then ambiguous: a problem, not a silent -1 * scale
    row."""
    rows = fields.shape[0]
    pad = 0
    while pad < 3 and bool((fields[rows - 1 - pad] == 0).all()):
        pad += 1
    if not pad:
        return True
    problems.append(m.problem(
        files, wt, f"config.json does not give N, and the last {pad} of the {rows} rows the "
        f"packing holds are all code 0 (w = -1 across K), which is what padding N up to a "
        f"multiple of 4 leaves: N is anywhere from {rows - pad} to {rows}",
        "add the model's sizes (hidden_size, num_attention_heads, intermediate_size, ...) "
        "to config.json"))
    return False


def read(files: ModelFiles, name: str, state: dict,
         problems: list[Problem]) -> m.TernaryModule | None:
    wt, st = f"{name}.weight", f"{name}.weight_scale"
    start = len(problems)
    ok = m.require(files, wt, "packed weight (uint8 [ceil(N/4), K])", problems)
    ok = m.require(files, st, "scale (one bf16 weight_scale value)", problems) and ok
    ok = ok and m.listed_but_packed(files, name, problems)
    if not ok:
        return None
    ok = m.check_dtype(files, wt, ("U8",), "a bitnet packed weight", problems)
    ok = m.check_dtype(files, st, SCALE_DTYPES, "a bitnet scale", problems) and ok
    shape, sshape = files.shape(wt), files.shape(st)
    if len(shape) != 2:
        problems.append(m.problem(files, wt, f"packed weight has shape {shape}; expected "
                                  "2-D [ceil(N/4), K]", "re-export the checkpoint"))
        return None
    rows, k = shape
    if sshape not in ([], [1]):
        problems.append(m.problem(files, st, f"scale has shape {sshape}; the bitnet format "
                                  "stores one value ([] or [1])", "re-export the checkpoint"))
        ok = False
    exp = expected_shape(files.config, name)
    if exp is None:
        # transformers' unpack_weights returns 4 * rows rows; without config.json facts
        # that is the only reading, and inspect reports it.
        n, n_from = 4 * rows, f"4 * {rows} packed rows (config.json does not give N)"
    else:
        (n, en_k), why = exp
        n_from = f"config.json ({why})"
        if -(-n // 4) != rows:
            problems.append(m.problem(files, wt, f"config.json ({why}) gives N={n}, which packs "
                                      f"along N into ceil(N/4)={-(-n // 4)} byte rows, but the "
                                      f"tensor has {rows} ({shape})",
                                      "the weights do not belong to this config.json"))
            ok = False
        ok = m.check_config_shape(files, wt, None, k, exp, problems) and ok
    if not ok:
        return None
    # (with a bad quantization_config too: inspect lists every problem, not the first)
    packed, stored = files.get(wt), files.get(st)
    ok = m.check_scale_values(files, st, stored, problems)
    fields = unpack_rows(packed, n)
    ok = m.report_code3(files, wt, fields, "packed along N in four row blocks", problems) and ok
    if exp is None and ok:
        ok = _padding_rows(files, wt, fields, problems)
    if len(problems) > start or not ok or state["linear_class"] is None:
        return None
    s = stored.reshape(1).to(torch.float32)
    if state["linear_class"] == "bitlinear":
        # w / s == w * fl(1/s) exactly for w in {-1, 0, 1}: division is correctly rounded.
        s = torch.ones_like(s) / s
    codes = fields.to(torch.int8) - 1
    op = "/" if state["linear_class"] == "bitlinear" else "x"
    return m.TernaryModule(name, n, k, s, 0, str(files.file_of(wt)), codes_=codes,
                           info={"stored": f"U8 {shape}", "packing": "along N, 4 row blocks",
                                 "scale": f"tensor {op}"
                                 f" {files.dtype(st)} {stored.reshape(-1)[0].item():g}"
                                 f" ({state['linear_class']})",
                                 "group_size": None, "note": f"N={n} from {n_from}"})
