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

# The linear layers of a Llama-style decoder layer (model.layers.<i>.<module>), each as its
# weight's (N, K) in the layer's widths (llama_widths): hidden, inter (the MLP's width), q (the
# query heads') and kv (the key and value heads'). The one table of these shapes: the readers'
# checks (expected_shape), the test and benchmark model writers and tp-kernels use it.
LLAMA_PROJECTIONS: dict[str, tuple[str, str]] = {
    "self_attn.q_proj": ("q", "hidden"),
    "self_attn.k_proj": ("kv", "hidden"),
    "self_attn.v_proj": ("kv", "hidden"),
    "self_attn.o_proj": ("hidden", "q"),
    "mlp.gate_proj": ("inter", "hidden"),
    "mlp.up_proj": ("inter", "hidden"),
    "mlp.down_proj": ("hidden", "inter"),
}


def llama_widths(hidden_size: int, intermediate_size: int | None, num_attention_heads: int | None,
                 num_key_value_heads: int | None = None, head_dim: int | None = None
                 ) -> dict[str, int]:
    """The widths LLAMA_PROJECTIONS names, from config.json's sizes with transformers' defaults
    (num_key_value_heads: num_attention_heads; head_dim: hidden_size // num_attention_heads).
    num_attention_heads None leaves out the attention widths, intermediate_size None the MLP's
    (and so the projections they size)."""
    widths = {"hidden": hidden_size}
    if num_attention_heads is not None:
        head_dim = head_dim or hidden_size // num_attention_heads
        widths["q"] = num_attention_heads * head_dim
        widths["kv"] = (num_key_value_heads or num_attention_heads) * head_dim
    if intermediate_size is not None:
        widths["inter"] = intermediate_size
    return widths


def projection_shapes(widths: dict[str, int]) -> dict[str, tuple[int, int]]:
    """LLAMA_PROJECTIONS' module -> (N, K) for these widths (llama_widths), in the table's
    order; a projection sized by a width not given is left out."""
    return {module: (widths[n], widths[k]) for module, (n, k) in LLAMA_PROJECTIONS.items()
            if n in widths and k in widths}


def vllm_layer_shapes(widths: dict[str, int]) -> dict[str, tuple[int, int]]:
    """vLLM's linear layers of a Llama-style decoder layer -> (N, K), in order: the parts of a
    VLLM_FUSED layer stacked along N (self_attn.qkv_proj, mlp.gate_up_proj), the others as
    projection_shapes gives them (self_attn.o_proj, mlp.down_proj)."""
    fused_of = {part: fused for fused, parts in VLLM_FUSED.items() for part in parts}
    out: dict[str, tuple[int, int]] = {}
    for module, (n, k) in projection_shapes(widths).items():
        parent, _, proj = module.rpartition(".")
        layer = f"{parent}.{fused_of.get(proj, proj)}"
        out[layer] = (out.get(layer, (0, k))[0] + n, k)
    return out


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
    why = {"self_attn": f"hidden_size={hidden}, num_attention_heads={heads}, "
                        f"num_key_value_heads={kv}, head_dim={head_dim}",
           "mlp": f"hidden_size={hidden}, {inter_key}={inter}"}
    widths = llama_widths(hidden, inter, heads if attention else None, kv, head_dim)
    for module, shape in projection_shapes(widths).items():
        block, _, proj = module.partition(".")
        if proj == parts[-1]:
            return shape, why[block]
    return None
