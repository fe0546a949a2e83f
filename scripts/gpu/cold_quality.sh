#!/usr/bin/env bash
# Time to the plain recipe's quality from a cold start, on one GPU (python -m benchmarks.cold_quality):
# the plain recipe trained SECONDS (240), then `diffscale train --preset PRESET` (small) on an empty
# cache, stopped SECONDS after its command started, each checkpoint scored as quality_time scores.
# Bytecode is kept first (torch's installation may ship none), so the cold start pays the compile,
# not Python's. About 9 minutes at the defaults; two calls where one cannot hold it: PART=plain
# trains the plain recipe into $OUT/plain, then PART=cold PLAIN_JSON=FILE (that call's
# quality_time.json, carried into the tree) the cold run and the scores; or both in one call on a
# two-GPU machine, side by side, each pinned to a GPU and half the cores (CUDA_VISIBLE_DEVICES=N
# taskset -c ...): PART=plain OUT=P on one, PART=cold PLAIN_JSON=P/plain/quality_time.json on the
# other (read once the cold run is scored).
# Writes $OUT/cold_quality.json and .md (the plain recipe's quality_time.json under $OUT/plain).
# Usage (repository root): OUT=DIR bash scripts/gpu/cold_quality.sh
# Settings (environment): PRESET (small), SECONDS_EACH (240), CHECKPOINT_EVERY (200), PART (all, plain,
# cold), PLAIN_JSON, WORK (/tmp/diffscale-cold-quality), SMOKE=1 (the tiny preset's micro network on a
# CPU for 20 s: a dry run; its figures mean nothing).
set -euo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${WORK:-/tmp/diffscale-cold-quality}
PRESET=${PRESET:-small}; SECONDS_EACH=${SECONDS_EACH:-240}; CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-200}
PART=${PART:-all}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
export PYTHONUNBUFFERED=1
ARGS=(--preset "$PRESET" --seconds "$SECONDS_EACH" --evals 2)  # both runs' (quality_time's and cold_quality's)
if [ "${SMOKE:-0}" = 1 ]; then
  CHECKPOINT_EVERY=50
  ARGS=(--preset tiny --seconds 20 --evals 1 --count 16 --eval-steps 2 --set model.sample_size=8
        --set "model.block_out_channels=[8]" --set "model.attention=[false]" --set model.layers_per_block=1
        --set model.norm_num_groups=8 --set train.batch_per_gpu=8)
fi
mkdir -p "$OUT" "$WORK"
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$WORK/pycache}
"$PY" -c "import torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.training.background_compile" \
  > "$OUT/bytecode.log" 2>&1
if [ "$PART" = plain ]; then
  exec "$PY" -m benchmarks.quality_time "${ARGS[@]}" --recipe plain --out "$OUT/plain"
fi
ARGS+=(--checkpoint-every "$CHECKPOINT_EVERY")
if [ "$PART" = cold ]; then
  ARGS+=(--plain-json "${PLAIN_JSON:?PART=cold needs PLAIN_JSON, the quality_time.json of the plain call}")
fi
"$PY" -m benchmarks.cold_quality "${ARGS[@]}" --out "$WORK/out"
cp "$WORK/out/cold_quality.json" "$WORK/out/cold_quality.md" "$OUT/"
[ -f "$WORK/out/plain/quality_time.json" ] && mkdir -p "$OUT/plain" && cp "$WORK/out/plain/quality_time.json" "$OUT/plain/"
provenance | tee -a "$OUT/cold_quality.md"
