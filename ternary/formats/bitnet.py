"""Hugging Face transformers' `bitnet` format (microsoft/bitnet-b1.58-2B-4T,
tiiuae/Falcon3-*-1.58bit, HF1BitLLM/Llama3-8B-1.58): P.weight uint8 [ceil(N/4), K] packed
along N in four row blocks (byte row r, bits 2i..2i+1 hold logical row i*R + r, R =
ceil(N/4)), code w + 1; P.weight_scale one bf16 value. quantization_config.linear_class
"autobitlinear" multiplies by the scale, "bitlinear" (the default) divides by it.

Every bitnet checkpoint is W1.58A8: both linear classes quantize their input per token to
int8 (activation "int8_per_token" in canonical terms). quantization_mode "online" with
autobitlinear stores dense float master weights that transformers' WeightQuant quantizes in
every forward (per tensor, absmean); read here exactly as WeightQuant computes them."""

from __future__ import annotations

import torch

from ternary.formats import module as m
from ternary.formats.errors import Problem
from ternary.formats.files import ModelFiles
from ternary.formats.modules import expected_shape, is_linear

NAME = "bitnet"
LINEAR_CLASSES = ("bitlinear", "autobitlinear")
SCALE_DTYPES = ("BF16", "F16", "F32")
ACTIVATION = "int8_per_token"
QUANTIZATION_MODES = ("offline", "online")


def linear_class(qc: dict) -> str:
    return qc.get("linear_class") or "bitlinear"


def is_online(qc: dict) -> bool:
    """Dense master weights quantized at load: transformers does that for autobitlinear only
    (BitLinear always reads packed weights, whatever quantization_mode says)."""
    return linear_class(qc) == "autobitlinear" and qc.get("quantization_mode") == "online"


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
    mode = qc.get("quantization_mode", "offline")
    if mode not in QUANTIZATION_MODES:
        out.append((f"quantization_config.quantization_mode is {mode!r}; expected one of "
                    f"{list(QUANTIZATION_MODES)}", "fix config.json"))
    if qc.get("use_rms_norm"):
        out.append(("quantization_config.use_rms_norm is true: each BitLinear normalizes its "
                    "input with an RMSNorm of its own, which vllm-ternary does not serve",
                    "serve it with transformers, or fold the norms into the model and set "
                    "use_rms_norm to false"))
    out.extend(m.skip_list_problems(qc))
    return out


def prepare(files: ModelFiles, problems: list[Problem], **_overrides) -> dict:
    qc = files.quantization_config
    ok = m.config_ok(files, config_problems(qc), problems)
    packed = [t for t in files.names() if t.endswith(".weight") and files.dtype(t) == "U8"]
    if ok and is_online(qc) and packed:
        problems.append(m.problem(
            files, None, f"quantization_config says quantization_mode 'online' (dense "
            f"master weights, quantized at load), but {len(packed)} weight(s) are stored packed "
            f"(uint8, e.g. {packed[0]})", "set quantization_mode to 'offline' for packed weights"))
        ok = False
    return {"linear_class": linear_class(qc) if ok else None, "online": is_online(qc)}


def module_names(files: ModelFiles) -> list[str]:
    if is_online(files.quantization_config):
        from ternary.formats import dense

        # transformers replaces every nn.Linear but lm_head and modules_to_not_convert
        skip = list(files.quantization_config.get("modules_to_not_convert") or [])
        return sorted(t[: -len(".weight")] for t in files.names()
                      if t.endswith(".weight") and files.dtype(t) in dense.FLOAT_DTYPES
                      and is_linear(t[: -len(".weight")], files.shape(t), skip))
    return m.quantized_module_names(files, "U8")


def weight_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' WeightQuant (online autobitlinear) as codes and a per-tensor scale:
    in float32, scale = 1 / max(mean|w|, 1e-5), codes = round_half_even(w * scale) clamped to
    [-1, 1], and the weight it computes with is codes / scale, which for codes in {-1, 0, 1}
    is codes * (1 / scale) exactly (division is correctly rounded). Returns (codes int8,
    float32 [1] = 1 / scale)."""
    wf = w.to(torch.float32)
    scale = 1.0 / wf.abs().mean().clamp_(min=1e-5)
    codes = (wf * scale).round().clamp(-1, 1).to(torch.int8)
    return codes, (1.0 / scale).reshape(1)


def _read_online(files: ModelFiles, name: str, problems: list[Problem]
                 ) -> m.TernaryModule | None:
    from ternary.formats import dense

    w = dense.read_dense(files, name, problems)
    if w is None:
        return None
    codes, s = weight_quant(w)
    n, k = codes.shape
    return m.TernaryModule(name, n, k, s, 0, str(files.file_of(f"{name}.weight")), codes_=codes,
                           info={"stored": f"{files.dtype(name + '.weight')} {[n, k]}",
                                 "packing": "dense (online)",
                                 "scale": f"tensor x {s.item():g} (absmean, at load)",
                                 "group_size": None,
                                 "note": "quantized at load as transformers' WeightQuant"})


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
    if state["online"]:
        return _read_online(files, name, problems) if state["linear_class"] else None
    wt, st = f"{name}.weight", f"{name}.weight_scale"
    start = len(problems)
    found = m.weight_and_scale(
        files, name, "[ceil(N/4), K]",
        ("packed weight (uint8 [ceil(N/4), K])", ("U8",), "a bitnet packed weight"),
        ("scale (one bf16 weight_scale value)", SCALE_DTYPES, "a bitnet scale"), problems)
    if found is None:
        return None
    shape, ok = found
    sshape = files.shape(st)
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
