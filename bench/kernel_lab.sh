#!/usr/bin/env bash
# Builds bench/kernel_lab (bench/kernel_lab.cu: csrc/fused/'s kernels timed and checked on raw
# CUDA, no torch) for the H200, sm_90a. Here, with any CUDA >= 12.4 nvcc (NVCC=... to choose);
# the binary links the CUDA runtime statically, so it runs on the device machine as it is:
#   bash bench/kernel_lab.sh, then in a device call carrying bench/kernel_lab:
#   bench/kernel_lab --shapes 4096x22016 11008x4096 --m 1 4 16 [--pick PREFIX...] [--dequant] [--json F]
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || true)}
[ -n "$NVCC" ] || { echo "kernel_lab.sh: no nvcc on PATH; set NVCC=/path/to/nvcc (CUDA >= 12.4)" >&2; exit 2; }
ver=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
read -r major minor <<<"$ver"
if [ -z "$major" ] || [ "$major" -lt 12 ] || { [ "$major" -eq 12 ] && [ "$minor" -lt 4 ]; }; then
  echo "kernel_lab.sh: $NVCC is CUDA '$major.$minor'; sm_90a needs CUDA >= 12.4" >&2; exit 2
fi
flags=(-std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc)
if [ -n "${LAB_COMPILE_ONLY:-}" ]; then
  # kernel_lab.cu alone, to an object (nox -s kernel-lab, .ci/run): the templates it
  # instantiates with its own parameters still compile; csrc's own files are the wheel's
  "$NVCC" "${flags[@]}" -c bench/kernel_lab.cu -o "$LAB_COMPILE_ONLY"
  echo "bench/kernel_lab.cu compiled to $LAB_COMPILE_ONLY with $NVCC (CUDA $major.$minor)"
  exit 0
fi
"$NVCC" "${flags[@]}" bench/kernel_lab.cu csrc/pack.cu csrc/fused/*.cu \
  -o "${LAB_OUT:-bench/kernel_lab}"
echo "${LAB_OUT:-bench/kernel_lab} built with $NVCC (CUDA $major.$minor)"
