#!/usr/bin/env bash
# Time to quality on one GPU, and policy-tiny's step count on the CPU cores beside it, in one call.
# Usage (repository root): bash scripts/gpu/speed_fields_policy.sh OUT_DIR (default: $OUT)
#   DRY=1 bash scripts/gpu/speed_fields_policy.sh OUT_DIR: every step at tiny sizes on the CPU
#   (checks the script; its figures mean nothing).
# 1. OUT/fields_quality.{json,md}: held-out CRPS of field-icon's built-in data against training
#    seconds, the plain fp32 loop and diffscale's settings (python -m benchmarks.fields_quality).
# 2. OUT/policy_quality.{json,md}: success on reach2d-routes through the controller against
#    training seconds, the `policy` preset's plain recipe and diffscale's defaults
#    (python -m benchmarks.policy_quality).
# 3. OUT/policy_steps.{json,md}: policy-tiny on reach2d-routes at 3,200 and 4,000 steps x seeds
#    3-6 (STEPS_ARGS: other step counts and seeds, e.g. "--steps 800 1600 2400 --seeds 0 1 2"),
#    each a one-thread CPU training on a core of its own (python -m benchmarks.policy_steps),
#    started first and run beside 1 and 2; then, with everything else done,
#    OUT/latency_policy_tiny_{ddpm,ddim}.json: the controller's CPU re-plan, one thread on cores
#    0 and 1 (an idle 2-core machine's equivalent).
# On a 16-core host 1 and 2 run on cores 0-5 (the plain recipe's 4 loader workers included) and
# the trainings of 3 on cores 6-14 (one each); with fewer cores 3 runs after 1 and 2.
# Each piece stops on its own deadline (below; FIELDS_DEADLINE_S, POLICY_DEADLINE_S), so the
# call ends in about 7 minutes.
set -euo pipefail
OUT=${1:-${OUT:?usage: bash scripts/gpu/speed_fields_policy.sh OUT_DIR (or OUT set)}}
mkdir -p "$OUT"
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc would follow OMP_NUM_THREADS
command -v taskset >/dev/null || taskset() { shift 2; "$@"; }  # without util-linux: unpinned
if [ "${DRY:-0}" = 1 ]; then
  FIELDS=(--device cpu --steps-scale 0.01 --cases 32 --members 4 --sample-steps 2 --plain-steps 20 --plain-evals 2
          --plain-workers 0 --warmup 2 --evals 3 --set model.hidden=32 --set model.depth=1)
  POLICY=(--preset policy-tiny --device cpu --eval-every 4 --max-steps 8 --episodes 4 --plain-workers 0 --warmup 2)
  STEPS=(--steps 4 8 --seeds 0 1 --episodes 4)
  LATENCY=(--repeats 3 --warmup 1)
else
  FIELDS=(--deadline-s "${FIELDS_DEADLINE_S:-160}" --group-s 30)
  POLICY=(--deadline-s "${POLICY_DEADLINE_S:-180}" --overhead-s 20 --max-train-s 35 --plain-max-train-s 100)
  # 800 / 1,600 / 2,400 / 3,200 / 4,000 x seeds 0-2 are recorded (docs/measurements/2026-11-27.md, "Policies that
  # keep every mode"); more seeds at the two candidates (STEPS_ARGS to choose others)
  read -r -a STEPS <<< "${STEPS_ARGS:---steps 3200 4000 --seeds 3 4 5 6 --deadline-s 390}"
  LATENCY=(--repeats 100 --warmup 5)
fi
if [ "$CORES" -ge 16 ]; then GPU_CORES=0-5; CPU_CORES=6-14; BESIDE=1; else GPU_CORES=0-$((CORES - 1)); CPU_CORES=$GPU_CORES; BESIDE=0; fi
LAT_CORES=0,1; [ "$CORES" -ge 2 ] || LAT_CORES=0
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "command: bash scripts/gpu/speed_fields_policy.sh $OUT (DRY=${DRY:-0})"
  echo "cores: $CORES ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'))"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || true
} > "$OUT/provenance.txt"
steps_cpu() {
  "$PY" -m benchmarks.policy_steps "${STEPS[@]}" --cores "$CPU_CORES" \
    --json "$OUT/policy_steps.json" --markdown "$OUT/policy_steps.md" > "$OUT/policy_steps.log" 2>&1
}
START=$(date +%s)
if [ $BESIDE = 1 ]; then steps_cpu & CPU_PID=$!; fi
taskset -c "$GPU_CORES" "$PY" -m benchmarks.fields_quality "${FIELDS[@]}" \
  --json "$OUT/fields_quality.json" --markdown "$OUT/fields_quality.md" > "$OUT/fields_quality.log" 2>&1 \
  || { echo "fields_quality failed:"; tail -20 "$OUT/fields_quality.log"; }
echo "[$(( $(date +%s) - START )) s] fields done"
taskset -c "$GPU_CORES" "$PY" -m benchmarks.policy_quality "${POLICY[@]}" \
  --json "$OUT/policy_quality.json" --markdown "$OUT/policy_quality.md" > "$OUT/policy_quality.log" 2>&1 \
  || { echo "policy_quality failed:"; tail -20 "$OUT/policy_quality.log"; }
echo "[$(( $(date +%s) - START )) s] policy done"
if [ $BESIDE = 1 ]; then wait $CPU_PID || echo "policy_steps: some runs failed (see policy_steps.log)"; else
  steps_cpu || echo "policy_steps: some runs failed (see policy_steps.log)"; fi
echo "[$(( $(date +%s) - START )) s] policy-tiny step counts done"
for sampler in ddpm ddim; do
  taskset -c "$LAT_CORES" env OMP_NUM_THREADS=1 "$PY" -m benchmarks.latency --preset policy-tiny --controller \
    --count 1 --steps 10 --sampler $sampler --device cpu "${LATENCY[@]}" \
    --json "$OUT/latency_policy_tiny_$sampler.json" > "$OUT/latency_policy_tiny_$sampler.log" 2>&1 \
    || { echo "latency $sampler failed:"; tail -20 "$OUT/latency_policy_tiny_$sampler.log"; }
done
echo "[$(( $(date +%s) - START )) s] all done"
echo; cat "$OUT/provenance.txt"
for part in fields_quality policy_quality policy_steps; do
  echo; echo "== $part"; cat "$OUT/$part.md" 2>/dev/null || echo "(no table: see $OUT/$part.log)"
done
echo; echo "== policy-tiny controller re-plan on the CPU (cores $LAT_CORES, one thread; target p50 <= 10 ms)"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
for sampler in ("ddpm", "ddim"):
    path = Path(sys.argv[1]) / f"latency_policy_tiny_{sampler}.json"
    if not path.exists():
        print(f"{sampler}: no record")
        continue
    r = json.loads(path.read_text())
    print(f"{sampler}: re-plan p50 {r['replan']['p50_ms']:.2f} ms (p99 {r['replan']['p99_ms']:.2f}), process CPU "
          f"p50 {r['replan_process_cpu']['p50_ms']:.2f} ms, pop p50 {r['pop']['p50_ms']:.3f} ms, threads {r['threads']}")
PYEOF
