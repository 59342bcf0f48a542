#!/usr/bin/env bash
# Packs vLLM 0.26.0 for the H200 machine (no registry there) into .vllm-parts/1 ... N of this
# checkout, with the team's shared pack script; .vllm-parts is git-ignored, so each device
# call names one part in its `carry` (tools/h200/README.md gives the call sequence).
#   usage: tools/h200/pack.sh [OUTDIR]      (default: <repo>/.vllm-parts)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/.vllm-parts}
pack=""
for cand in "${VLLM_GPU_PACK:-}" "$repo/shared/tools/vllm-gpu-pack.sh" "$repo/../shared/tools/vllm-gpu-pack.sh"; do
  if [ -n "$cand" ] && [ -x "$cand" ]; then pack=$cand; break; fi
done
if [ -z "$pack" ]; then
  echo "tools/h200/pack.sh: vllm-gpu-pack.sh not found in \$VLLM_GPU_PACK, $repo/shared/tools" \
       "or $repo/../shared/tools; set VLLM_GPU_PACK=/path/to/vllm-gpu-pack.sh" >&2
  exit 2
fi
start=$(date +%s)
"$pack" "$out"
n=$(find "$out" -mindepth 1 -maxdepth 1 -type d | wc -l)
echo
printf '%-6s %12s  %s\n' part bytes files
for i in $(seq 1 "$n"); do
  bytes=$(du -sb "$out/$i" | cut -f1)
  printf '%-6s %12s  %s\n' "$i" "$bytes" "$(find "$out/$i" -type f | wc -l)"
  if [ "$bytes" -ge $((40 * 1024 * 1024)) ]; then
    echo "tools/h200/pack.sh: $out/$i is $bytes bytes, over the 40 MiB a device call can carry" \
         "beside the working tree; lower the split size in $pack" >&2
    exit 1
  fi
done
# the plugin's own extra dependencies ride in the last part (extra-deps.txt says why)
PIP_CONSTRAINT= python3 -m pip download -q --no-deps --require-hashes --only-binary=:all: \
  --python-version 3.12 --implementation cp -d "$out/$n/extra" -r "$repo/tools/h200/extra-deps.txt"
# the last part carries a manifest, so the setup call can name a part lost between calls
(cd "$out" && find . -name 'part.*' -type f | sort | sed 's|^\./||' | xargs sha256sum) > "$out/$n/manifest.sha256"
echo "$n parts in $out ($(( $(date +%s) - start )) s); device calls: see tools/h200/README.md"
