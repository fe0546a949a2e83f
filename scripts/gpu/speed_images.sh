#!/usr/bin/env bash
# The image rows of "fast where users feel it", in one call on one GPU, each part writing under
# $OUT as it finishes (a call cut short keeps the parts it finished):
#   quality   time to quality: the plain recipe and diffscale's defaults, SECONDS_PER_RUN of training
#             each, FD along the way (python -m benchmarks.quality_time)      -> $OUT/quality/
#   samplers  DPM-Solver++ 10/15/20 and DDIM 10/20 against DDIM-50: FD and sampling time from the
#             checkpoint the quality part kept (python -m benchmarks.sampler_quality) -> $OUT/samplers/
#   pipeline  DDIM-50 against DDIMPipeline as shipped and with fp16 weights + a compiled UNet, per
#             preset at the batches of docs/benchmarks.md (python -m diffscale.bench.sampling) -> $OUT/pipeline/
#   startup   `diffscale train` cold, resumed and as a new run of the same network, to its first
#             logged step, with the steady samples/s of one more window (python -m benchmarks.startup)
#                                                                                  -> $OUT/startup/
# then prints the summary ($OUT/summary.md). Usage (repository root):
#   OUT=DIR bash scripts/gpu/speed_images.sh
# Settings (environment): PARTS (default "quality samplers pipeline startup", run in that order:
# the rows with no figure yet first), SECONDS_PER_RUN (40), QUALITY_PRESETS (small),
# QUALITY_EXTRA (more quality_time options, e.g. "--variant warm100 optim.warmup_steps=100"),
# QUALITY_LIMIT_S (420: the quality part's time limit; a variant trains once more),
# PIPELINE_PRESETS (xl small medium: the preset furthest from its target first), PIPELINE_LIMIT_S (420:
# the pipeline part's time limit), STARTUP_PRESETS
# (small), STARTUP_LIMIT_S (300: the startup part's time limit), STARTUP_EXTRA (more benchmarks.startup
# options, e.g. "--set runtime.compile_cache=off --again-with runtime.cudnn_benchmark=off": one more
# resumed job per --again-with, its overrides joined by ";"; a traced
# network that could not be installed leaves its traceback in $OUT/startup/, one that was installed
# yet traced again the guard that failed), BUDGET_S (570: a part that would start past it is
# skipped, and each part is stopped at it), WORK (scratch: run folders, caches; default
# /tmp/diffscale-speed-images), SMOKE=1 (tiny sizes: a dry run of every part on a CPU in a few
# minutes; its figures mean nothing).
# The startup part stays cold wherever it runs: the other parts keep their compiled kernels (Triton's
# too) and data in $WORK, and benchmarks.startup gives its jobs caches of their own. A startup part
# named first leaves its kernels and data to the parts after it.
set -uo pipefail
OUT=${OUT:?set OUT to the folder the results go to}
WORK=${WORK:-/tmp/diffscale-speed-images}
PARTS=${PARTS:-quality samplers pipeline startup}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-40}
QUALITY_PRESETS=${QUALITY_PRESETS:-small}
PIPELINE_PRESETS=${PIPELINE_PRESETS:-xl small medium}
STARTUP_PRESETS=${STARTUP_PRESETS:-small}
BUDGET_S=${BUDGET_S:-570}
source scripts/gpu/env.sh  # PY, PYTHONPATH, carried wheels, NCCL and allocator settings
export PYTHONUNBUFFERED=1
QUALITY_ARGS=(--seconds "$SECONDS_PER_RUN")
read -r -a QUALITY_EXTRA_ARGS <<< "${QUALITY_EXTRA:-}"
SAMPLER_ARGS=()
PIPELINE_ARGS=(--batch 0 --steps 50 --repeats 3)
STARTUP_ARGS=(--skip-preview --windows 2)
if [ "${SMOKE:-0}" = 1 ]; then
  QUALITY_PRESETS=tiny; PIPELINE_PRESETS=tiny; STARTUP_PRESETS=tiny
  TINY=(--set train.batch_per_gpu=16 --set "model.block_out_channels=[16,32,32]")
  QUALITY_ARGS=(--seconds "${SECONDS_PER_RUN_SMOKE:-3}" --evals 2 --count 32 --eval-steps 3 --plain-workers 0 "${TINY[@]}")
  SAMPLER_ARGS=(--count 8 --repeats 1)
  PIPELINE_ARGS=(--batch 2 --steps 3 --repeats 1 --set "model.block_out_channels=[16,32,32]")
  STARTUP_ARGS=(--skip-preview --windows 2 "${TINY[@]}" --set train.log_every=2)
