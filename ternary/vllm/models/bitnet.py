"""BitNetForCausalLM (BitNet b1.58: microsoft/bitnet-b1.58-2B-4T) on vLLM's Llama.

transformers' BitNet is Llama with two more RMSNorms and the config's activation
(transformers/models/bitnet/modular_bitnet.py):
- attn_sub_norm over the attention output (num_heads * head_dim), before o_proj;
- ffn_sub_norm over act(gate) * up (intermediate_size), before down_proj;
- hidden_act from the config (relu2 = relu(x)**2 in 2B-4T), tied embeddings.
The linear layers are vLLM's (fused qkv_proj / gate_up_proj, one bitnet weight_scale per
shard, loaded by the ternary quantization method); everything else is vLLM's Llama,
subclassed, so each vLLM release builds it with its own attention, RoPE and loaders.

Tensor parallelism splits both sub-normed dimensions across the ranks (heads, intermediate),
so SplitRMSNorm takes the mean square over the whole dimension: local sum of squares,
all-reduced over the TP group.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.activation import get_act_fn
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
)
from vllm.model_executor.utils import set_weight_attrs

from ternary.vllm.models import refusal

# what this file needs of vLLM's Llama (0.26.0, 0.32.0 and 0.33.0 have all of it)
_NEEDED = ((LlamaForCausalLM, "layer_type"), (LlamaDecoderLayer, "attn_layer_type"),
           (LlamaDecoderLayer, "config"))


def _check_llama_api() -> None:
    missing = [f"{cls.__name__}({arg}=...)" for cls, arg in _NEEDED
               if arg not in inspect.signature(cls.__init__).parameters]
    if not hasattr(LlamaDecoderLayer, "get_quant_config"):
        missing.append("LlamaDecoderLayer.get_quant_config")
    if missing:
        from ternary.vllm.version import vllm_version

        raise refusal(vllm_version(), f"its Llama model has no {', '.join(missing)} to "
                                      f"build BitNet's layers with")


class SplitRMSNorm(nn.Module):
    """transformers' RMSNorm over a dimension of `size` channels that tensor parallelism
    splits evenly across the ranks: each rank holds its slice of the weight (loaded from the
    whole checkpoint tensor) and normalizes its slice of x by the RMS of the whole row."""

    def __init__(self, size: int, eps: float, name: str):
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        if size % self.tp_size:
            raise ValueError(f"{name}: {size} channels do not split across tensor parallel "
                             f"{self.tp_size}; use a tensor_parallel_size that divides {size}")
        self.size, self.eps, self.name = size, eps, name
        self.weight = nn.Parameter(torch.ones(size // self.tp_size))
        set_weight_attrs(self.weight, {"weight_loader": self.weight_loader})

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if tuple(loaded.shape) != (self.size,):
            raise ValueError(f"{self.name}.weight: the checkpoint tensor is "
                             f"{list(loaded.shape)}, the model's norm (config.json) has "
                             f"{self.size} channels; the checkpoint does not match config.json")
        n = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.tp_rank * n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.to(torch.float32)
        if self.tp_size == 1:
            var = xf.pow(2).mean(-1, keepdim=True)  # transformers' arithmetic, exactly
        else:
            var = tensor_model_parallel_all_reduce(xf.pow(2).sum(-1, keepdim=True)) / self.size
        # as transformers' LlamaRMSNorm: normalize in float32, round, then scale
        return self.weight * (xf * torch.rsqrt(var + self.eps)).to(dtype)


class BitNetMLP(LlamaMLP):
    """Gated MLP with the config's activation and ffn_sub_norm before down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str,
                 rms_norm_eps: float, prefix: str = "", **kwargs):
        # LlamaMLP builds gate_up_proj / down_proj but accepts silu only (its fused SiluAndMul)
        super().__init__(hidden_size, intermediate_size, "silu", prefix=prefix, **kwargs)
        self.act_fn = get_act_fn(hidden_act)  # relu2 and the rest of vLLM's registry
        self.ffn_sub_norm = SplitRMSNorm(intermediate_size, rms_norm_eps, f"{prefix}.ffn_sub_norm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        x, _ = self.down_proj(self.ffn_sub_norm(self.act_fn(gate) * up))
        return x


class BitNetAttention(LlamaAttention):
    """Llama attention with attn_sub_norm on its output, before o_proj."""

    def __init__(self, config, **kwargs):
        super().__init__(config=config, **kwargs)
        self.attn_sub_norm = SplitRMSNorm(self.total_num_heads * self.head_dim,
                                          config.rms_norm_eps,
                                          f"{kwargs.get('prefix', '')}.attn_sub_norm")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn_sub_norm(self.attn(q, k, v)))
        return output


class BitNetDecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config, prefix: str = "", config=None, **kwargs):
        config = config or vllm_config.model_config.hf_config
        # Llama's layer would refuse relu2 in its LlamaMLP: it is built from a copy of the
        # config that says silu, and its MLP replaced by BitNet's (a few MB, freed at once).
        llama_view = copy.copy(config)
        llama_view.hidden_act = "silu"
        kwargs.setdefault("attn_layer_type", BitNetAttention)
        super().__init__(vllm_config=vllm_config, prefix=prefix, config=llama_view, **kwargs)
        self.mlp = BitNetMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                             config.rms_norm_eps, prefix=f"{prefix}.mlp",
                             quant_config=self.get_quant_config(vllm_config),
                             bias=getattr(config, "mlp_bias", False))


class BitNetForCausalLM(LlamaForCausalLM):
    """Weights as transformers names them (model.layers.i.self_attn.attn_sub_norm.weight,
    model.layers.i.mlp.ffn_sub_norm.weight); q/k/v and gate/up fused as in Llama
    (packed_modules_mapping), lm_head tied to embed_tokens when the config says so."""

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        _check_llama_api()
        kwargs.setdefault("layer_type", BitNetDecoderLayer)
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
