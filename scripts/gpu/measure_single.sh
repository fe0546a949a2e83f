#!/usr/bin/env bash
# One GPU, nothing else running on the host: fast vs plain for each preset, in sequence.
# Usage: bash scripts/gpu/measure_single.sh OUT_DIR [PRESETS...]
set -uo pipefail
OUT_DIR="${1:-/tmp/diffscale-gpu1}"; shift || true
PRESETS="${*:-small medium xl}"
mkdir -p "$OUT_DIR"
source scripts/gpu/env.sh
nvidia-smi -L > "$OUT_DIR/host.txt"; date -u >> "$OUT_DIR/host.txt"
python3 -m diffscale bench --preset $PRESETS --gpus 1 --recipe fast,plain --steps 30 --warmup 15 --peak \
  --timeout 400 --out "$OUT_DIR/bench" > "$OUT_DIR/bench.log" 2>&1
echo done > "$OUT_DIR/DONE"
