#!/bin/bash
# One call on the GPU machine: build ternary._C in place, GPU tests, benchmark (and, with
# SANITIZE=1, compute-sanitizer; with SUSTAIN=1, a sustained run of M 1024 / 4096). Logs and
# bench.json land in $OUT. Steps are time-boxed so the call ends inside the device tool's
# 600 s limit. Usage: bash bench/device_check.sh [bench args]
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ternary-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}
echo "nvcc $NVCC CUDA_HOME $CUDA_HOME"; "$NVCC" --version | tail -1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
TERNARY_ARCH_LIST=9.0a MAX_JOBS=16 timeout 240 python3 setup.py build_ext --inplace \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
cuobjdump --list-elf ternary/_C*.so | head -3
if [ -n "${AFTER_BUILD:-}" ]; then eval "$AFTER_BUILD"; fi
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/test_ops_gpu.py} \
  2>&1 | tee "$OUT/pytest.log" | tail -${TEST_TAIL:-25}
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize_fused.py \
      >"$OUT/sanitize-$tool.log" 2>&1; echo "compute-sanitizer $tool rc=$?"; tail -4 "$OUT/sanitize-$tool.log"
  done
fi
[ "${BENCH:-1}" = 1 ] && timeout ${BENCH_TIMEOUT:-300} python3 bench/bench_gemm.py --json "$OUT/bench.json" "$@" \
  2>&1 | tee "$OUT/bench.log"
# SUSTAIN=1: M 1024 and 4096 again, each kernel run 2 s first (the power-limited clock of a
# long prefill; bench/results-h200-sustained.json)
[ "${SUSTAIN:-0}" = 1 ] && timeout 200 python3 bench/bench_gemm.py --m 1024 4096 --no-gemlite \
  --sustain 2 --json "$OUT/sustain.json" 2>&1 | tee "$OUT/sustain.log" | tail -14
echo "total $(( $(date +%s) - t0 )) s"
