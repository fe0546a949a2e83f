#!/usr/bin/env bash
# Where a cold job's first (eager) step goes on a fresh machine. Cold starts of `diffscale train
# --preset PRESET` (empty diffscale and Triton caches, bytecode kept, CUDA libraries read once by one
# process first), in the order JOBS names them, each stopped after its first step:
#   default  compiled run: eager steps while a background process compiles (the default on a GPU)
#   one      the same with one compile worker (TORCHINDUCTOR_COMPILE_THREADS=1)
#   nobench  default without cuDNN's benchmark search (runtime.cudnn_benchmark=off)
#   heuristic  cuDNN's heuristics in the eager steps, searching once compiled (cudnn_benchmark_eager=off)
#   nojit    default with the driver's PTX JIT disabled (CUDA_DISABLE_PTX_JIT=1)
#   dropped  default after dropping the page cache (root only): every file read from disk again
# Each job starts on an empty CUDA JIT cache of its own (CUDA_CACHE_PATH; JIT_CACHE=home keeps the
# user's ~/.nv/ComputeCache), as on a fresh machine, where that cache, not the disk, made a job's
# first step 10 s later (2026-11-29, one H200: 23.8 s, against 13.0 s with the page cache dropped).
# Writes $OUT/first_step_threads.txt (the first-step line of each) and each job's train.log and
# background-compile.log as $OUT/logs.tgz (out.log: the job's lines, each with its seconds since
# launch).
# Usage (repository root): OUT=DIR bash scripts/gpu/first_step_threads.sh
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
PRESET=${PRESET:-small}; JOBS=${JOBS:-default heuristic default heuristic}; WORK=${WORK:-/tmp/diffscale-first-step}
JIT_CACHE=${JIT_CACHE:-job}
source scripts/gpu/env.sh
unset PYTHONDONTWRITEBYTECODE TORCHINDUCTOR_CACHE_DIR
export PYTHONPYCACHEPREFIX=$WORK/pycache PYTHONUNBUFFERED=1
mkdir -p "$WORK" "$OUT"
"$PY" -c "import torch, torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.training.background_compile
torch.zeros(1, device='cuda').sum().item()" > /dev/null 2>&1
one() {  # job number, label; the job is killed (its process group) once it logged its first step
  local n=$1 label=$2 dir pid; local -a env=() args=()
  case $label in
    default) ;;
    one) env=(TORCHINDUCTOR_COMPILE_THREADS=1) ;;
    nobench) args=(--set runtime.cudnn_benchmark=off) ;;
    heuristic) args=(--set runtime.cudnn_benchmark_eager=off) ;;
    nojit) env=(CUDA_DISABLE_PTX_JIT=1) ;;
    dropped) sync; echo 3 2>/dev/null > /proc/sys/vm/drop_caches \
      || { echo "$n dropped: the page cache cannot be dropped here (not root)"; return; } ;;
    *) echo "unknown job '$label' in JOBS (default, one, nobench, heuristic, nojit, dropped)"; return ;;
  esac
  dir="$WORK/job$n-$label"; rm -rf "$dir"; mkdir -p "$dir"
  [ "$JIT_CACHE" = job ] && env+=(CUDA_CACHE_PATH="$dir/nv")
  # out.log: every line with the seconds since the job's launch (where its wait goes)
  env "${env[@]}" DIFFSCALE_CACHE_DIR="$dir/cache" TRITON_CACHE_DIR="$dir/triton" T0US="${EPOCHREALTIME/./}" \
    setsid bash -c '"$0" -m diffscale train --preset "$1" --out "$2" "${@:3}" 2>&1 | while IFS= read -r line; do
      d=$(( (${EPOCHREALTIME/./} - T0US) / 10000 )); printf "%4d.%02d %s\n" $((d / 100)) $((d % 100)) "$line"
      done' "$PY" "$PRESET" "$dir/run" "${args[@]}" > "$dir/out.log" 2>&1 &
  pid=$!
  for _ in $(seq 90); do
    grep -q 'first step of this job' "$dir/run/train.log" 2>/dev/null && break
    sleep 0.5
  done
  kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  printf '%s %-8s %s\n' "$n" "$label:" "$(grep -h -m1 'first step of this job' "$dir/run/train.log" 2>/dev/null \
    || echo 'no first step in 45 s')"
}
n=0
for label in $JOBS; do n=$((n + 1)); one "$n" "$label"; done | tee "$OUT/first_step_threads.txt"
(cd "$WORK" && find . -path '*/run/train.log' -o -name 'background-compile*.log' -o -name out.log \
  | tar -czf "$OUT/logs.tgz" -T -)
