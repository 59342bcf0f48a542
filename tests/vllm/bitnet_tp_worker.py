"""Subprocess side of tests/vllm/test_bitnet_model.py (a script: vLLM's CPU engine spawns
processes, so each engine runs in a fresh interpreter of its own).

    python bitnet_tp_worker.py engine MODEL_DIR TP OUT.json
        vLLM's LLM on MODEL_DIR (float32, enforce_eager, tensor parallel TP): greedy tokens
        and the logits of each, 16 per prompt of ternary.tools.validate.PROMPTS.
    python bitnet_tp_worker.py layers RANK WORLD PORT OUT.json
        one tensor-parallel rank over gloo: BitNet's MLP (gate_up, relu2, ffn_sub_norm, down)
        and attention output path (attn_sub_norm, o_proj) built from the model's classes with
        TernaryConfig, loaded from whole checkpoint tensors through their own loaders; writes
        each output (the rank's part, all-reduced where the layer reduces) as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import torch

MAX_TOKENS = 16


def engine(model_dir: str, tp: int, out: str) -> None:
    from transformers import AutoTokenizer

    from ternary.tools.engine import cpu_env_defaults
    from ternary.tools.validate import PROMPTS, vllm_engine, vllm_generate

    cpu_env_defaults(tp)
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    llm, kind = vllm_engine(model_dir, "float32", vocab, tp=tp)
    result = {"kind": kind, "prompts": {}}
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        tokens, rows = vllm_generate(llm, ids, MAX_TOKENS, vocab)
        result["prompts"][p] = {"ids": ids, "tokens": tokens, "rows": rows.tolist()}
    with open(out, "w") as f:
        json.dump(result, f)


HIDDEN, HEADS, HEAD, INTER = 128, 4, 32, 256


def _layers(rank: int, world: int, port: str, out: str) -> None:
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    from ternary.formats.bitnet import pack_rows
    from ternary.vllm.config import TernaryConfig
    from ternary.vllm.register import register
    from ternary.vllm.spec import QuantSpec

    register()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import RowParallelLinear

    from ternary.vllm.models.bitnet import BitNetMLP, SplitRMSNorm

    result = {}
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     backend="gloo")
        ensure_model_parallel_initialized(world, 1)
        for activation in ("int8_per_token", "none"):
            # the same seed on every rank and for both world sizes: one checkpoint
            g = torch.Generator().manual_seed(0)
            cfg = TernaryConfig(QuantSpec("bitnet", "tensor", None, (), "autobitlinear",
                                          activation=activation))

            def codes(n, k):
                return torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)

            def norm_weight(n):
                w = 1.0 + 0.1 * torch.randn(n, generator=g)
                w[:3] = torch.tensor([25.0, 31.0, 38.0])  # outliers, as make-tiny's
                return w

            def load(layer, shard=None):
                c = codes(layer.output_size if shard is None else layer.output_sizes[shard],
                          layer.input_size)
                s = torch.tensor([0.05 + float(torch.rand(1, generator=g))], dtype=torch.bfloat16)
                for name, t in (("weight", pack_rows(c)), ("weight_scale", s)):
                    p = getattr(layer, name)
                    p.weight_loader(p, t) if shard is None else p.weight_loader(p, t, shard)

            mlp = BitNetMLP(HIDDEN, INTER, "relu2", 1e-5, prefix="model.layers.0.mlp",
                            quant_config=cfg)
            load(mlp.gate_up_proj, 0)
            load(mlp.gate_up_proj, 1)
            load(mlp.down_proj)
            mlp.ffn_sub_norm.weight_loader(mlp.ffn_sub_norm.weight, norm_weight(INTER))
            # attention's output path: attn_sub_norm over the heads of this rank, o_proj
            sub = SplitRMSNorm(HEADS * HEAD, 1e-5, "model.layers.0.self_attn.attn_sub_norm")
            sub.weight_loader(sub.weight, norm_weight(HEADS * HEAD))
            o_proj = RowParallelLinear(HEADS * HEAD, HIDDEN, bias=False, quant_config=cfg,
                                       prefix="model.layers.0.self_attn.o_proj")
            load(o_proj)
            for layer in (mlp.gate_up_proj, mlp.down_proj, o_proj):
                layer.quant_method.process_weights_after_loading(layer)

            x = torch.randn(5, HIDDEN, generator=g) * 3
            attn = torch.randn(5, HEADS * HEAD, generator=g)
            cols = HEADS * HEAD // world
            local = attn[:, rank * cols:(rank + 1) * cols]
            with torch.no_grad():
                normed = sub(local)
                result[activation] = {
                    "mlp": mlp(x).tolist(),
                    "attn_sub_norm": normed.tolist(),  # this rank's columns
                    "o_proj": o_proj(normed)[0].tolist(),
                }
    with open(out, "w") as f:
        json.dump(result, f)


def main() -> None:
    mode = sys.argv[1]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if mode == "engine":
        engine(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif mode == "layers":
        _layers(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        raise SystemExit(f"mode {mode!r}: expected 'engine' or 'layers'")


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
