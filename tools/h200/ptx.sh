#!/bin/bash
# One device call: ternary._C of target h200 built as PTX of one arch (`--ptx-arch`, against
# the host torch and nvcc), its GPU tests, then `ternary doctor` (which times the driver's
# JIT). The H200 then runs the A100 (8.0) or RTX 4090 (8.9) code path (docs/build.md, PTX
# builds). Every GPU test of the suite runs (test-<target> runs tests/). Logs land in $OUT.
# Usage, with the device tool's timeout_s at least 240:  PTX_ARCH=8.0 bash tools/h200/ptx.sh
set -o pipefail
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
OUT=${OUT:-/tmp/ternary-ptx}; mkdir -p "$OUT"
ARCH=${PTX_ARCH:-8.0}
export TERNARY_VENVS=${TERNARY_VENVS:-/tmp/ternary-ptx-venvs}
t0=$(date +%s)
timeout "${TEST_TIMEOUT:-150}" python3 -m ternary._build.pipeline test h200 --host-torch \
  --toolchain system --ptx-arch "$ARCH" -- -q -m gpu -p no:cacheprovider \
  2>&1 | tee "$OUT/ptx-$ARCH.log" | grep -vE '^\[[0-9]+/[0-9]+\] ' | tail -"${TAIL:-45}"
echo "build + tests rc=${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s"
timeout "${DOCTOR_TIMEOUT:-45}" "$TERNARY_VENVS/h200-host/bin/python" -P -m ternary doctor \
  2>&1 | tee "$OUT/doctor-$ARCH.log" | grep -E "gpu0|ternary._C|kernel"
echo "total $(( $(date +%s) - t0 )) s"
