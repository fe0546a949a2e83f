#!/usr/bin/env bash
# Streaming vs resident training on one GPU: N generated 128 px JPEGs (an image folder), decoded
# once into the cache, then PRESETS trained STEPS steps with data.resident on and off; prints the
# median samples/s of the logged windows after the first, and the host RSS of the rank and its
# loader workers. Usage: bash scripts/gpu/streaming.sh [N] [STEPS] [PRESETS]
# (EXTRA="--set ..." adds to every train command, e.g. a CPU dry run with a small batch).
set -euo pipefail
N=${1:-200000}; STEPS=${2:-300}; PRESETS=${3:-"medium xl"}
WORK=${WORK:-/tmp/diffscale-streaming}; export DIFFSCALE_CACHE_DIR=$WORK/cache
PY=${PYTHON:-python}
mkdir -p "$WORK/runs"
if [ ! -d "$WORK/imgs" ]; then
  $PY - "$WORK/imgs" "$N" <<'PYEOF'
import sys
from multiprocessing import Pool
from pathlib import Path
import numpy as np
from PIL import Image
root, n = Path(sys.argv[1]), int(sys.argv[2])
def make(i):
    d = root / f"c{i % 10}"; d.mkdir(parents=True, exist_ok=True)
    base = np.random.default_rng(i).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(base).resize((128, 128), Image.BILINEAR).save(d / f"{i:07d}.jpg", quality=90)
with Pool() as pool:
    pool.map(make, range(n), chunksize=512)
PYEOF
fi
for preset in $PRESETS; do
  for resident in on off; do
    out=$WORK/runs/$preset-$resident; rm -rf "$out"
    start=$(date +%s.%N)
    $PY -m diffscale train --preset "$preset" --data "imagefolder:$WORK/imgs" --out "$out" \
      --set data.resident=$resident --set train.steps=$STEPS --set train.log_every=25 \
      --set train.checkpoint_every=100000 --set train.sample_count=4 --set train.sample_steps=2 ${EXTRA:-} \
      > "$out.log" 2>&1 &
    pid=$!; peak_rank=0; peak_workers=0
    while kill -0 $pid 2>/dev/null; do
      rank=$(ps -o rss= -p $pid 2>/dev/null || echo 0); rank=${rank:-0}; peak_rank=$(( rank > peak_rank ? rank : peak_rank ))
      w=$( (ps -o rss= --ppid $pid 2>/dev/null || true) | sort -n | tail -1); w=${w:-0}; peak_workers=$(( w > peak_workers ? w : peak_workers ))
      sleep 2
    done
    wait $pid || { tail -5 "$out.log"; exit 1; }
    grep -m1 "^diffscale |" "$out.log" | sed 's/.*| data /  data /'
    $PY - "$out/metrics.jsonl" "$preset" "$resident" "$peak_rank" "$peak_workers" "$start" <<'PYEOF'
import json, statistics, sys, time
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples_per_s"' in l]
sps = statistics.median(r["samples_per_s"] for r in rows[1:]) if len(rows) > 1 else float("nan")
print(f"{sys.argv[2]} resident={sys.argv[3]}: {sps:.1f} samples/s (median of {len(rows) - 1} windows), "
      f"host RSS rank {int(sys.argv[4]) / 2**20:.2f} GiB, largest worker {int(sys.argv[5]) / 2**20:.2f} GiB, "
      f"wall {time.time() - float(sys.argv[6]):.0f} s")
PYEOF
  done
done
