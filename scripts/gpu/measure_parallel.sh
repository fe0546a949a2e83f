#!/usr/bin/env bash
# Second GPU pass (4-GPU host): independent 1- and 2-GPU measurements run side by side on
# disjoint GPUs to save device time; 4-GPU runs alone. Usage: bash scripts/gpu/measure_parallel.sh OUT
set -uo pipefail
OUT_DIR="${1:-/tmp/diffscale-gpu2}"
mkdir -p "$OUT_DIR/bench"
source scripts/gpu/env.sh
W="--steps 30 --warmup 15 --peak"
one() {  # one(gpus preset recipe nproc)
  local gpus=$1 preset=$2 recipe=$3 n=$4 out="$OUT_DIR/bench/$2-$3-$4gpu.json"
  export DIFFSCALE_BENCH_T0=$(date +%s.%N)
  if [ "$n" = 1 ]; then
    CUDA_VISIBLE_DEVICES=$gpus python3 -m diffscale.bench.worker --preset $preset --recipe $recipe $W --json "$out"
  else
    CUDA_VISIBLE_DEVICES=$gpus python3 -m torch.distributed.run --standalone --nproc_per_node=$n \
      -m diffscale.bench.worker --preset $preset --recipe $recipe $W --json "$out"
  fi >> "$OUT_DIR/workers-$preset-$recipe-$n.log" 2>&1
}
samp() { CUDA_VISIBLE_DEVICES=$1 python3 -m diffscale.bench.sampling --preset $2 --batch $3 --steps 50 --repeats 2 \
  --json "$OUT_DIR/bench/sampling-$2.json" >> "$OUT_DIR/sampling.log" 2>&1; }

phase() { echo "$(date -u +%T) $*" >> "$OUT_DIR/phases.log"; }
phase A; one 0 small plain 1 & one 1 medium fast 1 & one 2 medium plain 1 & one 3 xl fast 1 & wait
phase A2; one 0 xl plain 1 & samp 1 small 256 & samp 2 medium 64 & samp 3 xl 16 & wait
phase B; one 0,1 medium fast 2 & one 2,3 xl fast 2 & wait
phase C1; one 0,1,2,3 small fast 4
phase C2; one 0,1,2,3 medium fast 4
phase C3; one 0,1,2,3 xl fast 4
phase D; one 0,1 small fast 2 & one 2 small fast 1 & wait
phase end; echo done > "$OUT_DIR/DONE"
