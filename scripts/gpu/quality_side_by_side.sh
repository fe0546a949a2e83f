#!/usr/bin/env bash
# Time to quality over a longer budget on the GPUs of one host: the plain recipe on GPU 0,
# diffscale's defaults on GPU 1 and each training choice of VARIANTS on the next GPU, all at the
# same time (one process each; one feature network, trained first and shared, so all score in the
# same feature space), SECONDS_EACH of training each, FD along the way (python -m
# benchmarks.quality_time --recipe plain|fast [--variants-only --variant ...]). Usage
# (repository root):
#   OUT=DIR bash scripts/gpu/quality_side_by_side.sh
# Settings (environment): PRESET (small), SECONDS_EACH (260), EVALS (8), LIMIT_S (540: each
# process's time limit), EXTRA (more quality_time options for every run and for the feature
# network's preparation, e.g. "--raw-weights"), VARIANTS (';'-separated "LABEL KEY=VALUE ...", one
# GPU each, e.g. "minsnr diffusion.loss_weighting=min-snr; v diffusion.prediction_type=v_prediction"),
# DEFAULTS (on; off leaves diffscale's defaults out and starts the variants on GPU 1), PLAIN (on;
# off leaves the plain recipe out: diffscale's defaults on GPU 0, each variant weighed against
# them), SAMPLERS (off; on samples each diffscale run's last weights with every sampler of
# python -m benchmarks.sampler_quality afterwards, on the GPU it trained on, into
# $OUT/LABEL/samplers/; SAMPLER_COUNT images each, 512; SAMPLER_LIMIT_S, 300, each process's time
# limit). $OUT/plain/, $OUT/fast/ and $OUT/LABEL/ get each run's quality_time.json, .md and .png;
# the summary against the plain recipe, or the defaults with PLAIN=off ($OUT/summary.md), is
#   python -m benchmarks.quality_time --merge $OUT/*/quality_time.json [--against fast]
# A dry run on a CPU (figures mean nothing): OMP_NUM_THREADS=1 PRESET=tiny SECONDS_EACH=3 EVALS=2
# SAMPLER_COUNT=16 EXTRA="--count 32 --eval-steps 3 --plain-workers 0 --set train.batch_per_gpu=16 --set
# model.block_out_channels=[16,32,32]" (one thread each: the processes share the CPU's cores, and with
# torch's default threads each two of them on a 2-core machine sampled ~70 x slower).
set -u
OUT=${OUT:?set OUT to the folder the results go to}
nvidia-smi -L 2>/dev/null; date -u
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/diffscale-pycache} PYTHONUNBUFFERED=1
export DIFFSCALE_CACHE_DIR=${DIFFSCALE_CACHE_DIR:-/tmp/diffscale-quality-cache}
PRESET=${PRESET:-small}; SECONDS_EACH=${SECONDS_EACH:-260}; EVALS=${EVALS:-8}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
mkdir -p "$OUT"
"$PY" -c "import torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.bench.worker" >/dev/null 2>&1
"$PY" -m benchmarks.quality_time --preset "$PRESET" --features-only "${EXTRA_ARGS[@]}"
# one run per GPU: NAME then its quality_time options
RUNS=()
AGAINST=()  # the summary's reference: the plain recipe, else the defaults where they train
[ "${PLAIN:-on}" = off ] || RUNS+=("plain --recipe plain")
[ "${DEFAULTS:-on}" = off ] || RUNS+=("fast --recipe fast")
[ "${PLAIN:-on}" = off ] && [ "${DEFAULTS:-on}" != off ] && AGAINST=(--against fast)
IFS=';' read -r -a VARIANT_LIST <<< "${VARIANTS:-}"
for variant in "${VARIANT_LIST[@]}"; do
  read -r -a words <<< "$variant"
  [ ${#words[@]} -gt 0 ] && RUNS+=("${words[0]} --recipe fast --variants-only --variant ${words[*]}")
done
on_gpu() {  # GPU NAME LIMIT_S COMMAND...: one process on its GPU, with the compile caches of run NAME
  local gpu=$1 name=$2 limit=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$gpu TORCHINDUCTOR_CACHE_DIR=/tmp/diffscale-inductor-$name \
    TRITON_CACHE_DIR=/tmp/diffscale-triton-$name timeout "$limit" "$@"
}
gpu=0
for run in "${RUNS[@]}"; do
  read -r -a words <<< "$run"
  name=${words[0]}
  on_gpu $gpu "$name" "${LIMIT_S:-540}" \
    "$PY" -m benchmarks.quality_time --preset "$PRESET" "${words[@]:1}" --seconds "$SECONDS_EACH" \
    --evals "$EVALS" "${EXTRA_ARGS[@]}" --out "$OUT/$name" > "$OUT/$name.log" 2>&1 &
  gpu=$((gpu + 1))
done
wait
date -u
"$PY" -m benchmarks.quality_time "${AGAINST[@]}" --merge \
  $(for run in "${RUNS[@]}"; do echo "$OUT/${run%% *}/quality_time.json"; done) | tee "$OUT/summary.md"
if [ "${SAMPLERS:-off}" = on ]; then  # DDIM 50 against DPM-Solver++ on each run's last weights
  gpu=0
  for run in "${RUNS[@]}"; do
    name=${run%% *}
    for kept in "$OUT/$name"/runs/*/; do
      [ -d "$kept" ] || continue
      on_gpu $gpu "$name" "${SAMPLER_LIMIT_S:-300}" \
        "$PY" -m benchmarks.sampler_quality --run "$kept" --count "${SAMPLER_COUNT:-512}" --out "$OUT/$name/samplers" \
        > "$OUT/$name.samplers.log" 2>&1 &
    done
    gpu=$((gpu + 1))
  done
  wait
  cat "$OUT"/*/samplers/sampler_quality.md 2>/dev/null
fi
