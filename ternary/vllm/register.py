"""Register TernaryConfig with whichever vLLM is installed.

- vLLM >= 0.7: `register_quantization_config(name)(cls)`; 0.7/0.8 raise on a second
  registration, so an existing one is left alone.
- vLLM 0.6.x: no registration API; QUANTIZATION_METHODS is a dict that the engine,
  `get_quantization_config` and the `--quantization` argparse choices read, so it is
  mutated in place (other modules hold references to the same dict). On 0.6.x this must
  run before vLLM builds its argument parser; `ternary serve` does that.

It also registers BitNetForCausalLM (ternary.vllm.models) with vLLM's out-of-tree model
registry, by its import string so that nothing of the model is imported until vLLM builds
it; where vLLM cannot build it (0.6.x) a stand-in that refuses, naming a target that can.
"""

from __future__ import annotations

from ternary.vllm import version


def register() -> str:
    """Makes quant_method "ternary" and BitNetForCausalLM known to vLLM; returns how the
    quantization method was registered ("api", "dict" or "already")."""
    how = _register_quantization()
    register_models()
    return how


def register_models() -> str:
    """Registers BitNetForCausalLM; returns what ("bitnet", or "refusal" where this vLLM
    cannot build it)."""
    from vllm import ModelRegistry

    from ternary.vllm import models

    if models.unsupported_reason(version.vllm_version()) is not None:
        # a class (light: torch.nn only) that every release's registry takes
        ModelRegistry.register_model(models.BITNET_ARCH, models.UnservedBitNet)
        return "refusal"
    ModelRegistry.register_model(models.BITNET_ARCH, models.BITNET_CLASS)
    return "bitnet"


def _register_quantization() -> str:
    from vllm.model_executor.layers import quantization as q

    from ternary.vllm.config import NAME, TernaryConfig

    methods = q.QUANTIZATION_METHODS
    if isinstance(methods, dict):  # vLLM 0.6.x
        if methods.get(NAME) is TernaryConfig:
            return "already"
        methods[NAME] = TernaryConfig
        _allow_on_platform(NAME)
        return "dict"
    api = getattr(q, "register_quantization_config", None)
    if api is None:
        raise RuntimeError(
            f"vLLM {version.vllm_version()}: QUANTIZATION_METHODS is a {type(methods).__name__} and "
            f"there is no register_quantization_config; this vLLM is not supported by "
            f"vllm-ternary (supported: 0.6.x and >= 0.7 with the registration API)"
        )
    custom = getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {})
    if NAME in methods and custom.get(NAME) is TernaryConfig:
        return "already"
    api(NAME)(TernaryConfig)
    return "api"


def _allow_on_platform(name: str) -> None:
    """0.6.x platforms with a non-empty supported_quantization list refuse other methods."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return
    supported = getattr(current_platform, "supported_quantization", None)
    if supported and name not in supported:
        supported.append(name)
