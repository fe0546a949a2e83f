#!/usr/bin/env bash
# GPU measurements recorded in docs/benchmarks.md. Runs on a GPU host from the repo root:
#   bash scripts/gpu/measure.sh OUT_DIR [PRESETS...]
# The host's PyTorch is used; wheels in .whl/ (diffusers) are installed to /tmp/site if present.
set -uo pipefail
OUT_DIR="${1:-/tmp/diffscale-gpu}"; shift || true
PRESETS="${*:-small medium xl}"
mkdir -p "$OUT_DIR"
source scripts/gpu/env.sh
{
  date -u; nvidia-smi -L
  python3 -c "import torch, diffusers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'gpus', torch.cuda.device_count())"
} > "$OUT_DIR/host.txt" 2>&1
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
GPUS=1; [ "$NGPU" -ge 2 ] && GPUS=1,2; [ "$NGPU" -ge 4 ] && GPUS=1,2,4
TWO=""; [ "$NGPU" -ge 4 ] && TWO="--two-node 2"
# One short real training run per preset through the user-facing CLI (checkpoint + grid on GPU).
for p in small medium; do
  python3 -m diffscale train --preset "$p" --out "/tmp/train-$p" --set train.steps=60 --set train.log_every=20 \
    --set train.checkpoint_every=60 --set train.sample_count=16 > "$OUT_DIR/train-$p.log" 2>&1
  cp "/tmp/train-$p/samples/latest.png" "$OUT_DIR/train-$p.png" 2>/dev/null
done
python3 -m diffscale bench --preset $PRESETS --gpus "$GPUS" $TWO --recipe fast,plain --steps 30 --warmup 15 \
  --peak --timeout 300 --out "$OUT_DIR/bench" > "$OUT_DIR/bench.log" 2>&1
for p in $PRESETS; do
  b=256; [ "$p" = medium ] && b=64; [ "$p" = xl ] && b=16
  python3 -m diffscale.bench.sampling --preset "$p" --batch $b --steps 50 --repeats 2 \
    --json "$OUT_DIR/bench/sampling-$p.json" >> "$OUT_DIR/sampling.log" 2>&1
done
echo done > "$OUT_DIR/DONE"
