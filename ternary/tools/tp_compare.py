"""Does tensor parallelism change what vLLM computes? The same checkpoint served at two
tensor-parallel sizes, compared directly (`ternary validate DIR --tp 2 --against-tp 1`).

Each size runs in its own process (vLLM frees GPU memory reliably only at exit, and a
second engine in the same process would find the first one's memory still taken): greedy
decoding of every prompt with the whole vocabulary's logits at each generated position.
Then, per prompt:
- greedy tokens: equal or not, and the first position where they differ;
- per position: KL(A || B) over the whole vocabulary in float64, and max |logit diff|,
  at every position whose prefix the two runs share (up to and including the first
  differing token; after it the two runs continue different texts).

float32 requires identical tokens (an all-reduce only reorders float32 sums); bf16 and
fp16 are judged by KL alone (validate.KL_LIMITS), as a near tie may flip a token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from ternary.tools import validate as v


class TPCompareError(RuntimeError):
    """An engine of the comparison failed; the message carries its log's tail."""


@dataclasses.dataclass
class PromptPair:
    prompt: str
    tokens_a: list[int]
    tokens_b: list[int]
    kl_per_position: list[float]  # KL(A || B), positions with a shared prefix
    max_abs_logit_diff: float

    @property
    def tokens_equal(self) -> bool:
        return self.tokens_a == self.tokens_b

    @property
    def first_difference(self) -> int | None:
        """The first position where the token lists differ (the shorter one's length when it
        is a prefix of the other); None when they are equal."""
        if self.tokens_equal:
            return None
        return next((i for i, (a, b) in enumerate(zip(self.tokens_a, self.tokens_b)) if a != b),
                    min(len(self.tokens_a), len(self.tokens_b)))

    @property
    def kl_max(self) -> float:
        return max(self.kl_per_position, default=0.0)


@dataclasses.dataclass
class TPReport:
    model_dir: str
    dtype: str
    tp_a: int  # the baseline (--against-tp)
    tp_b: int  # the size under test (--tp)
    kind: str  # "logits" (raw logits from vLLM) or "logprobs"
    results: list[PromptPair]
    kl_limit: float
    engine_s: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def tokens_required(self) -> bool:
        return self.dtype == "float32"

    @property
    def ok(self) -> bool:
        return v.verdict(self.dtype, self.kl_limit,
                         [(r.tokens_equal, r.kl_max) for r in self.results])


# ---------------------------------------------------------------------------------------
# One engine (in its own process)


def engine_worker(spec: dict) -> None:
    """Greedy decoding of spec["prompts"] at spec["tp"]; writes tokens and the [n, vocab]
    float32 rows of each prompt to spec["out"] (torch.save)."""
    import time

    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from ternary.tools.engine import cpu_env_defaults

    cpu_env_defaults()
    from ternary.vllm.register import register

    register()
    model_dir = Path(spec["model_dir"])
    t = time.monotonic()
    llm, kind = v.vllm_engine(model_dir, spec["dtype"], spec["vocab"], spec["tp"],
                              spec["max_len"])
    engine_s = time.monotonic() - t
    out = []
    for ids in spec["prompt_ids"]:
        tokens, rows = v.vllm_generate(llm, ids, spec["max_tokens"], spec["vocab"])
        out.append({"tokens": tokens, "rows": rows.to(torch.float32)})
    torch.save({"kind": kind, "engine_s": engine_s, "prompts": out}, spec["out"])


