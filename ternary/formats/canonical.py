"""The canonical `ternary` format, version 1 (docs/formats.md): per quantized linear P,
P.weight uint8 [N, K/4] packed along K, LSB first, code = w + 1 (3 invalid), and
P.weight_scale float32 [1] / [N] / [N, ceil(K/group_size)]; config.json says
{"quant_method": "ternary", "version": 1, "scale": ..., "group_size": ...,
"activation": "none" | "int8_per_token", "modules_to_not_convert": [...]}.

`activation` (absent: "none") is how the layers treat their input: "none" multiplies the
float activations as they are (W1.58A16); "int8_per_token" quantizes each token's input to
int8 first, exactly as transformers' bitnet layers do (W1.58A8): s = 127 / max|x| (clamped
at 1e-5), x_q = round_half_even(x * s) clamped to [-128, 127], y = (x_q . w) / s."""

from __future__ import annotations

import torch

from ternary.formats import module as m
from ternary.formats.errors import Problem
from ternary.formats.files import ModelFiles
from ternary.formats.modules import expected_shape

NAME = "ternary"
VERSION = 1
SCALE_MODES = ("channel", "tensor", "group")
ACTIVATIONS = ("none", "int8_per_token")


def quantization_config(scale: str, group_size: int | None,
                        modules_to_not_convert: list[str], activation: str = "none") -> dict:
    return {"quant_method": NAME, "version": VERSION, "scale": scale,
            "group_size": group_size if scale == "group" else None,
            "activation": activation,
            "modules_to_not_convert": list(modules_to_not_convert)}


def activation(qc: dict) -> str:
    """The activation mode a (checked) canonical quantization_config states."""
    return qc.get("activation") or "none"


def encode(codes: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of one module (suffixes weight, weight_scale) from int8 codes [N, K]."""
    from ternary import ops

    return {"weight": ops.pack(codes), "weight_scale": scale.to(torch.float32).contiguous()}


def config_problems(qc: dict) -> list[tuple[str, str]]:
    """What is wrong with a canonical quantization_config, as (problem, what to do) pairs.
    The format reader reports them all; the vLLM plugin (ternary.vllm.spec) refuses on the
    first, so both accept exactly the same checkpoints. Absent keys read as version 1 and a
    per-channel scale."""
    out = []
    if qc.get("version", VERSION) != VERSION:
        out.append((f"quantization_config.version is {qc.get('version')!r}; this reader knows "
                    f"version {VERSION}",
                    "upgrade vllm-ternary or re-convert the model with `ternary convert`"))
    scale, group_size = qc.get("scale", "channel"), qc.get("group_size")
    if scale not in SCALE_MODES:
        out.append((f"quantization_config.scale is {scale!r}; expected one of {SCALE_MODES}",
                    "fix config.json"))
    elif scale == "group" and not (isinstance(group_size, int) and not isinstance(group_size, bool)
                                   and group_size > 0):
        out.append((f"quantization_config.scale is 'group' but group_size is {group_size!r}",
                    "set group_size to the group length along K, a positive integer"))
    elif scale != "group" and group_size is not None:
        out.append((f"quantization_config.group_size is {group_size!r} with scale {scale!r}; "
                    "group_size applies to scale 'group' only", "set group_size to null"))
    act = qc.get("activation", "none")
    if act is not None and act not in ACTIVATIONS:
        out.append((f"quantization_config.activation is {act!r}; expected one of "
                    f"{list(ACTIVATIONS)} (absent means 'none')",
                    "fix config.json: 'int8_per_token' for models trained with int8 "
                    "activations (BitNet b1.58), 'none' for float activations"))
    out.extend(m.skip_list_problems(qc))
    return out


def prepare(files: ModelFiles, problems: list[Problem], **_overrides) -> dict:
    qc = files.quantization_config
    ok = m.config_ok(files, config_problems(qc), problems)
    m.config_ok(files, m.split_fused_problems(files), problems)  # the data still reads
    return {"scale": qc.get("scale", "channel") if ok else None,
            "group_size": qc.get("group_size") or 0}


def module_names(files: ModelFiles) -> list[str]:
    return m.quantized_module_names(files, "U8")


def read(files: ModelFiles, name: str, state: dict,
         problems: list[Problem]) -> m.TernaryModule | None:
    wt, st = f"{name}.weight", f"{name}.weight_scale"
    start = len(problems)
    found = m.weight_and_scale(
        files, name, "[N, K/4]", ("packed weight (uint8 [N, K/4])", ("U8",), "a packed ternary weight"),
        ("scale (float32 weight_scale)", ("F32",), "a ternary scale"), problems)
    if found is None:
        return None
    shape, ok = found
    n, k = shape[0], shape[1] * 4
    exp = expected_shape(files.config, name)
    if exp is not None and exp[0][1] % 4:
        problems.append(m.problem(files, wt, f"config.json ({exp[1]}) gives K={exp[0][1]}, "
                                  "not a multiple of 4, which the packing [N, K/4] along K "
                                  f"cannot hold (the tensor is {shape}, i.e. K={k})",
                                  "keep this module dense (modules_to_not_convert)"))
        ok = False
    else:
        ok = m.check_config_shape(files, wt, n, k, exp, problems) and ok
    mode, g = state["scale"], state["group_size"]
    sshape = files.shape(st)
    if mode is not None:
        want = {"channel": [n], "tensor": [1]}.get(mode) or [n, -(-k // g)]
        if sshape != want:
            problems.append(m.problem(
                files, st, f"scale shape {sshape} does not fit scale={mode!r}"
                f"{f', group_size={g}' if mode == 'group' else ''} for the packed weight "
                f"{shape} (N={n}, K={k}); expected {want}",
                "the scale and the weight disagree about N or K: re-export the module"))
            ok = False
    if not ok:
        return None
    # (with a bad quantization_config too: inspect lists every problem, not the first)
    packed, scale = files.get(wt), files.get(st)
    ok = m.check_scale_values(files, st, scale, problems)
    fields = torch.stack(m.two_bit_planes(packed), dim=-1).reshape(n, k)
    ok = m.report_code3(files, wt, fields, "packed along K", problems) and ok
    if len(problems) > start or not ok or mode is None:
        return None
    return m.TernaryModule(name, n, k, scale, g if mode == "group" else 0, str(files.file_of(wt)),
                           packed_=packed,
                           info={"stored": f"U8 {shape}", "packing": "along K, LSB first",
                                 "scale": f"{mode} x", "group_size": g or None, "note": ""})
