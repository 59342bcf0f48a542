"""The last thing a tools/h200 call prints: every stage run on this machine so far, then the
build, smoke, validate and bench results from their JSON files. Standard library only (it
runs even where ternary did not install).

    python3 tools/h200/summary.py WORKDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(title: str, header: list[str], data: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *data)] if data else \
        [len(h) for h in header]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [f"-- {title}", line, "-" * len(line)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)) for r in data]
    return out


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stages(work: Path) -> list[str]:
    data = []
    for ln in (work / "steps.tsv").read_text().splitlines() if (work / "steps.tsv").exists() else []:
        t, name, rc, secs, note = (ln.split("\t") + [""] * 5)[:5]
        verdict = {"0": "ok", "skip": "skipped"}.get(rc, f"FAILED rc={rc}")
        data.append([t, name, verdict, secs, note[:110]])
    return rows("stages run on this machine (oldest first)", ["time", "stage", "result", "s", "note"], data)


def build(r: dict) -> list[str]:
    return [(f"-- build: {r.get('wheel')} torch {r.get('torch_version')} (CUDA "
             f"{r.get('torch_cuda')}), nvcc {r.get('nvcc_version')}, SASS {r.get('sass_found')} "
             f"(expected {r.get('sass_expected')}), compile {r.get('compile_s')} s")]


def smoke(r: dict) -> list[str]:
    data = []
    for run in r.get("runs", []):
        for c in run["checks"]:
            data.append([run["format"], c["name"], "ok" if c["ok"] else "FAIL",
                         f"{c['seconds']:.1f}", ("" if c["ok"] else c["detail"])[:100]])
    where = (f" tensor parallel {r['tp']}" if r.get("tp", 1) > 1 else "") + \
        (f" on {r['model']}" if r.get("model") else "")
    return rows(f"smoke-{r.get('target')}{where}: {'PASSED' if r.get('ok') else 'FAILED'} in "
                f"{r.get('seconds', 0):.0f} s", ["format", "check", "result", "s", "detail"], data)


def validate(r: dict) -> list[str]:
    data = [[repr(p["prompt"])[:34], "identical" if p["vllm_tokens"] == p["ref_tokens"] else "differ",
             f"{p['max_abs_logit_diff']:.3g}", f"{p['kl_ref_vllm']:.3g}"] for p in r.get("results", [])]
    out = rows(f"validate {r.get('quant_method')} {r.get('dtype')}: "
               f"{'OK' if r.get('ok') else 'over the limit'} (KL limit {r.get('kl_limit')})",
               ["prompt", "greedy tokens", "max |logit diff|", "KL(ref||vLLM)"], data)
    out.append(f"first divergent layer: {r.get('first_divergent_layer') or 'none'}")
    return out


def label(m: dict) -> str:  # bench_serve.run_label, kept here so this runs without ternary
    tp, variant = m.get("tp", 1), m.get("variant", "")
    return m["name"] + (f"@{variant}" if variant else "") + (f"@tp{tp}" if tp != 1 else "")


def tp_validate(r: dict) -> list[str]:
    a, b = r.get("tp_a"), r.get("tp_b")
    data = [[repr(p["prompt"])[:34], "identical" if p["tokens_a"] == p["tokens_b"] else
             f"differ at {p.get('first_difference')}", len(p["kl_per_position"]),
             f"{max(p['kl_per_position'], default=0.0):.3g}", f"{p['max_abs_logit_diff']:.3g}",
             " ".join(f"{x:.1e}" for x in p["kl_per_position"])]
            for p in r.get("results", [])]
    if "error" in r:
        return [f"-- tp-validate: could not run: {r['error'][:300]}"]
    return rows(f"tp-validate {r.get('dtype')}: TP={b} against TP={a}, "
                f"{'OK' if r.get('ok') else 'over the limit'} (KL limit {r.get('kl_limit')})",
                ["prompt", "greedy tokens", "positions", f"KL(tp{a}||tp{b}) max", "max |diff|",
                 "KL per position"], data)


def bench(r: dict) -> list[str]:
    base = {label(m): m for m in r["models"] if m["ok"] and m["kind"] == "bf16"}
    # each ternary run's bf16 twin, as bench_serve.comparisons paired them
    twin = {c["run"]: c["base"] for c in r.get("comparisons", []) if c["against"] == "bf16"}
    data = []
    for m in r["models"]:
        gib = "-" if m.get("weights_gib") is None else f"{m['weights_gib']:.3g}"
        kern = ",".join(f"{k}x{n}" for k, n in (m.get("kernels") or {}).items()) or "-"
        if m.get("eager"):
            kern += " eager"
        if not m["ok"]:
            data.append([label(m), gib, "-", "FAILED", "", "", "", "", "",
                         m["error"].splitlines()[0][:60]])
            continue
        ref = base.get(twin.get(label(m), ""))
        for p in m["points"]:
            q = next((x for x in ref["points"] if x["batch"] == p["batch"]), None) if ref else None
            data.append([label(m), gib, p["batch"], f"{p['tok_s']:,.0f}",
                         f"{p['tok_s'] / q['tok_s']:.2f}" if q else "", f"{p['ttft_ms']:.1f}",
                         f"{p['ttft_wall_ms']:.1f}" if "ttft_wall_ms" in p else "-",
                         "-" if p.get("ttft_engine_ms") is None else f"{p['ttft_engine_ms']:.1f}",
                         f"{p['step_ms']:.2f}", kern])
    nccl = ", NCCL all-reduce (custom off)" if r.get("disable_custom_all_reduce") else ""
    extra = f", engine {json.dumps(r['engine_args'])}" if r.get("engine_args") else ""
    extra += "".join(f"; @{n}: {json.dumps(a)}" for n, a in (r.get("variants") or {}).items())
    out = rows(f"bench-serve {r['shape']}{nccl}: {r['prompt_len']}-token prompts, {r['output_len']} "
               f"generated, {r.get('device')}, vLLM {r.get('vllm')}, torch {r.get('torch')}{extra}",
               ["model", "weights GiB/GPU", "batch", "tok/s", "x bf16", "TTFT ms", "1-token ms",
                "engine ms", "ms/step", "kernel"],
               data)
    for c in r.get("comparisons", []):
        w = c.get("weights_ratio")
        out.append(f"{c['run']} / {c['base']}: tok/s "
                   + ", ".join(f"b{b} {x:.2f}x" for b, x in c["tok_s_ratio"].items())
                   + (f"; weights {w:.3f}x" if w is not None else ""))
    # the categories as ternary.tools.step_profile orders them, from the profiles themselves
    cols = next((list(p["categories_ms"]) for m in r["models"] for p in m.get("profiles") or []
                 if "categories_ms" in p), [])
    prof = []
    for m in r["models"]:
        for p in m.get("profiles") or []:
            if "error" in p:
                prof.append([label(m), p["batch"], "ERROR", p["error"][:80], *[""] * (len(cols) + 2)])
                continue
            c = p["categories_ms"]
            prof.append([label(m), p["batch"], p["steps"], f"{p['step_ms']:.3f}",
                         f"{p['busy_ms']:.3f}", f"{p['host_gap_ms']:.3f}",
                         *(f"{c.get(k, 0.0):.3f}" for k in cols)])
    if prof:
        out += rows("where a decode step goes (ms a step)",
                    ["model", "batch", "steps", "step", "busy", "host gap", *cols], prof)
    return out


def tp_kernels(r: dict) -> list[str]:
    data = []
    for d in r["ranks"]:
        worst = max((c["rel_err"] for c in d["checks"]), default=float("nan"))
        data.append([d["rank"], "ok" if d["ok"] else "FAILED", f"{worst:.2e}", d["last"][:60],
                     d.get("error", "")[:80]])
    how = f"{r.get('comm', 'c10d')}, {'a sync after each op' if r['sync'] else 'queued'}"
    return rows(f"tp-kernels ({how}): M {r['m']}, {r['seconds']} s"
                f"{', HUNG' if r['hung'] else ''}, seed {r['seed']}",
                ["rank", "result", "worst rel err", "last op", "error"], data)


def _named(name: str, fn):
    """fn's section with `name` in its title (several variants share one section kind)."""
    def section(r: dict) -> list[str]:
        out = fn(r)
        return [out[0].replace("-- ", f"-- {name}: ", 1), *out[1:]] if out else out
    return section


TP_HANG_VARIANTS = ("default", "uncapped", "nopdl", "nopersist", "blocking", "tokens8192",
                    "cublas", "nccl", "eager")
TP_KERNELS_MODES = ("queued", "sync", "pynccl", "pynccl-sync")


def main(argv: list[str]) -> int:
    work = Path(argv[1]) if len(argv) > 1 else Path("/tmp/ternary-h200")
    out = stages(work)
    for name, fn in (("build", build), ("smoke", smoke), ("validate", validate), ("bench", bench),
                     ("tp-validate-float32", tp_validate), ("tp-validate-bfloat16", tp_validate),
                     ("tp-smoke", smoke), ("tp-smoke-big", smoke), ("tp-bench", bench),
                     *((f"tp-kernels-{m}", tp_kernels) for m in TP_KERNELS_MODES),
                     *((f"tp-hang-{v}", _named(f"tp-hang {v}", bench))
                       for v in TP_HANG_VARIANTS)):
        r = load(work / "results" / f"{name}.json")
        if r is None:
            continue
        out.append("")
        try:
            out += fn(r)
        except (KeyError, TypeError, ValueError) as e:  # a partial file must not hide the rest
            out.append(f"-- {name}: unreadable results ({type(e).__name__}: {e})")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
