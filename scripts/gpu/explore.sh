#!/usr/bin/env bash
# Profiling pass on one GPU: variants of the fast recipe compile side by side (--turns) and are
# timed one at a time, each followed by a profile of 5 steps (top kernels, time per kind).
# Usage: [SET=profiles|levers-small|levers-medium|defaults|flex] bash scripts/gpu/explore.sh OUT_DIR
#        (SMALL/MEDIUM/XL/EXTRA shrink it for a CPU dry run)
# SET=profiles (default): the layout and attention-kernel variants of docs/benchmarks.md 7.
# SET=levers-*: the plain recipe beside fast-recipe levers for small and medium: channels_last
#   and inductor's layout optimisation forced (its heuristic skips UNets): docs/benchmarks.md 3.
set -uo pipefail
OUT_DIR="${1:-/tmp/diffscale-explore}"
SMALL=${SMALL:-small}; MEDIUM=${MEDIUM:-medium}; XL=${XL:-xl}; EXTRA=${EXTRA:-}
mkdir -p "$OUT_DIR"
source scripts/gpu/env.sh
source scripts/gpu/worker.sh
LIMIT=${LIMIT:-330}
{ nvidia-smi -L; date -u; } > "$OUT_DIR/host.txt" 2>&1
W="--steps 30 --warmup 12 --profile 5 $EXTRA"
v() {  # v(turn_dir preset recipe label [--set ...]): one worker on the GPU, named PRESET-RECIPE-LABEL-1gpu
  local turn=$1 preset=$2 recipe=$3 label=$4; shift 4
  [ "$recipe" = plain ] && label=""  # fast / plain pairs with the unlabelled plain run
  w "$turn" 0 1 "$preset" "$recipe" "$label" "$@"
}
T1=/tmp/turns1-$$; T2=/tmp/turns2-$$
(sleep 200; top -b -n1 -w 200 | head -30 > "$OUT_DIR/top-200s.txt") & disown  # mid-compile; not waited for
CL="--set runtime.channels_last=on"
if [ "${SET:-profiles}" = levers-small ]; then
  # (an assignment before a function call reaches the worker's environment). Four workers
  # at most on a 16-core host: seven compiling side by side did not finish in 540 s.
  v $T1:4 $SMALL plain plain & v $T1:4 $SMALL fast cl $CL &
  TORCHINDUCTOR_FORCE_LAYOUT_OPT=1 v $T1:4 $SMALL fast lopt &
  TORCHINDUCTOR_FORCE_LAYOUT_OPT=1 v $T1:4 $SMALL fast cl-lopt $CL & wait
elif [ "${SET:-profiles}" = defaults ]; then  # fast (CUDA graphs since docs/benchmarks.md 2) vs plain; math attention
  v $T1:4 $SMALL plain plain & v $T1:4 $SMALL fast default & v $T1:4 $XL fast default &
  v $T1:4 $SMALL fast math --set runtime.attention=math & wait
elif [ "${SET:-profiles}" = flex ]; then  # FlexAttention (runtime/flex_attention.py): kernels, layers, steps
  # the kernels alone on each preset's attention calls, then whole compiled attention layers
  timeout ${ATTN_LIMIT:-200} python3 -m diffscale.bench.attention --json "$OUT_DIR/attention.json" > "$OUT_DIR/attention.log" 2>&1
  timeout ${ATTN_LIMIT:-150} python3 -m diffscale.bench.attention --layers --preset small medium \
    --json "$OUT_DIR/attention-layers.json" > "$OUT_DIR/attention-layers.log" 2>&1
  # training steps: the default (FlexAttention) against PyTorch's SDPA kernel and the plain recipe;
  # medium beside these ran one 80 GiB card out of memory (docs/benchmarks.md 14)
  v $T1:3 $SMALL plain plain & v $T1:3 $SMALL fast default & v $T1:3 $SMALL fast sdpa --set runtime.attention=sdpa & wait
elif [ "${SET:-profiles}" = levers-medium ]; then
  v $T2:4 $MEDIUM plain plain & v $T2:4 $MEDIUM fast default &
  TORCHINDUCTOR_FORCE_LAYOUT_OPT=1 v $T2:4 $MEDIUM fast lopt &
  TORCHINDUCTOR_FORCE_LAYOUT_OPT=1 v $T2:4 $MEDIUM fast cl-lopt $CL & wait
else
v $T1:4 $SMALL fast default & v $T1:4 $SMALL fast nocl --set runtime.channels_last=off &
v $T1:4 $SMALL fast flash --set runtime.attention=flash &
v $T1:4 $SMALL fast efficient --set runtime.attention=efficient & wait
echo "$(date -u +%T) phase 2" >> "$OUT_DIR/host.txt"
v $T2:3 $MEDIUM fast default & v $T2:3 $MEDIUM fast nocl --set runtime.channels_last=off &
v $T2:3 $MEDIUM fast flash --set runtime.attention=flash & wait
fi
{ date -u; ls "$T1" "$T2"; } >> "$OUT_DIR/host.txt" 2>&1
python3 -c "
import json,glob,sys; sys.path.insert(0,'src')
from diffscale.bench.profile import render_profile
for f in sorted(glob.glob('$OUT_DIR/*.json')):
    r=json.load(open(f)); print(r['preset'], r['label'], round(r['samples_per_s']), 'samples/s', round(r['step_s']*1000,1), 'ms', round(r['peak_mem_gib'],2), 'GiB', 'breaks', r['graph_breaks'], 'startup', round(r['startup_s']), 'MHz', r.get('sm_clock_mhz'), 'W', r.get('power_w'))
    print(render_profile(r))
" > "$OUT_DIR/summary.txt" 2>&1
