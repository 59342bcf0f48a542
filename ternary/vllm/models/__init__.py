"""Model implementations the plugin adds to vLLM (registered by ternary.vllm.register).

- bitnet.py  BitNetForCausalLM (microsoft/bitnet-b1.58-2B-4T and every model_type "bitnet"
             checkpoint): vLLM's Llama plus the two sub-norms and the config's activation

This module imports neither vLLM nor the model: the plugin reads it in every vLLM process,
and vLLM imports the model itself, lazily, by the string registered for it.
"""

from __future__ import annotations

import re

import torch

from ternary.vllm.spec import TernaryConfigError

BITNET_ARCH = "BitNetForCausalLM"
BITNET_CLASS = "ternary.vllm.models.bitnet:BitNetForCausalLM"
# architectures the plugin serves bitnet checkpoints in, by model_type: Llama through
# vLLM's own model, BitNet through ours
SERVED_ARCHITECTURES = {"llama": ("LlamaForCausalLM",), "bitnet": (BITNET_ARCH,)}
# Before 0.7 vLLM's Llama has no VllmConfig constructors and no decoder layer_type to
# subclass (the 0.6.x API); bitnet.py also checks the features it uses on newer releases.
FIRST_VLLM = (0, 7)


def refusal(version: str, why: str) -> TernaryConfigError:
    return TernaryConfigError(
        f"vLLM {version} cannot serve {BITNET_ARCH} (model_type 'bitnet', e.g. "
        f"microsoft/bitnet-b1.58-2B-4T): {why}. Serve it on a target whose vLLM can: "
        f"{serving_targets()}"
    )


def serving_targets() -> str:
    """The targets of envs/targets.toml whose vLLM builds the model ("`current` (vLLM
    0.33.0), ..."): the matrix is the one place that says which vLLM a target pins."""
    from ternary._build import matrix

    found = []
    for t in matrix.load().values():
        dist, _, version = t.vllm.partition("==")
        rel = release(version)
        if rel is not None and rel >= FIRST_VLLM:
            found.append(f"`{t.name}` ({'vLLM' if dist == 'vllm' else dist} {version})")
    return ", ".join(found[:-1]) + f" or {found[-1]}" if len(found) > 1 else "".join(found)


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string ("0.6.4.post1", "0.32.0+cpu"); None if it
    does not start with two numbers."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2])) if m else None


def unsupported_reason(version: str) -> str | None:
    """Why this vLLM release cannot build BitNetForCausalLM, or None when it can."""
    rel = release(version)
    if rel is not None and rel < FIRST_VLLM:
        return (f"its Llama model predates the VllmConfig model API (vLLM "
                f"{'.'.join(map(str, FIRST_VLLM))}) that the BitNet model is built on")
    return None


def check_vllm(model_type: str | None, version: str) -> None:
    """Refuses a model_type "bitnet" checkpoint on a vLLM that cannot build the model. For
    callers that read config.json before vLLM does (`ternary serve`, validate): 0.6.x's
    transformers (4.45/4.46) does not know model_type "bitnet", so vLLM would stop at
    AutoConfig before it reaches the stand-in below."""
    why = unsupported_reason(version) if model_type == "bitnet" else None
    if why is not None:
        raise refusal(version, why)


def check_architecture(hf_config) -> None:
    """A bitnet checkpoint (quant_method "bitnet") must name an architecture the plugin
    serves for its model_type; raises naming it and those served otherwise."""
    model_type = getattr(hf_config, "model_type", None)
    archs = list(getattr(hf_config, "architectures", None) or [])
    served = SERVED_ARCHITECTURES.get(model_type)
    if served is not None and (not archs or any(a in served for a in archs)):
        return
    listing = ", ".join(f"{t}: {list(a)}" for t, a in SERVED_ARCHITECTURES.items())
    raise TernaryConfigError(
        f"config.json: a bitnet checkpoint with model_type={model_type!r} and architectures="
        f"{archs}; the ternary plugin serves bitnet weights in these architectures only "
        f"({listing}). Serve it with transformers, or convert it to one of those"
    )


class UnservedBitNet(torch.nn.Module):
    """Registered for BitNetForCausalLM where vLLM cannot build the model: vLLM constructs
    it before reading any weight, and it says why and which target to use. Its methods have
    the shape of a text-generation model (0.6.x's registry inspects them, and would refuse
    the architecture by task instead); none of them is ever called."""

    def __init__(self, *args, **kwargs):
        from ternary.vllm.version import vllm_version

        version = vllm_version()
        raise refusal(version, unsupported_reason(version) or "its API is too old")

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    compute_logits = sample = forward
