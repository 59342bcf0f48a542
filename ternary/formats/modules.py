"""Which modules of a Llama-style model are quantized linear layers, and the [N, K] shape
config.json implies for each (so a tensor whose shape contradicts config.json is caught)."""

from __future__ import annotations

import re

# The projections of Llama-style decoder layers (Llama, Mistral, Qwen2, BitNet, Falcon3).
_PROJ = re.compile(r"(^|\.)[a-z_]*_proj$")
_LINEAR_PARENTS = ("mlp", "self_attn", "attention", "attn", "feed_forward")
_NEVER = ("lm_head", "embed", "norm", "wte", "wpe")


def not_converted(name: str, modules_to_not_convert: list[str] | None) -> bool:
    """transformers' rule: an entry matches a module of that name or anything inside it."""
    for key in modules_to_not_convert or ():
        if f".{key}." in f".{name}.":
            return True
    return False


# Modules that vLLM's Llama-style models load as one layer (their packed_modules_mapping):
# a layer is kept dense only as a whole, so modules_to_not_convert lists all its parts or none.
VLLM_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def split_fused_layers(names: list[str], modules_to_not_convert: list[str] | None
                       ) -> list[tuple[str, list[str], list[str]]]:
    """(fused layer, listed parts, unlisted parts) for every layer of VLLM_FUSED whose parts
    among `names` modules_to_not_convert lists only in part (vLLM refuses to load those)."""
    present, out = set(names), []
    for head, fused, parts in sorted({(n.rpartition(".")[0], f, ps) for n in names
                                      for f, ps in VLLM_FUSED.items()
                                      if n.rpartition(".")[2] in ps}):
        members = [f"{head}.{p}" if head else p for p in parts]
        members = [x for x in members if x in present]
        listed = [x for x in members if not_converted(x, modules_to_not_convert)]
        if listed and len(listed) < len(members):
            out.append((f"{head}.{fused}" if head else fused, listed,
                        [x for x in members if x not in listed]))
    return out


def is_linear(name: str, shape: list[int], modules_to_not_convert: list[str] | None) -> bool:
    """True for a dense [N, K] `name.weight` that the dense converter quantizes: *_proj
    layers and the linear layers inside mlp/attention blocks, never lm_head, embeddings,
    norms or modules_to_not_convert."""
    if len(shape) != 2 or not_converted(name, modules_to_not_convert):
        return False
    parts = name.split(".")
    if any(bad in part for part in parts for bad in _NEVER):
        return False
    return bool(_PROJ.search(name)) or any(p in _LINEAR_PARENTS for p in parts[:-1])


# module name parts of multimodal checkpoints' other encoders and their projectors
_OTHER_TOWERS = ("vision", "visual", "audio", "image", "multi_modal", "mm_projector")


def expected_shape(config: dict, name: str) -> tuple[tuple[int, int], str] | None:
    """[N, K] that config.json gives a Llama-style projection, with the config values used
    (for the error message); None where config.json does not determine it. Inside a
    mixture of experts the MLP width is moe_intermediate_size (experts.i) or
    shared_expert_intermediate_size (Qwen2-MoE's shared_expert), never intermediate_size.
    A size that is present but not a positive integer (a per-layer list, 0 for "none",
    anything malformed) leaves the projections it sizes unchecked."""
    text = config.get("text_config") or config
    unusable = object()

    def size(key: str):
        v = text.get(key)
        if v is None:
            return None
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else unusable

    hidden, heads = size("hidden_size"), size("num_attention_heads")
    kv, head_dim = size("num_key_value_heads"), size("head_dim")
    if hidden in (None, unusable) or heads in (None, unusable):
        return None
    parts = name.split(".")
    if any(tower in part for part in parts for tower in _OTHER_TOWERS):
        return None  # a vision / audio encoder: the text config's sizes are not its own
    # multi-head latent attention (DeepSeek-V2/V3, Kimi): q / kv go through low-rank
    # projections whose widths config.json gives in other terms
    attention = kv is not unusable and head_dim is not unusable and "kv_lora_rank" not in text
    kv = kv or heads
    head_dim = head_dim or hidden // heads
    if "experts" in parts:
        inter_key = "moe_intermediate_size"
    elif "shared_expert" in parts:
        inter_key = "shared_expert_intermediate_size"
    elif any(p.startswith("shared_expert") or p.endswith("experts") for p in parts):
        inter_key = None  # DeepSeek's shared_experts and the like: a width config.json
        # gives only as a product of other values
    else:
        inter_key = "intermediate_size"
    inter = size(inter_key) if inter_key else None
    if inter is unusable:
        inter = None
    last = parts[-1]
    why_attn = (f"hidden_size={hidden}, num_attention_heads={heads}, "
                f"num_key_value_heads={kv}, head_dim={head_dim}")
    table = {
        "q_proj": ((heads * head_dim, hidden), why_attn),
        "k_proj": ((kv * head_dim, hidden), why_attn),
        "v_proj": ((kv * head_dim, hidden), why_attn),
        "o_proj": ((hidden, heads * head_dim), why_attn),
    } if attention else {}
    if inter is not None:
        why_mlp = f"hidden_size={hidden}, {inter_key}={inter}"
        table.update({
            "gate_proj": ((inter, hidden), why_mlp),
            "up_proj": ((inter, hidden), why_mlp),
            "down_proj": ((hidden, inter), why_mlp),
        })
    return table.get(last)
