"""Tiny Llama-style checkpoints in every format, for tests and smoke runs (the vLLM plugin's
tests build models with these too). Everything is seeded and small: a model is a few
hundred KB and writes in milliseconds.

    write_dense(dir), write_canonical(dir), write_bitnet(dir), write_vendor_int8(dir)

each returns the model directory and writes config.json, the weights (sharded when
max_shard_bytes is small) and a tokenizer-like side file that conversion must copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ternary.formats import bitnet, canonical, vendor_int8
from ternary.formats.files import CONFIG, ShardWriter
from ternary.formats.modules import LLAMA_PROJECTIONS, expected_shape


def llama_config(hidden_size: int = 32, intermediate_size: int = 64, num_hidden_layers: int = 2,
                 num_attention_heads: int = 4, num_key_value_heads: int = 2,
                 head_dim: int | None = None, vocab_size: int = 64, **extra) -> dict:
    """A Llama config.json; head_dim=6 with 1 KV head gives k/v_proj N=6 (not a multiple of
    4) while every K stays a multiple of 4."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": hidden_size, "intermediate_size": intermediate_size,
           "num_hidden_layers": num_hidden_layers, "num_attention_heads": num_attention_heads,
           "num_key_value_heads": num_key_value_heads, "vocab_size": vocab_size,
           "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
           "hidden_act": "silu", "tie_word_embeddings": False}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(extra)
    return cfg


def linear_names(config: dict) -> list[str]:
    return [f"model.layers.{i}.{p}" for i in range(config["num_hidden_layers"])
            for p in LLAMA_PROJECTIONS]


def random_codes(n: int, k: int, gen: torch.Generator, zero_fraction: float = 0.5) -> torch.Tensor:
    """int8 [n, k] in {-1, 0, 1}: zero with zero_fraction, else +-1 with equal odds (the
    sign symmetry vendor-int8 code-map detection relies on)."""
    u = torch.rand(n, k, generator=gen)
    sign = torch.where(torch.rand(n, k, generator=gen) < 0.5, -1, 1)
    return torch.where(u < zero_fraction, 0, sign).to(torch.int8)


def _other_tensors(config: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, v = config["hidden_size"], config["vocab_size"]
    out = {"model.embed_tokens.weight": torch.randn(v, h, generator=gen) * 0.02,
           "model.norm.weight": torch.ones(h),
           "lm_head.weight": torch.randn(v, h, generator=gen) * 0.02}
    for i in range(config["num_hidden_layers"]):
        out[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(h)
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(h)
    return out


def write_model(model_dir: str | os.PathLike, config: dict, tensors: dict[str, torch.Tensor],
                max_shard_bytes: int = 2 << 30) -> Path:
    """config.json, the tensors (in order, sharded at max_shard_bytes) and tokenizer.json."""
    d = Path(model_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / CONFIG).write_text(json.dumps(config, indent=2))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "tiny"}}))
    w = ShardWriter(d, max_shard_bytes)
    for name, t in tensors.items():
        w.add(name, t)
    w.close()
    return d


def _shape(config: dict, name: str) -> tuple[int, int]:
    return expected_shape(config, name)[0]


def write_dense(model_dir, config: dict | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32, zero_rows: bool = True,
                max_shard_bytes: int = 2 << 30) -> Path:
    """Random dense weights; with zero_rows, row 0 of every down_proj is all zeros."""
    config = config or llama_config()
    gen = torch.Generator().manual_seed(seed)
    tensors = _other_tensors(config, gen)
    for name in linear_names(config):
        w = torch.randn(*_shape(config, name), generator=gen) * 0.05
        if zero_rows and name.endswith("down_proj"):
            w[0] = 0
        tensors[f"{name}.weight"] = w
    config = {**config, "torch_dtype": str(dtype).removeprefix("torch.")}
    return write_model(model_dir, config, {k: t.to(dtype) for k, t in tensors.items()},
                       max_shard_bytes)


