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
# xl was just under 3x (docs/benchmarks.md 10): the same with NCHW activations, which trained
# faster when compiled; its own file, so the table above is unchanged.
timeout 200 python3 -m diffscale.bench.sampling --preset xl --batch 16 --steps 50 --repeats 3 \
  --set runtime.channels_last=off --json "$OUT_DIR/sampling-xl-nchw.json" >> "$OUT_DIR/sampling.log" 2>&1