def run_engine(model_dir: Path, dtype: str, tp: int, prompt_ids: list[list[int]],
               max_tokens: int, vocab: int, max_len: int, work: Path, timeout: float) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = (work / f"tp{tp}.spec.json", work / f"tp{tp}.pt",
                                     work / f"tp{tp}.log")
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({
        "model_dir": str(model_dir), "dtype": dtype, "tp": tp, "prompt_ids": prompt_ids,
        "max_tokens": max_tokens, "vocab": vocab, "max_len": max_len, "out": str(out_path)}))
    cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", "ternary.tools.tp_compare",
           "--worker", str(spec_path)]
    from ternary.tools.bench_serve import run_logged

    rc = run_logged(cmd, log_path, timeout)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
    if rc is None:
        raise TPCompareError(f"the tensor parallel {tp} engine did not finish in {timeout:.0f} s "
                             f"(raise --timeout); log {log_path}:\n{tail}")
    if rc != 0 or not out_path.is_file():
        raise TPCompareError(f"the tensor parallel {tp} engine exited with status {rc}; "
                             f"log {log_path}:\n{tail}")
    return torch.load(out_path)


# ---------------------------------------------------------------------------------------
# The comparison


def compare_rows(rows_a: torch.Tensor, rows_b: torch.Tensor, kind: str,
                 positions: int) -> tuple[list[float], float]:
    """Per-position KL(A || B) (float64) and max |diff| over the first `positions` rows;
    rows are raw logits (kind "logits") or log-probabilities."""
    a, b = rows_a[:positions].double(), rows_b[:positions].double()
    if kind == "logits":
        diff = float((a - b).abs().max()) if positions else 0.0
        a, b = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    else:
        finite = torch.isfinite(a) & torch.isfinite(b)
        diff = float((a - b)[finite].abs().max()) if bool(finite.any()) else 0.0
    kl = (a.exp() * (a - b)).nan_to_num(0.0).sum(-1)
    return [float(x) for x in kl], diff


def pair(prompt: str, a: dict, b: dict, kind: str) -> PromptPair:
    ta, tb = list(a["tokens"]), list(b["tokens"])
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    positions = min(len(ta), len(tb)) if first is None else first + 1
    kl, diff = compare_rows(a["rows"], b["rows"], kind, positions)
    return PromptPair(prompt, ta, tb, kl, diff)


def compare(model_dir: Path, dtype: str = "float32", tp: int = 2, against: int = 1,
            max_tokens: int = 16, prompts: list[str] | None = None, progress=None,
            work: Path | None = None, timeout: float = 900) -> TPReport:
    import tempfile

    from transformers import AutoTokenizer

    if tp == against:
        raise ValueError(f"--tp {tp} and --against-tp {against} are the same size: compare "
                         f"two different tensor-parallel sizes")
    step = progress or (lambda msg: None)
    prompts = prompts or v.PROMPTS
    config = json.loads((model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = config["vocab_size"]
    max_len = v.context_length(config, tok, prompts, max_tokens)
    ids = [tok(p).input_ids for p in prompts]
    work = work or Path(tempfile.mkdtemp(prefix="ternary-tp-compare-"))
    runs = {}
    for size in (against, tp):
        step(f"tensor parallel {size}: starting vLLM in its own process (log {work}/tp{size}.log)")
        runs[size] = run_engine(model_dir, dtype, size, ids, max_tokens, vocab, max_len, work,
                                timeout)
    kind = runs[against]["kind"]
    if runs[tp]["kind"] != kind:
        raise TPCompareError(f"the two engines returned different row kinds ({kind} at "
                             f"tensor parallel {against}, {runs[tp]['kind']} at {tp})")
    results = [pair(p, a, b, kind) for p, a, b in
               zip(prompts, runs[against]["prompts"], runs[tp]["prompts"])]
    return TPReport(str(model_dir), dtype, against, tp, kind, results,
                    v.kl_limit(dtype, v.model_activation(model_dir)),
                    {f"tp{s}": r["engine_s"] for s, r in runs.items()})


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--worker":
        engine_worker(json.loads(Path(argv[1]).read_text()))
        return 0
    print("usage: ternary validate MODEL_DIR --tp N --against-tp M (this module's --worker is "
          "internal)", file=sys.stderr)
    return 2


if __name__ == "__main__":  # spawn-safe: vLLM's engine processes re-import this module
    sys.exit(main(sys.argv[1:]))
