"""TernaryConfig: the vLLM QuantizationConfig for ternary checkpoints.

Module-level on purpose: vLLM pickles the config class into its engine processes.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from ternary.vllm import spec as spec_mod
from ternary.vllm.linear import SkippedLinearMethod, TernaryLinearMethod

NAME = "ternary"


class TernaryConfig(QuantizationConfig):
    """quant_method "ternary" (canonical v1) and "bitnet" checkpoints of Llama models."""

    def __init__(self, spec: spec_mod.QuantSpec):
        super().__init__()
        self.spec = spec
        # vLLM <= 0.6 never sets it; newer versions fill it from the model.
        self.packed_modules_mapping = getattr(self, "packed_modules_mapping", {}) or {}

    def __repr__(self) -> str:
        return f"TernaryConfig({self.spec})"

    @classmethod
    def get_name(cls) -> str:
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        # The reference and dequantize+cuBLAS kernels run on any CUDA GPU vLLM supports.
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # the spec lives in config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TernaryConfig:
        return cls(spec_mod.parse(dict(config)))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        """Claim transformers' `bitnet` checkpoints of Llama-architecture models."""
        if user_quant not in (None, NAME):
            return None
        model_type = getattr(hf_config, "model_type", None)
        if not spec_mod.claims_bitnet(dict(hf_quant_cfg), model_type):
            return None
        if hf_config is not None:  # an architecture we do not serve is named here
            from ternary.vllm.models import check_architecture

            check_architecture(hf_config)
        return NAME

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if not isinstance(layer, LinearBase):
            return None  # embeddings and lm_head (ParallelLMHead) stay unquantized
        if spec_mod.is_skipped(prefix, self.spec.modules_to_not_convert,
                               self.packed_modules_mapping):
            return SkippedLinearMethod()
        return TernaryLinearMethod(self.spec)

    def get_scaled_act_names(self) -> list[str]:
        return []  # vLLM <= 0.6 asks for it
