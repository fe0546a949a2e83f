#!/usr/bin/env bash
# Time to quality over a longer budget on two GPUs of one host: the plain recipe on GPU 0 and
# diffscale's defaults on GPU 1 at the same time (two processes; one feature network, trained first
# and shared, so both score in the same feature space), SECONDS_EACH of training each, FD along the
# way (python -m diffscale.bench.quality_time --recipe plain|fast). Usage (repository root):
#   OUT=DIR bash scripts/gpu/quality_side_by_side.sh
# Settings (environment): PRESET (small), SECONDS_EACH (260), EVALS (8), LIMIT_S (540: each
# process's time limit), EXTRA (more quality_time options for both and for the feature network's
# preparation, e.g. "--raw-weights"). $OUT/plain/ and $OUT/fast/ get each run's
# quality_time.json, .md and .png; the summary against the plain recipe is
#   python -m diffscale.bench.quality_time --merge $OUT/plain/quality_time.json $OUT/fast/quality_time.json
# A dry run on a CPU (figures mean nothing): PRESET=tiny SECONDS_EACH=3 EVALS=2 EXTRA="--count 32
# --eval-steps 3 --plain-workers 0 --set train.batch_per_gpu=16 --set model.block_out_channels=[16,32,32]".
set -u
OUT=${OUT:?set OUT to the folder the results go to}
nvidia-smi -L 2>/dev/null; date -u
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/diffscale-pycache} PYTHONUNBUFFERED=1
export DIFFSCALE_CACHE_DIR=${DIFFSCALE_CACHE_DIR:-/tmp/diffscale-quality-cache}
PRESET=${PRESET:-small}; SECONDS_EACH=${SECONDS_EACH:-260}; EVALS=${EVALS:-8}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
mkdir -p "$OUT"
"$PY" -c "import torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.bench.worker" >/dev/null 2>&1
"$PY" -m diffscale.bench.quality_time --preset "$PRESET" --features-only "${EXTRA_ARGS[@]}"
for recipe in plain fast; do
  gpu=0; [ "$recipe" = fast ] && gpu=1
  CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_CACHE_DIR=/tmp/diffscale-inductor-$recipe \
    TRITON_CACHE_DIR=/tmp/diffscale-triton-$recipe timeout "${LIMIT_S:-540}" \
    "$PY" -m diffscale.bench.quality_time --preset "$PRESET" --recipe "$recipe" --seconds "$SECONDS_EACH" \
    --evals "$EVALS" "${EXTRA_ARGS[@]}" --out "$OUT/$recipe" > "$OUT/$recipe.log" 2>&1 &
done
wait
date -u
"$PY" -m diffscale.bench.quality_time --merge "$OUT/plain/quality_time.json" "$OUT/fast/quality_time.json" \
  | tee "$OUT/summary.md"
