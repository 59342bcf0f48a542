"""What a checkpoint's `quantization_config` says, parsed and checked without vLLM.

Two on-disk formats reach the same linear method (docs/formats.md):
- "ternary" (canonical): uint8 [N, K/4] packed along K, scale per channel, tensor or group;
- "bitnet" (transformers): uint8 [ceil(N/4), K] packed along N in four row blocks, one bf16
  scale per tensor that "bitlinear" divides by and "autobitlinear" multiplies by.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ternary.formats import bitnet, canonical

# Each format's module states its layout and checks its quantization_config
# (config_problems); this module only turns the first problem into a refusal.

# Llama-architecture model types whose vLLM implementation is a plain Llama with
# q/k/v/o and gate/up/down projections; bitnet weights in other architectures (model_type
# "bitnet" has extra sub-norms) are not served by this plugin.
LLAMA_MODEL_TYPES = ("llama",)
# model types whose bitnet checkpoints the plugin serves: Llama-architecture ones through
# vLLM's Llama, "bitnet" (BitNetForCausalLM: sub-norms, relu2) through ternary.vllm.models
SERVED_MODEL_TYPES = (*LLAMA_MODEL_TYPES, "bitnet")


class TernaryConfigError(ValueError):
    """A quantization_config or model shape the ternary vLLM method cannot serve."""


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    format: str  # "ternary" | "bitnet"
    scale: str  # "channel" | "tensor" | "group"; bitnet is "tensor"
    group_size: int | None
    modules_to_not_convert: tuple[str, ...]
    bitnet_linear_class: str | None = None  # bitnet only
    # "none" (float activations, W1.58A16) or "int8_per_token" (W1.58A8, as transformers'
    # bitnet layers): canonical quantization_config.activation; every bitnet checkpoint is A8
    activation: str = "none"
    # bitnet "online" (autobitlinear): dense float master weights, quantized once at load
    # exactly as transformers' WeightQuant does in every forward
    online: bool = False

    @property
    def kernel_group_size(self) -> int:
        """group_size as the ternary ops take it (0: channel or tensor scale, expanded per
        output channel at load time)."""
        return self.group_size if self.scale == "group" else 0


def parse(cfg: dict[str, Any], source: str = "config.json quantization_config") -> QuantSpec:
    """Checks a quantization_config dict (canonical ternary v1 or bitnet) and returns its spec."""
    method = cfg.get("quant_method")
    skip = tuple(cfg.get("modules_to_not_convert") or ())
    checker = {"ternary": canonical.config_problems, "bitnet": bitnet.config_problems}.get(method)
    if checker is not None:
        problems = checker(cfg)
        if problems:
            what, fix = problems[0]
            raise TernaryConfigError(f"{source}: {what}; {fix}")
    if method == "ternary":
        scale = cfg.get("scale", "channel")
        return QuantSpec("ternary", scale, cfg.get("group_size") if scale == "group" else None,
                         skip, activation=_activation(canonical.activation(cfg)))
    if method == "bitnet":
        return QuantSpec("bitnet", "tensor", None, skip, bitnet.linear_class(cfg),
                         activation=_activation(bitnet.ACTIVATION), online=bitnet.is_online(cfg))
    raise TernaryConfigError(
        f"{source}: quant_method={method!r}; the ternary vLLM method reads 'ternary' "
        f"(canonical) and 'bitnet' checkpoints only"
    )


# A diagnostic switch (docs/formats.md): serve as if the checkpoint said activation "none", to
# measure what activation quantization changes. Tokens then differ from the model's own.
ACTIVATION_OVERRIDE_ENV = "TERNARY_ACTIVATION_OVERRIDE"  # ternary.settings


def _activation(stated: str) -> str:
    from ternary import settings

    forced = settings.raw(ACTIVATION_OVERRIDE_ENV).strip()
    if not forced:
        return stated
    if forced not in canonical.ACTIVATIONS:
        raise TernaryConfigError(f"{ACTIVATION_OVERRIDE_ENV}={forced!r}; expected one of "
                                 f"{list(canonical.ACTIVATIONS)}, or unset it")
    return forced


def claims_bitnet(cfg: dict[str, Any], model_type: str | None) -> bool:
    """Whether a bitnet checkpoint of this model type is ours to serve. Raises for bitnet
    checkpoints of architectures we cannot serve, so the user sees why instead of vLLM's
    'unknown quantization method'."""
    if cfg.get("quant_method") != "bitnet":
        return False
    if model_type is not None and model_type not in SERVED_MODEL_TYPES:
        raise TernaryConfigError(
            f"config.json: a bitnet checkpoint with model_type={model_type!r}; the ternary "
            f"plugin serves bitnet weights in Llama-architecture models and BitNetForCausalLM "
            f"only (model_type in {list(SERVED_MODEL_TYPES)})"
        )
    return True


def module_matches(prefix: str, entry: str) -> bool:
    """Whether `entry` of modules_to_not_convert names module `prefix`: its dotted parts
    appear as a contiguous run of prefix's parts ("lm_head" matches "lm_head",
    "self_attn.o_proj" matches "model.layers.3.self_attn.o_proj", "proj" matches nothing)."""
    p, e = prefix.split("."), entry.split(".")
    return any(p[i:i + len(e)] == e for i in range(len(p) - len(e) + 1))


def is_skipped(prefix: str, skip: tuple[str, ...], packed_modules: dict[str, list[str]]) -> bool:
    """Whether the module at `prefix` stays unquantized. A module vLLM fuses (qkv_proj from
    q/k/v_proj) is skipped only when all its parts are; a partial listing is an error."""
    if not skip:
        return False
    head, _, last = prefix.rpartition(".")
    parts = packed_modules.get(last)
    if not parts:
        return any(module_matches(prefix, e) for e in skip)
    names = [f"{head}.{p}" if head else p for p in parts]
    flags = [any(module_matches(n, e) for e in skip) for n in names]
    if any(flags) and not all(flags):
        listed = [n for n, f in zip(names, flags) if f]
        missing = [n for n, f in zip(names, flags) if not f]
        raise TernaryConfigError(
            f"modules_to_not_convert lists {listed} but not {missing}, which vLLM fuses into "
            f"one layer {prefix!r}; list all of them or none"
        )
    return all(flags)
