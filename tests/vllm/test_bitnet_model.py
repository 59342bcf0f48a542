"""BitNetForCausalLM (ternary.vllm.models.bitnet) served by vLLM through the plugin, token for
token with transformers' own BitNet (its AutoBitLinear layers: int8 activations) on
make-tiny --arch bitnet, whose norms have outlier channels so that float activations would
give other tokens. Each vLLM engine runs once, in a subprocess (tests/vllm/bitnet_tp_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed in this environment")
pytest.importorskip("tokenizers", reason="make-tiny trains its tokenizer with `tokenizers`")

from ternary.tools.synthetic import tiny
from ternary.tools.validate import PROMPTS
from ternary.vllm import models
from ternary.vllm.version import vllm_version
from ternary.vllm.spec import TernaryConfigError

# where the installed vLLM cannot build the model (0.6.x, the compat run), only the tests of
# the refusal and of the architecture check run
builds_model = pytest.mark.skipif(
    models.unsupported_reason(vllm_version()) is not None,
    reason=f"vLLM {vllm_version()} cannot build BitNetForCausalLM (test_refused_on_vllm_0_6)")

WORKER = Path(__file__).with_name("bitnet_tp_worker.py")
MAX_TOKENS = 16  # bitnet_tp_worker.MAX_TOKENS
# vLLM's CPU backend (ternary.tools.engine.cpu_env_defaults); engines use the GPU where there is one
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1",
           "VLLM_TARGET_DEVICE": "cpu"}


def _skip_unless_an_engine_runs_here():
    import importlib.metadata

    dists = {d.metadata["Name"] for d in importlib.metadata.distributions()}
    if not (torch.cuda.is_available() or "vllm-cpu" in dists or vllm_version().endswith("+cpu")):
        pytest.skip(f"vLLM {vllm_version()} is a GPU build and no GPU is visible: its engine "
                    f"cannot run here (the CPU build is vllm-cpu)")


def run(args: list[str], log: Path, env: dict | None = None, timeout: int = 600) -> str | None:
    """Runs the worker; returns None, or the log's tail when it failed."""
    full = {**os.environ, **({} if torch.cuda.is_available() else CPU_ENV), **(env or {})}
    full.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    with open(log, "wb") as f:
        p = subprocess.Popen([sys.executable, str(WORKER), *args], stdout=f,
                             stderr=subprocess.STDOUT, env=full)
        try:
            rc = p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return None if rc == 0 else f"exit {rc}:\n" + log.read_text(errors="replace")[-4000:]


def serve(model_dir: Path, tp: int = 1, **env) -> dict:
    _skip_unless_an_engine_runs_here()
    out = model_dir.parent / f"{model_dir.name}-tp{tp}-{'-'.join(env.values()) or 'asis'}"
    failed = run(["engine", str(model_dir), str(tp), f"{out}.json"], Path(f"{out}.log"), env)
    assert failed is None, failed
    return json.loads(Path(f"{out}.json").read_text())["prompts"]


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> Path:
    return tiny.make(tmp_path_factory.mktemp("bitnet") / "offline", arch="bitnet")


