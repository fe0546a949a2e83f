#!/usr/bin/env bash
# Policy DDP scaling: the reference-size `policy` preset on 1 and on GPUS GPUs (default 2), each twice
# (the second a `--variant again` of the same defaults, so the 1-GPU spread shows), compiled side
# by side and timed one at a time, with each rank's communication and idle time (--profile 5).
# Needs a host with GPUS GPUs (NVLink); NVLink multicast off, as every recorded figure was measured.
# Usage (repository root): [GPUS=4] bash scripts/gpu/policy_ddp.sh OUT_DIR [more diffscale bench options]
#   e.g. --dry-run to print the runs without starting them (works without a GPU).
# Prints diffscale bench's table (scaling of each GPUS-GPU run against its own 1-GPU run) and the
# scaling of each GPUS-GPU run against the mean of the two 1-GPU runs (targets: >= 95 % at 2, >= 90 % at 4).
set -euo pipefail
OUT=${1:?usage: [GPUS=4] bash scripts/gpu/policy_ddp.sh OUT_DIR [diffscale bench options]}; shift
GPUS=${GPUS:-2}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
DRY=0; for a in "$@"; do [ "$a" = --dry-run ] && DRY=1; done
if [ $DRY = 1 ] && [ "$("$PY" -c "import torch; print(torch.cuda.device_count())")" = 0 ]; then
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((GPUS - 1)))}  # a dry run without GPUs plans for the host
fi
"$PY" -m diffscale bench --preset policy --gpus 1,$GPUS --recipe fast --steps 100 --warmup 30 --profile 5 \
  --variant again --concurrent 4 --out "$OUT" "$@"
[ $DRY = 1 ] && exit 0
"$PY" - "$OUT/bench.json" "$GPUS" <<'PYEOF'
import json, statistics, sys
records, world = json.load(open(sys.argv[1])), int(sys.argv[2])
one = [r for r in records if r["world_size"] == 1]
many = [r for r in records if r["world_size"] == world]
if not one or not many:
    sys.exit(f"missing 1-GPU or {world}-GPU records")
mean = statistics.fmean(r["samples_per_s"] for r in one)
def steps(rows):
    return ", ".join("%.2f" % (r["step_s"] * 1e3) for r in rows)
target = "95 %" if world <= 2 else "90 %"
print(f"1 GPU: {steps(one)} ms a step; {world} GPUs: {steps(many)} ms a step")
for r in many:
    label = " (%s)" % r["label"] if r.get("label") else ""
    print(f"{world} GPUs{label}: {r['samples_per_s']:.0f} samples/s, scaling "
          f"{r['scaling_efficiency']:.1%} against its own 1-GPU run, {r['samples_per_s'] / (world * mean):.1%} "
          f"against the mean of the {len(one)} 1-GPU runs (target >= {target})")
PYEOF
