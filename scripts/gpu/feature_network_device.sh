#!/usr/bin/env bash
# The evaluation's feature network trained on the GPU against one trained on the CPU: one run of
# PRESET on a suite set, evaluated with each (FD beside the data's own), the GPU's trained twice from
# an empty cache (deterministic: the same scores?), and the GPU's training time at 128 px, 3 channels
# (twice: are the two networks' weights identical?). NETWORK_ONLY=1: that last part alone.
# CPU_FEATURES=FILE: the CPU's network as a tarball of a cache's quality/ folder (`python -m
# benchmarks.suite.defaults ... --data-dir /tmp/w/data --prepare-features`); else built here.
# Usage (repository root): OUT=DIR [NETWORK_ONLY=1] [PRESET=medium] [SET=flat] [STEPS=300] [CPU_FEATURES=FILE] \
#   bash scripts/gpu/feature_network_device.sh
set -euo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
PRESET=${PRESET:-medium} SET=${SET:-flat} STEPS=${STEPS:-300}
source scripts/gpu/env.sh
mkdir -p "$OUT"
if [ "${NETWORK_ONLY:-0}" != 1 ]; then
  mkdir -p /tmp/w/data /tmp/fcache/cpu
  "$PY" -m benchmarks.suite.generate --out /tmp/w/data --sets "$SET" > "$OUT/generate.log"
  DATA=npz:$(ls /tmp/w/data/images-"$SET"-n*-seed0.npz)
  if [ -n "${CPU_FEATURES:-}" ]; then tar -xzf "$CPU_FEATURES" -C /tmp/fcache/cpu
  else DIFFSCALE_CACHE_DIR=/tmp/fcache/cpu "$PY" -m benchmarks.suite.defaults --preset "$PRESET" --sets "$SET" \
    --seeds 1 --out /tmp/fprep --data-dir /tmp/w/data --prepare-features > "$OUT/prepare.log" 2>&1; fi
  RUN=/tmp/fnrun
  rm -rf "$RUN" /tmp/fcache/gpu1 /tmp/fcache/gpu2
  DIFFSCALE_CACHE_DIR=/tmp/fcache/train "$PY" -m diffscale train --preset "$PRESET" --data "$DATA" --out "$RUN" \
    --set train.steps="$STEPS" --set runtime.compile=off > "$OUT/train.log" 2>&1
  for cache in cpu gpu1 gpu2; do
    DIFFSCALE_CACHE_DIR=/tmp/fcache/$cache "$PY" -m diffscale eval "$RUN" --json > "$OUT/eval-$cache.json" \
      2> "$OUT/eval-$cache.err"
    echo "$cache: $(grep 'feature network' "$OUT/eval-$cache.err" | tr '\n' ' ')"
    "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print(' fd', r['fd'], 'data vs data', r['reference_fd'],
    'accuracy', r['feature_net_accuracy'])" "$OUT/eval-$cache.json"
  done
fi
"$PY" - <<'PY'
import tempfile, time
from pathlib import Path
import torch
from safetensors.torch import load_file
from diffscale.tasks.images import quality
images = torch.randint(0, 256, (5000, 3, 128, 128), dtype=torch.uint8)
labels = torch.randint(0, 10, (5000,))
with tempfile.TemporaryDirectory() as d:
    for name in ("first", "second"):  # the second also without CUDA's first-use costs
        start = time.perf_counter()
        quality.trained_features(images, labels, Path(d) / f"{name}.safetensors", device=torch.device("cuda"))
        print(f"128 px, 3 channels, 5,000 images on the GPU: {time.perf_counter() - start:.1f} s")
    first, second = (load_file(str(Path(d) / f"{n}.safetensors")) for n in ("first", "second"))
    same = all(torch.equal(first[k], second[k]) for k in first)
    print("the two trainings' weights:", "identical" if same else "differ, largest difference "
          f"{max(float((first[k].float() - second[k].float()).abs().max()) for k in first):.3g}")
PY
provenance
