#!/usr/bin/env bash
# Does the background compile slow a cold job's first (eager) step by taking the CPU? Cold starts
# of `diffscale train --preset PRESET` (empty diffscale and Triton caches, bytecode kept, CUDA
# libraries already read once), alternately with the background compile's default workers and with
# one (TORCHINDUCTOR_COMPILE_THREADS=1), each stopped after its first step; the first-step line of each.
# ONE_WORKER=0: the default workers only. Writes $OUT/first_step_threads.txt. Usage (repository root): OUT=DIR bash scripts/gpu/first_step_threads.sh
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
PRESET=${PRESET:-small}; REPEATS=${REPEATS:-2}; WORK=${WORK:-/tmp/diffscale-first-step}
source scripts/gpu/env.sh
unset PYTHONDONTWRITEBYTECODE TORCHINDUCTOR_CACHE_DIR
export PYTHONPYCACHEPREFIX=$WORK/pycache PYTHONUNBUFFERED=1
"$PY" -c "import torch, torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.training.background_compile
torch.zeros(1, device='cuda').sum().item()" > /dev/null 2>&1
one() {  # label, then env assignments; the job is killed (its process group) once it logged its first step
  local label=$1 dir pid; shift; dir=$(mktemp -d "$WORK/run.XXXX")
  env "$@" DIFFSCALE_CACHE_DIR="$dir/cache" TRITON_CACHE_DIR="$dir/triton" \
    setsid "$PY" -m diffscale train --preset "$PRESET" --out "$dir/run" > "$dir/out.log" 2>&1 &
  pid=$!
  for _ in $(seq 90); do
    grep -q 'first step of this job' "$dir/run/train.log" 2>/dev/null && break
    sleep 0.5
  done
  kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  echo "$label: $(grep -h -m1 'first step of this job' "$dir/run/train.log" 2>/dev/null || echo 'no first step in 45 s')"
}
mkdir -p "$WORK" "$OUT"
for _ in $(seq "$REPEATS"); do
  one "default compile workers"
  [ "${ONE_WORKER:-1}" = 1 ] && one "one compile worker     " TORCHINDUCTOR_COMPILE_THREADS=1
done | tee "$OUT/first_step_threads.txt"
