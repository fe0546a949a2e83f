#!/usr/bin/env bash
# Streamed vs resident training on one GPU: IMAGES generated JPEGs (an image folder), decoded once
# into the cache at each preset's resolution, then each of PRESETS trained STEPS steps with
# data.resident on and off. Prints per run the median samples/s and data-wait share of the logged
# windows after the first, the run's end summary of its data wait, and the peak host RSS (and PSS)
# of the rank and of each loader worker; then streamed vs resident samples/s per preset.
# Usage (repository root): bash scripts/gpu/streaming.sh [IMAGES] [STEPS] [PRESETS] [options]
#   IMAGES (default 200000) sets the data size: the decoded GiB per preset are printed first;
#   PRESETS e.g. "medium xl"; options of python -m benchmarks.streaming follow, e.g.
#   --resident off (data larger than the GPU), --workers 4, --side 64, --json OUT.json,
#   --set KEY=VALUE (every run). WORK=DIR keeps the images and runs (default /tmp/diffscale-streaming).
# CPU dry run: bash scripts/gpu/streaming.sh 200 6 tiny --side 32 --log-every 2 --set train.batch_per_gpu=8
set -euo pipefail
N=${1:-200000}; STEPS=${2:-300}; PRESETS=${3:-"medium xl"}
shift $(( $# < 3 ? $# : 3 ))
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package, and benchmarks/ at the root
# shellcheck disable=SC2086  # PRESETS and EXTRA are word lists
exec "${PYTHON:-python3}" -m benchmarks.streaming --images "$N" --steps "$STEPS" --preset $PRESETS \
  --work "${WORK:-/tmp/diffscale-streaming}" ${EXTRA:-} "$@"
