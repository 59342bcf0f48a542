"""A tiny deterministic ternary model, for tests and smoke tests without downloads.

Llama architecture (vLLM's and transformers' own implementation), or BitNetForCausalLM in
the layout of microsoft/bitnet-b1.58-2B-4T (arch "bitnet": sub-norms, relu2, tied
embeddings, autobitlinear); shapes chosen so that vLLM's CPU attention accepts them
(head_dim 32) and every K is a multiple of 4; a byte-level BPE tokenizer trained offline on
the text below; weights drawn from a seeded generator and absmean-quantized, so the same
arguments always write the same bytes.

The RMSNorm weights carry a few outlier channels, as trained models' do: they dominate each
token's int8 activation scale, so serving a bitnet checkpoint with float activations
instead of its int8 ones changes greedy tokens (a check that compares tokens can fail).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from ternary.formats import bitnet, canonical
from ternary.formats.modules import llama_widths, projection_shapes

SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention, as in Llama 3
    "head_dim": 32,
    "max_position_embeddings": 512,
}
VOCAB_SIZE = 384
FORMATS = ("ternary", "bitnet")
ARCHS = ("llama", "bitnet")
# outlier channels per RMSNorm weight and their range (trained BitNet and Llama norms have a
# handful of channels tens of times the rest)
OUTLIERS, OUTLIER_RANGE = 4, (20.0, 40.0)
SCALES = canonical.SCALE_MODES
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
# A ChatML-like template, so the OpenAI chat endpoint works on the tiny model.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEXT = """\
The quick brown fox jumps over the lazy dog. A ternary weight is minus one, zero or plus one,
times a scale. Four weights fit in one byte, so a large language model shrinks to a fraction
of its size in half precision. The kernel reads the packed bytes, unpacks the codes and adds
or subtracts the activations. Hello, world! How are you today? I am fine, thank you.
Once upon a time there was a small model that could only say a few words, but it said them
the same way every time. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Servers answer requests;
clients send prompts and read tokens back, one at a time or all at once.
"""


def _dims(s: dict[str, int] = SHAPE) -> dict[str, int]:
    """The layer widths (ternary.formats.modules.llama_widths) of a shape like SHAPE."""
    return llama_widths(s["hidden_size"], s["intermediate_size"], s["num_attention_heads"],
                        s["num_key_value_heads"], s["head_dim"])


def train_tokenizer(out: Path, vocab_size: int = VOCAB_SIZE,
                    max_length: int | None = None) -> int:
    """Trains the byte-level BPE tokenizer and writes tokenizer.json and
    tokenizer_config.json; returns the vocabulary size. A `vocab_size` larger than the
    text gives merges for (a served model of a real shape) is filled with added tokens
    "<|tN|>", so every id the model can emit decodes."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, VOCAB_SIZE),
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    have = tok.get_vocab_size()
    if vocab_size > have:
        tok.add_tokens([AddedToken(f"<|t{i}|>", normalized=False)
                        for i in range(have, vocab_size)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": max_length or SHAPE["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    return tok.get_vocab_size()


def _absmean(w: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """BitNet b1.58 absmean quantization along `dim` (None: whole tensor)."""
    s = w.abs().mean() if dim is None else w.abs().mean(dim=dim, keepdim=True)
    s = s.clamp(min=1e-8)
    return (w / s).round().clamp(-1, 1).to(torch.int8), s.to(torch.float32)


INDEX_NAME = "model.safetensors.index.json"


def _with_outliers(w: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """`w` with OUTLIERS channels set to values in OUTLIER_RANGE (drawn from `g`, a generator
    of their own, so every other tensor is what it was without outliers)."""
    idx = torch.randperm(w.numel(), generator=g)[:OUTLIERS]
    lo, hi = OUTLIER_RANGE
    w = w.clone()
    w[idx] = lo + (hi - lo) * torch.rand(OUTLIERS, generator=g)
    return w


def make(out: Path, fmt: str | None = None, scale: str = "channel", group_size: int = 32,
         seed: int = 0, intermediate_size: int | None = None, *, arch: str = "llama",
         online: bool = False, outliers: bool = True) -> Path:
    """Writes the tiny model to `out` and returns it. `intermediate_size` replaces the MLP
    width (a multiple of 4), e.g. to write a model whose down_proj K does not split into
    packed bytes across tensor-parallel ranks. `arch` "bitnet" writes BitNetForCausalLM as
    2B-4T stores it (format bitnet, linear_class autobitlinear); `online` stores the dense
    float master weights instead of packed ones (quantization_mode "online", as 2B-4T's
    -bf16 variant), which the bitnet format's autobitlinear quantizes when loading. `fmt`
    defaults to "ternary" for Llama, "bitnet" for BitNet. `outliers` False: norm weights
    without outlier channels (a model whose int8 activations are not dominated by a few
    channels: its bf16 tokens stay near its float32 ones, see ternary.tools.smoke)."""
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {list(ARCHS)}")
    fmt = fmt or ("bitnet" if arch == "bitnet" or online else "ternary")
    if arch == "bitnet" and fmt != "bitnet":
        raise ValueError(f"arch 'bitnet' is written in the bitnet format, as 2B-4T is; "
                         f"format={fmt!r} applies to arch 'llama' only")
    if online and fmt != "bitnet":
        raise ValueError(f"online (dense master weights, quantization_mode 'online') is a "
                         f"mode of the bitnet format; format={fmt!r} stores packed weights")
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {list(FORMATS)}")
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {list(SCALES)}")
    if fmt == "bitnet" and scale != "channel":
        raise ValueError(f"the bitnet format has one scale per tensor; scale={scale!r} "
                         f"applies to the ternary format only")
    shape = dict(SHAPE)
    if intermediate_size is not None:
        if intermediate_size <= 0 or intermediate_size % 4:
            raise ValueError(f"intermediate_size={intermediate_size} must be a positive "
                             f"multiple of 4 (the canonical packing holds 4 codes a byte)")
        shape["intermediate_size"] = intermediate_size
    ks = (shape["hidden_size"], shape["intermediate_size"])
    if scale == "group" and (group_size <= 0 or any(k % group_size for k in ks)):
        raise ValueError(f"group_size={group_size} must be positive and divide the tiny "
                         f"model's K values {ks}")
    # shards or an index another model left there would mix with these weights; deleting
    # them could destroy a real model the path named by mistake, so refuse instead
    others = sorted(p.name for p in [*out.glob("*.safetensors"), out / INDEX_NAME]
                    if p.exists() and p.name != "model.safetensors") if out.is_dir() else []
    if others:
        raise ValueError(f"{out} holds another model's weights ({', '.join(others[:3])}"
                         f"{', ...' if len(others) > 3 else ''}); choose an empty directory")
    from ternary._build.staging import remove_stale_temp_dirs, temp_dir_for

    for msg in remove_stale_temp_dirs(out, "making"):  # of a make-tiny killed half-way
        print(f"make-tiny: {msg}", file=sys.stderr)
    final, out = out, temp_dir_for(out, "making")
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write(out, fmt, scale, group_size, seed, shape, arch, online, outliers)
        _install(out, final)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return final


def _install(tmp: Path, final: Path) -> None:
    """`tmp` becomes `final` by renames: an earlier make-tiny model there (only files this
    writer writes) is moved aside first and removed after, so `final` never holds a mix."""
    if final.exists():
        extra = sorted({p.name for p in final.iterdir()} - {p.name for p in tmp.iterdir()})
        if extra:
            raise ValueError(f"{final} holds files make-tiny does not write ({', '.join(extra[:3])}"
                             f"{', ...' if len(extra) > 3 else ''}); choose an empty directory")
        old = final.with_name(tmp.name.replace(".making-", ".replaced-"))
        final.replace(old)
        tmp.replace(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.replace(final)


def _write(out: Path, fmt: str, scale: str, group_size: int, seed: int, shape: dict,
           arch: str, online: bool, outliers: bool = True) -> None:
    from safetensors.torch import save_file

    from ternary.formats.files import test_pause

    out.mkdir(parents=True)
    vocab = train_tokenizer(out)
    d = _dims(shape)
    g = torch.Generator().manual_seed(seed)
    g_out = torch.Generator().manual_seed(seed + 1)  # outliers: other tensors stay as they were
    # 2B-4T: autobitlinear multiplies by the stored scale; the Llama bitnet model keeps
    # transformers' default bitlinear, which divides by it
    autobit = arch == "bitnet" or online

    def randn(*shape, std):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    def norm(n):
        w = 1.0 + randn(n, std=0.1)
        return _with_outliers(w, g_out) if outliers else w

    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": randn(vocab, d["hidden"], std=1.0),
        "model.norm.weight": torch.ones(d["hidden"]),
    }
    # Sharp logits keep greedy decoding far from ties, so implementations agree. (Drawn for
    # BitNet too, so that its layers hold the same weights as the Llama model's; its output
    # embedding is the input one.)
    lm_head = randn(vocab, d["hidden"], std=0.2)
    if arch == "llama":
        tensors["lm_head.weight"] = lm_head
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = norm(d["hidden"])
        tensors[f"{p}.post_attention_layernorm.weight"] = norm(d["hidden"])
        if arch == "bitnet":
            tensors[f"{p}.self_attn.attn_sub_norm.weight"] = norm(d["q"])
            tensors[f"{p}.mlp.ffn_sub_norm.weight"] = norm(d["inter"])
        for mod, (n, k) in projection_shapes(d).items():
            w = randn(n, k, std=k ** -0.5)
            if online:
                enc = {"weight": w}  # quantized by the loader (transformers' WeightQuant)
            elif fmt == "bitnet":
                codes, s = _absmean(w, None)
                # autobitlinear multiplies by the stored scale, bitlinear divides by it
                enc = bitnet.encode(codes, float(s if autobit else 1.0 / s))
            elif scale == "group":
                codes, s = _absmean(w.view(n, k // group_size, group_size), 2)
                enc = canonical.encode(codes.view(n, k), s.view(n, k // group_size))
            else:
                codes, s = _absmean(w, 1 if scale == "channel" else None)
                enc = canonical.encode(codes, s.reshape(-1))
            tensors.update({f"{p}.{mod}.{suffix}": t for suffix, t in enc.items()})
    test_pause()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    if arch == "bitnet":  # 2B-4T's quantization_config, word for word
        qcfg = {"quant_method": "bitnet", "linear_class": "autobitlinear",
                "quantization_mode": "online" if online else "offline"}
    elif fmt == "bitnet":
        qcfg = {"quant_method": "bitnet",
                "linear_class": "autobitlinear" if autobit else "bitlinear",
                "quantization_mode": "online" if online else "offline",
                "modules_to_not_convert": ["lm_head"]}
    else:
        qcfg = canonical.quantization_config(scale, group_size, ["lm_head"])
    if arch == "bitnet":
        config = {
            "architectures": ["BitNetForCausalLM"], "model_type": "bitnet",
            "vocab_size": vocab, **shape, "hidden_act": "relu2", "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_bias": False,
            "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
            "quantization_config": qcfg,
        }
    else:
        config = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": vocab, **shape, "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
            "mlp_bias": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
            "quantization_config": qcfg,
        }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2) + "\n")
    test_pause()