def write_canonical(model_dir, config: dict | None = None, seed: int = 0, scale: str = "channel",
                    group_size: int | None = None, max_shard_bytes: int = 2 << 30,
                    activation: str = "none") -> Path:
    config = config or llama_config()
    gen = torch.Generator().manual_seed(seed)
    tensors = _other_tensors(config, gen)
    for name in linear_names(config):
        n, k = _shape(config, name)
        shape = {"channel": (n,), "tensor": (1,)}.get(scale) or (n, -(-k // group_size))
        s = torch.rand(*shape, generator=gen) * 0.1 + 0.01
        for suffix, t in canonical.encode(random_codes(n, k, gen), s).items():
            tensors[f"{name}.{suffix}"] = t
    config = {**config, "quantization_config": canonical.quantization_config(
        scale, group_size, [], activation)}
    return write_model(model_dir, config, tensors, max_shard_bytes)


def write_bitnet(model_dir, config: dict | None = None, seed: int = 0,
                 linear_class: str | None = "bitlinear", max_shard_bytes: int = 2 << 30) -> Path:
    """linear_class None leaves it out of config.json (transformers' default: bitlinear)."""
    config = config or llama_config()
    gen = torch.Generator().manual_seed(seed)
    tensors = _other_tensors(config, gen)
    for name in linear_names(config):
        n, k = _shape(config, name)
        value = float(torch.rand((), generator=gen) * 4 + 0.5)
        for suffix, t in bitnet.encode(random_codes(n, k, gen), value).items():
            tensors[f"{name}.{suffix}"] = t
    qc = {"quant_method": "bitnet", "quantization_mode": "offline",
          "modules_to_not_convert": None}
    if linear_class is not None:
        qc["linear_class"] = linear_class
    return write_model(model_dir, {**config, "quantization_config": qc}, tensors,
                       max_shard_bytes)


def write_bitnet_online(model_dir, config: dict | None = None, seed: int = 0,
                        dtype: torch.dtype = torch.bfloat16) -> Path:
    """A bitnet checkpoint in quantization_mode "online" (autobitlinear): dense master
    weights, as microsoft/bitnet-b1.58-2B-4T-bf16 stores them."""
    path = write_dense(model_dir, config, seed, dtype=dtype, zero_rows=False)
    edit_config(path, quantization_config={"quant_method": "bitnet",
                                           "linear_class": "autobitlinear",
                                           "quantization_mode": "online"})
    return path


def write_vendor_int8(model_dir, config: dict | None = None, seed: int = 0,
                      code_map: str = "neg-zero-pos", group_size: int | None = None,
                      stored_group_size: int | None = None, stated_group_size: int | None = None,
                      stated_code_map: str | None = None, zero_fraction: float = 0.5,
                      max_shard_bytes: int = 2 << 30) -> Path:
    """Real scales per `group_size` (None: per channel), stored with one column per
    `stored_group_size` positions (repeating each real scale; None: as real), and
    config.json stating `stated_group_size` (which may be wrong)."""
    config = config or llama_config()
    gen = torch.Generator().manual_seed(seed)
    tensors = _other_tensors(config, gen)
    for name in linear_names(config):
        n, k = _shape(config, name)
        if group_size is None:
            s = torch.rand(n, generator=gen) * 0.1 + 0.01
        else:
            s = torch.rand(n, -(-k // group_size), generator=gen) * 0.1 + 0.01
            if stored_group_size is not None:
                starts = torch.arange(-(-k // stored_group_size)) * stored_group_size // group_size
                s = s[:, starts]
        codes = random_codes(n, k, gen, zero_fraction)
        for suffix, t in vendor_int8.encode(codes, s, code_map).items():
            tensors[f"{name}.{suffix}"] = t
    qc = {"quant_method": "vendor-int8"}
    if stated_group_size is not None:
        qc["group_size"] = stated_group_size
    if stated_code_map is not None:
        qc["code_map"] = stated_code_map
    return write_model(model_dir, {**config, "quantization_config": qc}, tensors,
                       max_shard_bytes)


def rewrite_tensors(model_dir: str | os.PathLike, changes: dict[str, torch.Tensor | None]
                    ) -> None:
    """Replace (or, with None, delete) tensors of a tiny model in place, for building
    malformed checkpoints. Loads everything: tiny models only."""
    from safetensors.torch import load_file, save_file

    d = Path(model_dir)
    for shard in sorted(d.glob("*.safetensors")):
        tensors = load_file(str(shard))
        touched = False
        for name, t in changes.items():
            if name in tensors:
                touched = True
                if t is None:
                    del tensors[name]
                else:
                    tensors[name] = t
        if touched:
            save_file(tensors, str(shard), metadata={"format": "pt"})
    index = d / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        for name, t in changes.items():
            if t is None:
                data["weight_map"].pop(name, None)
        index.write_text(json.dumps(data, indent=2))


def edit_config(model_dir: str | os.PathLike, **changes) -> dict:
    """Update config.json keys (None deletes one); returns the new config."""
    path = Path(model_dir) / CONFIG
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))
    return config


def load_tensor(model_dir: str | os.PathLike, name: str) -> torch.Tensor:
    """One tensor of a model directory (a copy, safe to modify)."""
    from ternary.formats.files import ModelFiles

    with ModelFiles(model_dir) as files:
        return files.get(name).clone()
