#!/usr/bin/env bash
# The current figures of docs/benchmarks.md, measured again on this GPU host with diffscale bench.
# Usage (repository root): bash scripts/gpu/reproduce.sh OUT_DIR [more diffscale bench options]
#   e.g. --dry-run to print the runs without starting them (works without a GPU).
# 1. OUT_DIR/one-gpu: fast vs plain per preset on one GPU (samples/s, step time, memory,
#    start-up), then DDIM sampling against diffusers' DDIMPipeline.
# 2. OUT_DIR/four-gpus (hosts with 4 GPUs or more): 1 vs 4 GPUs per preset (scaling), with
#    each rank's communication and idle time (--profile 5).
# 3. OUT_DIR/tasks (not with --dry-run): a policy's action-chunk latency, online field training
#    (round, sampling, push) and the start-up of small and medium, cold and resumed.
# Each folder gets bench.json, sampling.json, bench.png, provenance.jsonl (date, command,
# commit) and logs/; `diffscale bench --collect --out DIR` prints the tables again.
set -euo pipefail
OUT=${1:?usage: bash scripts/gpu/reproduce.sh OUT_DIR [diffscale bench options]}; shift
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
DRY=0; for a in "$@"; do [ "$a" = --dry-run ] && DRY=1; done
if [ $DRY = 1 ] && [ "$GPUS" = 0 ]; then  # a dry run without GPUs plans for a 4-GPU host
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1,2,3}
fi
COMMON=(--preset small medium xl --steps 30 --warmup 10)
# With 4 GPUs the one-GPU runs compile side by side, one per GPU, and are timed one at a time.
SIDE=1; { [ "$GPUS" -ge 4 ] || [ $DRY = 1 ]; } && SIDE=4
"$PY" -m diffscale bench "${COMMON[@]}" --gpus 1 --recipe fast,plain --peak --sampling \
  --concurrent $SIDE --out "$OUT/one-gpu" "$@"
if [ "$GPUS" -ge 4 ] || [ $DRY = 1 ]; then
  # three one-GPU baselines side by side, then the three 4-GPU jobs, as the recorded scaling pass ran
  "$PY" -m diffscale bench "${COMMON[@]}" --gpus 1,4 --recipe fast --profile 5 \
    --concurrent 3 --out "$OUT/four-gpus" "$@"
fi
if [ $DRY = 0 ]; then
  mkdir -p "$OUT/tasks"
  "$PY" -m benchmarks.latency --preset policy --count 1 --steps 10 --repeats 200 --json "$OUT/tasks/policy-ddim10.json"
  "$PY" -m benchmarks.latency --preset policy --count 1 --steps 100 --sampler ddpm --repeats 20 \
    --json "$OUT/tasks/policy-ddpm100.json"
  "$PY" -m benchmarks.online --preset field-icon --json "$OUT/tasks/online.json"
  "$PY" -m benchmarks.startup --preset small --preset medium --json "$OUT/tasks/startup.jsonl"
fi
