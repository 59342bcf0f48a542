"""One tensor-parallel rank for tests/vllm/test_tp.py (run as a script, one process per rank).

Builds vLLM's real QKVParallelLinear, MergedColumnParallelLinear and RowParallelLinear with
TernaryConfig over gloo, loads full checkpoint tensors through the layers' own weight
loaders (each rank keeps its slice), runs forward and writes, per case, the largest
difference from the dense reference as JSON.

    python tp_worker.py RANK WORLD PORT OUT.json
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import zlib

import torch

HIDDEN, HEAD, HEADS, INTER = 128, 32, 4, 256


def codes(n, k, g):
    return torch.randint(-1, 2, (n, k), generator=g, dtype=torch.int8)


def checkpoint_tensors(spec, n, k, g):
    """(stored weight, stored scale, dense float32 [n, k]) in the spec's checkpoint format."""
    from ternary import ops
    from ternary.formats.bitnet import pack_rows

    c = codes(n, k, g)
    if spec.format == "bitnet":
        s = torch.tensor([3.0], dtype=torch.bfloat16)
        div = spec.bitnet_linear_class == "bitlinear"
        dense = c.float() / 3.0 if div else c.float() * 3.0
        return pack_rows(c), s, dense
    if spec.scale == "group":
        gs = spec.group_size
        s = torch.rand(n, -(-k // gs), generator=g) + 0.5
        return ops.pack(c), s, c.float() * s.repeat_interleave(gs, 1)[:, :k]
    s = torch.rand(n if spec.scale == "channel" else 1, generator=g) + 0.5
    return ops.pack(c), s, c.float() * s.view(-1, 1)


def load(layer, name, tensor, shard=None):
    p = getattr(layer, name)
    if shard is None:
        p.weight_loader(p, tensor)
    else:
        p.weight_loader(p, tensor, shard)


def finish(layer):
    layer.quant_method.process_weights_after_loading(layer)


def run_case(spec, rank, world, kv_heads, g):
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    from ternary.vllm.config import TernaryConfig

    cfg = TernaryConfig(spec)
    x = torch.randn(3, HIDDEN, generator=g)
    out = {}

    qkv = QKVParallelLinear(HIDDEN, HEAD, HEADS, kv_heads, bias=False, quant_config=cfg,
                            prefix="model.layers.0.self_attn.qkv_proj")
    dense = {}
    for shard, n in (("q", HEADS * HEAD), ("k", kv_heads * HEAD), ("v", kv_heads * HEAD)):
        w, s, dense[shard] = checkpoint_tensors(spec, n, HIDDEN, g)
        load(qkv, "weight", w, shard)
        load(qkv, "weight_scale", s, shard)
    finish(qkv)
    got = qkv(x)[0]
    q_rows = HEADS * HEAD // world
    kv_rank = rank // max(1, world // kv_heads)
    kv_rows = max(1, kv_heads // world) * HEAD
    want = torch.cat([dense["q"][rank * q_rows:(rank + 1) * q_rows],
                      dense["k"][kv_rank * kv_rows:(kv_rank + 1) * kv_rows],
                      dense["v"][kv_rank * kv_rows:(kv_rank + 1) * kv_rows]])
    out["qkv"] = float((got - x @ want.t()).abs().max())

    gate_up = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], bias=False, quant_config=cfg,
                                         prefix="model.layers.0.mlp.gate_up_proj")
    parts = []
    for shard in (0, 1):
        w, s, d = checkpoint_tensors(spec, INTER, HIDDEN, g)
        load(gate_up, "weight", w, shard)
        load(gate_up, "weight_scale", s, shard)
        rows = INTER // world
        parts.append(d[rank * rows:(rank + 1) * rows])
    finish(gate_up)
    out["gate_up"] = float((gate_up(x)[0] - x @ torch.cat(parts).t()).abs().max())

    # reduce_results=False: vLLM 0.6.x's CPU all-reduce needs intel_extension_for_pytorch;
    # the partial sums are what the method computes, so the test reduces them itself.
    down = RowParallelLinear(INTER, HIDDEN, bias=False, input_is_parallel=True,
                             reduce_results=False, quant_config=cfg,
                             prefix="model.layers.0.mlp.down_proj")
    w, s, d = checkpoint_tensors(spec, HIDDEN, INTER, g)
    load(down, "weight", w)
    load(down, "weight_scale", s)
    finish(down)
    xi = torch.randn(3, INTER, generator=g)
    cols = INTER // world
    got = down(xi[:, rank * cols:(rank + 1) * cols])[0]
    if world > 1:
        from vllm.distributed import get_tp_group

        torch.distributed.all_reduce(got, group=get_tp_group().device_group)
    out["row_parallel"] = float((got - xi @ d.t()).abs().max())
    return out


def refusals(world):
    """Shapes that do not split across the ranks fail in create_weights, before loading."""
    from vllm.model_executor.layers.linear import RowParallelLinear

    from ternary.vllm.config import TernaryConfig
    from ternary.vllm.spec import QuantSpec

    msgs = {}
    for name, k, spec in (
        ("k_not_multiple_of_4", 6 * world, QuantSpec("ternary", "channel", None, ())),
        ("group_straddles_ranks", INTER, QuantSpec("ternary", "group", 96, ())),
    ):
        try:
            RowParallelLinear(k, HIDDEN, bias=False, quant_config=TernaryConfig(spec),
                              prefix=f"model.layers.0.{name}")
            msgs[name] = None
        except ValueError as e:
            msgs[name] = str(e)
    return msgs


def _gloo_only_groups_without_gpu():
    """vLLM 0.6.x asks for NCCL in every model-parallel group (use_pynccl=True), which fails
    on a machine without a GPU; the layers and loaders under test do not care, so this
    test process builds those groups on gloo alone."""
    import inspect

    from vllm.distributed import parallel_state as ps

    params = inspect.signature(ps.GroupCoordinator.__init__).parameters
    if torch.cuda.is_available() or "use_pynccl" not in params:
        return
    orig = ps.GroupCoordinator.__init__

    def init(self, *args, **kwargs):
        kwargs.update(use_pynccl=False, use_custom_allreduce=False)
        orig(self, *args, **kwargs)

    ps.GroupCoordinator.__init__ = init


def main():
    rank, world, port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    from ternary.vllm.register import register
    from ternary.vllm.spec import QuantSpec

    register()
    _gloo_only_groups_without_gpu()
    try:  # vLLM >= 0.7 builds layers inside a config context
        from vllm.config import VllmConfig, set_current_vllm_config
        ctx = set_current_vllm_config(VllmConfig())
    except ImportError:
        ctx = contextlib.nullcontext()
    with ctx:
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     backend="gloo")
        ensure_model_parallel_initialized(world, 1)
        specs = {
            "channel": QuantSpec("ternary", "channel", None, ()),
            "tensor": QuantSpec("ternary", "tensor", None, ()),
            "group32": QuantSpec("ternary", "group", 32, ()),
            "bitnet": QuantSpec("bitnet", "tensor", None, (), "bitlinear"),
            "autobitnet": QuantSpec("bitnet", "tensor", None, (), "autobitlinear"),
        }
        result = {}
        for kv in (2, 1):
            for name, spec in specs.items():
                # the same seed on every rank: all ranks read the same checkpoint
                g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{kv}".encode()))
                result[f"{name}/kv{kv}"] = run_case(spec, rank, world, kv, g)
        result["refusals"] = refusals(world)
    with open(path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
