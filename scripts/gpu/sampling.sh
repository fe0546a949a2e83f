#!/usr/bin/env bash
# DDIM 50-step sampling: the network as `diffscale sample` runs it vs diffusers' DDIMPipeline
# (same UNet, batch and card). Usage: bash scripts/gpu/sampling.sh OUT_DIR
set -uo pipefail
OUT_DIR="${1:-/tmp/diffscale-sampling}"
mkdir -p "$OUT_DIR"
source scripts/gpu/env.sh
for pb in "small 256" "medium 64" "xl 16"; do
  set -- $pb
  timeout 200 python3 -m diffscale.bench.sampling --preset $1 --batch $2 --steps 50 --repeats 3 \
    --json "$OUT_DIR/sampling-$1.json" >> "$OUT_DIR/sampling.log" 2>&1
done
