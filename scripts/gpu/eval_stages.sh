#!/usr/bin/env bash
# Where a `diffscale eval` of a suite run spends its time, on an empty cache (kernels, feature
# networks): for each set, a short run of PRESET trained eager, then three evaluations of COUNT
# samples one after another, each timed from the command's start to its end with the stages it says
# on stderr (feature network trained, sampling network compiled): eager with a cold feature network
# cache, compiled on a cold kernel cache (the run's config set to runtime.compile on), compiled again
# (warm) and as a run evaluates by default (runtime.compile auto: eager for a job's first 30 s).
# Writes $OUT/summary.txt and each command's log.
# Usage (repository root): OUT=DIR [SETS="textures strokes"] [PRESET=small] [STEPS=100] [COUNT=256]
#   bash scripts/gpu/eval_stages.sh     (SMOKE=1: tiny on the CPU, a dry run; its figures mean nothing)
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${WORK:-/tmp/diffscale-eval-stages}
SETS=${SETS:-textures strokes}
PRESET=${PRESET:-small}
STEPS=${STEPS:-100}
COUNT=${COUNT:-256}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
export PYTHONUNBUFFERED=1 DIFFSCALE_CACHE_DIR="$WORK/cache" TORCHINDUCTOR_CACHE_DIR="$WORK/inductor"
EXTRA=()
[ "${SMOKE:-0}" = 1 ] && EXTRA+=(--set model.sample_size=16)
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK"
# shellcheck disable=SC2086  # SETS is a list of names
"$PY" -m benchmarks.suite.generate --out "$WORK/data" --sets $SETS > "$OUT/generate.log" 2>&1 || exit 1

timed() {  # timed LABEL LOG COMMAND...: the command's seconds and its stage lines, into the summary
  local label=$1 log=$2 start end code
  shift 2
  start=$(date +%s.%N)
  "$@" > "$log" 2>&1
  code=$?
  end=$(date +%s.%N)
  awk -v l="$label" -v c="$code" -v a="$start" -v b="$end" 'BEGIN {printf "%-34s exit %3d  %7.1f s\n", l, c, b - a}' \
    >> "$OUT/summary.txt"
  grep -E "^(feature network|sampling network):" "$log" | sed 's/^/    /' >> "$OUT/summary.txt"
  grep -E '^\{' "$log" | tail -1 | cut -c1-200 | sed 's/^/    /' >> "$OUT/summary.txt"
}

for set in $SETS; do
  run="$WORK/runs/$set"
  data=$(ls "$WORK/data"/images-"$set"-n*-seed0.npz)
  timed "$set: train $STEPS steps eager" "$OUT/$set-train.log" "$PY" -m diffscale train --preset "$PRESET" \
    --out "$run" --set "data.source=npz:$data" --set "train.steps=$STEPS" --set runtime.compile=off "${EXTRA[@]}"
  timed "$set: eval eager, cold features" "$OUT/$set-eval-eager.log" "$PY" -m diffscale eval "$run" --json --count "$COUNT"
  sed -i "s/^  compile: 'off'$/  compile: 'on'/" "$run/config.yaml"
  grep -q "^  compile: 'on'$" "$run/config.yaml" || { echo "$set: config.yaml has no compile line to set" >> "$OUT/summary.txt"; exit 1; }
  timed "$set: eval compiled, cold kernels" "$OUT/$set-eval-cold.log" "$PY" -m diffscale eval "$run" --json --count "$COUNT"
  timed "$set: eval compiled, warm kernels" "$OUT/$set-eval-warm.log" "$PY" -m diffscale eval "$run" --json --count "$COUNT"
  sed -i "s/^  compile: 'on'$/  compile: auto/" "$run/config.yaml"
  timed "$set: eval as by default (auto)" "$OUT/$set-eval-auto.log" "$PY" -m diffscale eval "$run" --json --count "$COUNT"
done
provenance >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