fi
read -r -a STARTUP_EXTRA_ARGS <<< "${STARTUP_EXTRA:-}"
STARTUP_ARGS+=("${STARTUP_EXTRA_ARGS[@]}")
mkdir -p "$OUT/logs" "$WORK"
START=$(date +%s)
STATUS=()

# part NAME TIMEOUT_S COMMAND...: run it with its log in $OUT/logs/NAME.log, stopped at TIMEOUT_S
# or at the budget's end, whichever comes first; skipped when the budget is spent.
part() {
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  if [ "$left" -lt 20 ]; then
    STATUS+=("$name: skipped (budget of ${BUDGET_S} s spent)"); echo "== $name: skipped, budget spent"; return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most ${limit} s): $*"
  local t0; t0=$(date +%s)
  timeout -k 15 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  STATUS+=("$name: exit $rc in ${took} s$([ $rc = 124 ] && echo ' (stopped at its time limit)')")
  echo "== $name: exit $rc in ${took} s"; tail -3 "$OUT/logs/$name.log"
}

presets() { local flag=$1; shift; for p in "$@"; do printf '%s\n' "$flag" "$p"; done; }

# Bytecode cached once (torch's installation may ship none: every process would compile it again).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$WORK/pycache}
if [ "${SMOKE:-0}" != 1 ]; then
  "$PY" -c "import torch._inductor.compile_fx, diffusers, diffscale.training.loop, diffscale.bench.worker" \
    > "$OUT/logs/bytecode.log" 2>&1
fi
# Kernels and data of the parts other than startup (after it: the startup run's own).
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" TRITON_CACHE_DIR="$WORK/triton" DIFFSCALE_CACHE_DIR="$WORK/cache"
for name in $PARTS; do
  case $name in
    quality)
      mapfile -t P < <(presets --preset $QUALITY_PRESETS)
      rm -rf "$WORK/runs"
      part quality "${QUALITY_LIMIT_S:-420}" "$PY" -m benchmarks.quality_time "${P[@]}" "${QUALITY_ARGS[@]}" \
        "${QUALITY_EXTRA_ARGS[@]}" \
        --out "$OUT/quality" --runs "$WORK/runs" ;;
    samplers)
      RUN=${SAMPLER_RUN:-$WORK/runs/$(echo $QUALITY_PRESETS | cut -d' ' -f1)-fast}
      if [ ! -f "$RUN/config.yaml" ]; then
        STATUS+=("samplers: skipped (no trained run in $RUN: run the quality part first or set SAMPLER_RUN)")
        continue
      fi
      part samplers 180 "$PY" -m benchmarks.sampler_quality --run "$RUN" "${SAMPLER_ARGS[@]}" \
        --out "$OUT/samplers" ;;
    pipeline)
      mapfile -t P < <(presets --preset $PIPELINE_PRESETS)
      mkdir -p "$OUT/pipeline"
      part pipeline "${PIPELINE_LIMIT_S:-420}" "$PY" -m diffscale.bench.sampling "${P[@]}" "${PIPELINE_ARGS[@]}" --strong-reference \
        --json "$OUT/pipeline/sampling.json" ;;
    startup)
      mapfile -t P < <(presets --preset $STARTUP_PRESETS)
      mkdir -p "$OUT/startup"
      rm -rf "$WORK/startup"
      part startup "${STARTUP_LIMIT_S:-300}" env -u TORCHINDUCTOR_CACHE_DIR -u TRITON_CACHE_DIR -u DIFFSCALE_CACHE_DIR \
        "$PY" -m benchmarks.startup "${P[@]}" "${STARTUP_ARGS[@]}" --work "$WORK/startup" \
        --json "$OUT/startup/startup.jsonl"
      cp "$WORK/startup/cache/kernels"/*/*/traced-network-{discarded,retraced}.txt "$OUT/startup/" 2>/dev/null
      FIRST=$(echo $STARTUP_PRESETS | cut -d' ' -f1)
      KERNELS=$(ls -d "$WORK/startup/cache/kernels"/*/*/ 2>/dev/null | head -1)
      if [ -n "$KERNELS" ]; then
        export TORCHINDUCTOR_CACHE_DIR="$KERNELS" DIFFSCALE_CACHE_DIR="$WORK/startup/cache"
        unset TRITON_CACHE_DIR  # the startup jobs' Triton kernels are in Triton's default cache
      fi ;;
    *) STATUS+=("$name: unknown part (quality, samplers, pipeline, startup)") ;;
  esac
