#!/usr/bin/env bash
# Quality against sampling steps for each task's CPU preset (tiny, field-icon, policy-tiny): each
# trained to its preset's full step count on the CPU, then `diffscale eval` with each sampler at
# 10, 20 and 50 steps. The three presets train side by side, each on its own cores (CORES_EACH
# threads, pinned with taskset), so a 16-core machine takes about as long as the slowest.
# Writes $OUT/quality-steps/<preset>/<sampler>-<steps>.json (the runs under RUNS, default the same
# folder) and prints one table.
# Usage: bash scripts/gpu/quality_steps.sh [PRESETS] [STEPS_LIST]
# EXTRA="--set train.steps=20" (added to every train command) makes a quick dry run; TABLE_ONLY=1
# prints the table of what $OUT/quality-steps holds (e.g. after one call per preset side by side).
set -euo pipefail
PRESETS=${1:-"tiny field-icon policy-tiny"}; STEPS_LIST=${2:-"10 20 50"}
ROOT=${OUT:-out}/quality-steps; PY=${PYTHON:-python}; CORES_EACH=${CORES_EACH:-4}; FIRST=${FIRST_CORE:-0}
RUNS=${RUNS:-$ROOT}
mkdir -p "$ROOT"
samplers() {  # the reverse processes each task can sample with
  case $1 in
    policy*) echo "ddpm ddim" ;;
    field*) echo "ddim dpmsolver" ;;
    *) echo "ddim dpmsolver" ;;
  esac
}
one_preset() {  # preset, first core
  local preset=$1 lo=$2 hi=$(( $2 + CORES_EACH - 1 ))
  local dir=$ROOT/$preset run=$RUNS/$preset/run; rm -rf "$dir" "$run"; mkdir -p "$dir"
  taskset -c "$lo-$hi" $PY -m diffscale train --preset "$preset" --device cpu --out "$run" \
    --set "runtime.cpu_threads=$CORES_EACH" --set train.sample_every=0 ${EXTRA:-} > "$dir/train.log" 2>&1
  for sampler in $(samplers "$preset"); do
    for steps in $STEPS_LIST; do
      taskset -c "$lo-$hi" $PY -m diffscale eval "$run" --device cpu --sampler "$sampler" --steps "$steps" \
        --seed 0 --json > "$dir/$sampler-$steps.json" 2> "$dir/$sampler-$steps.err" || echo "{}" > "$dir/$sampler-$steps.json"
    done
  done
}
core=$FIRST
pids=()
[ "${TABLE_ONLY:-0}" = 1 ] && PRESETS=""
for preset in $PRESETS; do
  one_preset "$preset" "$core" &
  pids+=($!); core=$(( core + CORES_EACH ))
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
$PY - "$ROOT" <<'PYEOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
for preset in sorted(p for p in root.iterdir() if p.is_dir()):
    print(f"## {preset.name}")
    for path in sorted(preset.glob("*.json"), key=lambda p: (p.stem.split("-")[0], int(p.stem.split("-")[1]))):
        try:
            record = json.loads(path.read_text() or "{}")
        except json.JSONDecodeError:
            record = {}
        keep = ("fd", "precision", "recall", "class_balance", "crps", "crps_ideal", "crps_climatology", "spread_skill",
                "success", "mode_gap", "step")
        scores = {k: v for k, v in record.items() if k in keep and isinstance(v, (int, float))}
        print(f"{path.stem:>16}  " + "  ".join(f"{k} {v:.4g}" for k, v in sorted(scores.items())))
PYEOF
exit $rc