@pytest.fixture(scope="module")
def reference(offline) -> dict[str, list[int]]:
    """transformers' BitNetForCausalLM with its quantization config in place (AutoBitLinear:
    ternary weights times their scale, int8 per-token activations), greedy."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.bitnet import AutoBitLinear

    from ternary.tools.validate import reference_greedy

    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(offline, **{key: torch.float32}).eval()
    assert isinstance(model.model.layers[0].mlp.down_proj, AutoBitLinear)
    tok = AutoTokenizer.from_pretrained(offline)
    return {p: reference_greedy(model, tok(p)["input_ids"], MAX_TOKENS) for p in PROMPTS}


@pytest.fixture(scope="module")
def served(offline) -> dict:
    return serve(offline)


@builds_model
def test_tokens_equal_transformers(served, reference):
    for p in PROMPTS:
        assert len(served[p]["tokens"]) == MAX_TOKENS
        assert served[p]["tokens"] == reference[p], p


@builds_model
def test_float_activations_change_tokens(offline, reference):
    """The check above can fail: the same model served with float activations
    (TERNARY_ACTIVATION_OVERRIDE=none) gives other greedy tokens."""
    got = serve(offline, TERNARY_ACTIVATION_OVERRIDE="none")
    differ = [p for p in PROMPTS if got[p]["tokens"] != reference[p]]
    assert differ, "float activations gave transformers' int8 tokens on every prompt"


@builds_model
def test_online_tokens_equal_transformers(tmp_path_factory):
    """quantization_mode "online" (dense master weights, as 2B-4T's -bf16 variant): vLLM
    quantizes them once at load as transformers' WeightQuant does in every forward."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ternary.tools.validate import reference_greedy

    _skip_unless_an_engine_runs_here()
    d = tiny.make(tmp_path_factory.mktemp("bitnet") / "online", arch="bitnet", online=True)
    got = serve(d)
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(d, **{key: torch.float32}).eval()
    assert model.model.layers[0].mlp.down_proj.online_quant
    tok = AutoTokenizer.from_pretrained(d)
    for p in PROMPTS:
        assert got[p]["tokens"] == reference_greedy(model, tok(p)["input_ids"], MAX_TOKENS), p


# (at TP > 1 the int8 scale of o_proj / down_proj inputs is the rank's, see below)
@builds_model
@pytest.mark.slow
def test_tp2_engine_equals_tp1(offline, served):
    """The whole model at tensor parallel 2 (vLLM's engine, two CPU workers): tokens and
    logits as at tensor parallel 1."""
    tp2 = serve(offline, tp=2)
    for p in PROMPTS:
        assert tp2[p]["tokens"] == served[p]["tokens"], p
        a, b = torch.tensor(served[p]["rows"]), torch.tensor(tp2[p]["rows"])
        assert float((a - b).abs().max()) < 1e-4, p


@pytest.fixture(scope="module")
def layer_runs(tmp_path_factory, tp_ranks):
    """(TP=1 result, [TP=2 rank 0, rank 1]); all three processes at once."""
    d = tmp_path_factory.mktemp("bitnet-layers")
    one, two = [tp_ranks.start(WORKER, ["layers"], world, d / f"w{world}r", CPU_ENV)
                for world in (1, 2)]
    return tp_ranks.finish(one)[0], tp_ranks.finish(two)


def _tp_diffs(layer_runs, activation: str) -> dict[str, float]:
    one, two = layer_runs
    out = {}
    for rank, r in enumerate(two):
        a, b = one[activation], r[activation]
        cols = len(b["attn_sub_norm"][0])
        sub = torch.tensor(a["attn_sub_norm"])[:, rank * cols:(rank + 1) * cols]
        got = torch.tensor(b["attn_sub_norm"])
        out[f"rank{rank}.attn_sub_norm"] = float((sub - got).abs().max())
        for k in ("mlp", "o_proj"):
            out[f"rank{rank}.{k}"] = float((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max())
    return out


@builds_model
def test_tp2_sub_norms_equal_tp1(layer_runs):
    """vLLM's real layers over gloo, float activations: the sub-norms at tensor parallel 2
    normalize by the RMS of the whole row, so the MLP and o_proj outputs are TP=1's."""
    diffs = _tp_diffs(layer_runs, "none")
    assert all(d < 1e-4 for d in diffs.values()), diffs


@builds_model
def test_tp2_int8_activations_equal_tp1(layer_runs):
    """The same with int8 activations: a row-parallel layer takes each token's scale from
    the whole row, over the ranks (ternary.vllm.linear.split_row_amax)."""
    diffs = _tp_diffs(layer_runs, "int8_per_token")
    assert all(d < 1e-4 for d in diffs.values()), diffs


@builds_model
def test_registered_lazily():
    """The plugin registers BitNetForCausalLM by its import string: vLLM imports the model
    only where it builds one (not in the API server, nor at plugin load)."""
    from vllm import ModelRegistry

    from ternary.vllm.register import register

    register()
    assert models.BITNET_ARCH in ModelRegistry.get_supported_archs()
    entry = ModelRegistry.models[models.BITNET_ARCH]
    assert (entry.module_name, entry.class_name) == tuple(models.BITNET_CLASS.split(":"))


def test_refused_on_vllm_0_6(monkeypatch):
    """vLLM 0.6.x has no API to build the model on: a stand-in is registered that refuses
    when vLLM constructs it (before any weight is read), naming the version and targets."""
    from vllm import ModelRegistry

    from ternary.vllm import register
    from ternary.vllm import version as version_mod

    seen = {}
    monkeypatch.setattr(ModelRegistry, "register_model",
                        lambda arch, cls: seen.__setitem__(arch, cls))
    for version in ("0.6.2", "0.6.4.post1"):
        monkeypatch.setattr(version_mod, "vllm_version", lambda v=version: v)
        assert register.register_models() == "refusal"
        with pytest.raises(TernaryConfigError) as e:
            seen[models.BITNET_ARCH](vllm_config=None)
        msg = str(e.value)
        assert f"vLLM {version} cannot serve BitNetForCausalLM" in msg
        for target in ("`current` (vLLM 0.33.0)", "`h200` (vLLM 0.26.0)",
                       "`cpu` (vllm-cpu 0.32.0)"):
            assert target in msg
        # what `ternary serve` can ask before vLLM reads config.json
        with pytest.raises(TernaryConfigError, match=f"vLLM {version} cannot serve"):
            models.check_vllm("bitnet", version)
        models.check_vllm("llama", version)
    monkeypatch.setattr(version_mod, "vllm_version", lambda: "0.32.0+cpu")
    models.check_vllm("bitnet", "0.32.0+cpu")
    assert register.register_models() == "bitnet"
    assert seen[models.BITNET_ARCH] == "ternary.vllm.models.bitnet:BitNetForCausalLM"


def test_unserved_bitnet_architecture_is_named():
    from types import SimpleNamespace

    from ternary.vllm.config import TernaryConfig

    qc = {"quant_method": "bitnet", "linear_class": "autobitlinear"}
    for cfg, named in (
            (SimpleNamespace(model_type="bitnet",
                             architectures=["BitNetForSequenceClassification"]),
             "BitNetForSequenceClassification"),
            (SimpleNamespace(model_type="falcon", architectures=["FalconForCausalLM"]),
             "'falcon'")):
        with pytest.raises(TernaryConfigError) as e:
            models.check_architecture(cfg)
        assert named in str(e.value) and "bitnet: ['BitNetForCausalLM']" in str(e.value)
        assert "llama: ['LlamaForCausalLM']" in str(e.value)
    models.check_architecture(SimpleNamespace(model_type="bitnet",
                                              architectures=["BitNetForCausalLM"]))
    # what vLLM asks the quantization method: other model types are refused by name
    with pytest.raises(TernaryConfigError, match="model_type='falcon'.*'bitnet'"):
        TernaryConfig.override_quantization_method(
            qc, None, SimpleNamespace(model_type="falcon"))
    assert TernaryConfig.override_quantization_method(
        qc, None, SimpleNamespace(model_type="bitnet")) == "ternary"


def test_serve_refuses_bitnet_on_old_vllm_before_starting(tmp_path, monkeypatch):
    """`ternary serve` names the vLLM version and the targets that serve BitNetForCausalLM
    before vLLM reads the config (0.6.x's transformers would stop at AutoConfig first)."""
    from ternary.commands import serve
    from ternary.vllm import version as version_mod

    d = tmp_path / "b"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "bitnet"}')
    monkeypatch.setattr(version_mod, "vllm_version", lambda: "0.6.4.post1")
    why = serve.refusal_before_start(str(d))
    assert why and "vLLM 0.6.4.post1 cannot serve BitNetForCausalLM" in why and "`current`" in why
    monkeypatch.setattr(version_mod, "vllm_version", lambda: "0.33.0")
    assert serve.refusal_before_start(str(d)) is None
    assert serve.refusal_before_start("org/some-hub-name") is None