done

"$PY" - "$OUT" "$(( $(date +%s) - START ))" "${STATUS[@]}" <<'PYEOF' | tee "$OUT/summary.md"
import json, sys
from pathlib import Path
out, took, status = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
print(f"# Image rows, {took} s in all\n")
for line in status:
    print(f"- {line}")
for name in ("quality/quality_time.md", "samplers/sampler_quality.md"):
    if (out / name).is_file():
        print("\n" + (out / name).read_text())
pipeline = out / "pipeline" / "sampling.json"
if pipeline.is_file():
    records = json.loads(pipeline.read_text())
    print("\n| preset | batch | diffscale s | DDIMPipeline as shipped s | x | fp16 + compiled UNet s | x (target >= 2) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in records if isinstance(records, list) else [records]:
        strong, ratio = r.get("pipeline_strong_s"), r.get("speedup_vs_strong")
        print(f"| {r['preset']} | {r['batch']} | {r['diffscale_s']:.4f} | {r['ddimpipeline_s']:.4f} | "
              f"{r['speedup']:.2f} | {'-' if strong is None else f'{strong:.4f}'} | "
              f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    print(f"\n{records[0]['device'] if isinstance(records, list) else records['device']}; strong setup: "
          f"{(records[0] if isinstance(records, list) else records).get('pipeline_strong_setup')}")
startup = out / "startup" / "startup.jsonl"
if startup.is_file():
    records = [json.loads(line) for line in startup.read_text().splitlines()]
    print("\n| preset | settings | cold s (target <= 60) | resumed s (target <= 15) | new run s | steady samples/s |")
    print("|---|---|---:|---:|---:|---:|")
    def seconds(job):  # the first step, then the first logged step (train.log_every steps later)
        job = job or {}
        first, logged = job.get("first_step_s"), job.get("first_logged_step_s")
        return f"{float('nan') if first is None else first:.1f} / {float('nan') if logged is None else logged:.1f}"
    def rate(job): return "-" if (job or {}).get("steady_samples_per_s") is None else f"{job['steady_samples_per_s']:,.0f}"
    print("(seconds from launch to the first step / to the first logged step)")
    for r in records:
        print(f"| {r['preset']} | {' '.join(r['overrides']) or 'defaults'} | {seconds(r['cold'])} | "
              f"{seconds(r['resumed'])} | {seconds(r.get('new_run'))} | {rate(r['resumed'])} |")
    again = [(r, job) for r in records for job in r.get("again", [])]
    if again:
        print("\n| preset | resumed again with | s (target <= 15) | steady samples/s |")
        print("|---|---|---:|---:|")
        for r, job in again:
            print(f"| {r['preset']} | {' '.join(job['with'])} | {seconds(job)} | {rate(job)} |")
PYEOF
