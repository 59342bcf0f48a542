#!/usr/bin/env bash
# One of the calls that bring vLLM's parts to the H200 (tools/h200/README.md): copies
# .vllm-parts/N (named in the call's `carry`) into /tmp/vllm-parts, says which parts the
# machine now holds, then runs the given stages of serve-and-bench.sh in the same call so
# its time is not spent on copying alone.
#
#   bash tools/h200/part.sh N [STAGE ...]      e.g. part.sh 1 build; part.sh 2 models
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/h200/lib.sh
source "$here/lib.sh"
n=${1:?usage: tools/h200/part.sh N [STAGE ...]}
shift
src=$REPO/.vllm-parts/$n
if [ ! -d "$src" ]; then
  echo "part.sh: $src is not here; name .vllm-parts/$n in the device call's carry" \
       "(made by tools/h200/pack.sh)" >&2
  exit 2
fi
mkdir -p /tmp/vllm-parts
cp "$src"/part.* /tmp/vllm-parts/ 2>/dev/null || true
echo "part $n: /tmp/vllm-parts holds $(cd /tmp/vllm-parts && ls part.* 2>/dev/null | tr '\n' ' ')"
[ $# -eq 0 ] && exit 0
exec bash "$here/serve-and-bench.sh" "$@"
