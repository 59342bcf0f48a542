#!/bin/bash
# One device call: ternary._C of target h200 built as PTX of one arch (`--ptx-arch`, against
# the host torch and nvcc), JIT-compiled by the driver, then PTX_STEPS (default: test doctor
# sanitize bench smoke; smoke needs vLLM set up by the parts calls first). The H200 then runs
# the A100 (8.0) or RTX 4090 (8.9) code path (docs/build.md, PTX builds). Results and logs
# land in $OUT like every tools/h200 stage (it is serve-and-bench.sh's `ptx` stage).
# Usage, with the device tool's timeout_s 600:  PTX_ARCH=8.9 bash tools/h200/ptx.sh
exec bash "$(dirname "$0")/serve-and-bench.sh" ptx
