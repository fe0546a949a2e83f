#!/usr/bin/env bash
# Training while the step compiles (runtime.compile_while_training), in one call on one GPU
# (about 8 minutes on one H200): for each preset, on an empty cache of its own (kernels, Triton's,
# the traced network, built-in data), a cold start, a warm new run as it starts by default (compiled
# before its first step, from the whole build the cold start left) and one eager first, each timed from the
# command's start to its first optimizer step and to the compiled speed, with the steady samples/s
# after the switch against the run compiled from the start (python -m benchmarks.compile_while_training).
# Bytecode is kept first (torch's installation may ship none), so the cold starts pay the compile,
# not Python's. Writes $OUT/compile_while_training.json, $OUT/summary.txt and each job's log.
# Usage (repository root):
#   OUT=DIR bash scripts/gpu/compile_while_training.sh
# Settings (environment): PRESETS (small medium), SETS (config overrides of every job, space-separated,
# e.g. "runtime.cudnn_benchmark_eager=off"), COLD_COMPILED=1 (also a cold job compiled before its first
# step, on an empty cache of its own: the cold start as before), ALONE=1 (also the background compile
# by itself on an idle GPU: what the eager steps beside it cost it), WINDOWS (5: steady windows a job logs), JOB_LIMIT_S
# (240), BUDGET_S (530: the whole call's limit), WORK (/tmp/diffscale-compile-while-training),
# SMOKE=1 (the one-level micro UNet compiled on a CPU: a dry run in a few minutes; its figures mean nothing).
# Not in this call (it does not fit beside cold starts of small and medium): the time to the plain
# recipe's 240-s FD, which takes the plain recipe's 240 s of training and the evaluations.
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${WORK:-/tmp/diffscale-compile-while-training}
PRESETS=${PRESETS:-small medium}
WINDOWS=${WINDOWS:-5}
JOB_LIMIT_S=${JOB_LIMIT_S:-240}
BUDGET_S=${BUDGET_S:-530}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
export PYTHONUNBUFFERED=1
EXTRA=()
for item in ${SETS:-}; do EXTRA+=(--set "$item"); done
[ "${COLD_COMPILED:-0}" = 1 ] && EXTRA+=(--cold-compiled)
[ "${ALONE:-0}" = 1 ] && EXTRA+=(--background-alone)
if [ "${SMOKE:-0}" = 1 ]; then
  PRESETS=tiny
  EXTRA+=(--set runtime.compile=on --set runtime.compile_while_training=on --set model.sample_size=8
         --set "model.block_out_channels=[8]" --set "model.attention=[false]" --set model.layers_per_block=1
         --set model.norm_num_groups=8 --set train.batch_per_gpu=8 --set train.log_every=20
         --set train.steps=1000000)  # tiny's 1,200 eager steps end before the CPU has compiled
  export TORCHINDUCTOR_VEC_ISA_OK=1 OMP_NUM_THREADS=1
fi
mkdir -p "$OUT" "$WORK"
START=$(date +%s)

# Bytecode kept once, outside the caches the jobs start empty.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$WORK/pycache}
"$PY" -c "import torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.training.background_compile" \
  > "$OUT/bytecode.log" 2>&1
echo "bytecode kept in $(( $(date +%s) - START )) s"

P=()
for preset in $PRESETS; do P+=(--preset "$preset"); done
left=$(( BUDGET_S - ($(date +%s) - START) ))
timeout -k 15 "$left" "$PY" -m benchmarks.compile_while_training "${P[@]}" "${EXTRA[@]}" --windows "$WINDOWS" \
  --limit "$JOB_LIMIT_S" --work "$WORK/runs" --out "$OUT"
rc=$?
[ "$rc" = 124 ] && echo "stopped at the call's budget of ${BUDGET_S} s: the presets measured so far are in $OUT" \
  | tee -a "$OUT/summary.txt"
echo "== $(( $(date +%s) - START )) s in all (exit $rc)"
provenance | tee -a "$OUT/summary.txt"
cat "$OUT/summary.txt"
exit "$rc"
