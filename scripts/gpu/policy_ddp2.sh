#!/usr/bin/env bash
# Policy DDP scaling at 2 GPUs: the reference-size `policy` preset on 1 and on 2 GPUs, each twice
# (the second a `--variant again` of the same defaults, so the 1-GPU spread shows), compiled side
# by side and timed one at a time, with each rank's communication and idle time (--profile 5).
# Needs a host with 2 GPUs (NVLink); NVLink multicast off, as every recorded figure was measured.
# Usage (repository root): bash scripts/gpu/policy_ddp2.sh OUT_DIR [more diffscale bench options]
#   e.g. --dry-run to print the runs without starting them (works without a GPU).
# Prints diffscale bench's table (scaling of each 2-GPU run against its own 1-GPU run) and the
# scaling of each 2-GPU run against the mean of the two 1-GPU runs.
set -euo pipefail
OUT=${1:?usage: bash scripts/gpu/policy_ddp2.sh OUT_DIR [diffscale bench options]}; shift
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
DRY=0; for a in "$@"; do [ "$a" = --dry-run ] && DRY=1; done
if [ $DRY = 1 ] && [ "$("$PY" -c "import torch; print(torch.cuda.device_count())")" = 0 ]; then
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}  # a dry run without GPUs plans for a 2-GPU host
fi
"$PY" -m diffscale bench --preset policy --gpus 1,2 --recipe fast --steps 100 --warmup 30 --profile 5 \
  --variant again --concurrent 4 --out "$OUT" "$@"
[ $DRY = 1 ] && exit 0
"$PY" - "$OUT/bench.json" <<'PYEOF'
import json, statistics, sys
records = json.load(open(sys.argv[1]))
one = [r for r in records if r["world_size"] == 1]
two = [r for r in records if r["world_size"] == 2]
if not one or not two:
    sys.exit("missing 1-GPU or 2-GPU records")
mean = statistics.fmean(r["samples_per_s"] for r in one)
def steps(rows):
    return ", ".join("%.2f" % (r["step_s"] * 1e3) for r in rows)
print(f"1 GPU: {steps(one)} ms a step; 2 GPUs: {steps(two)} ms a step")
for r in two:
    label = " (%s)" % r["label"] if r.get("label") else ""
    print(f"2 GPUs{label}: {r['samples_per_s']:.0f} samples/s, scaling "
          f"{r['scaling_efficiency']:.1%} against its own 1-GPU run, {r['samples_per_s'] / (2 * mean):.1%} against "
          f"the mean of the {len(one)} 1-GPU runs (target >= 95 %)")
PYEOF
