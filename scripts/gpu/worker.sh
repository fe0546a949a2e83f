# Sourced by the GPU measurement scripts: w() starts one benchmark worker with its turn
# (python -m diffscale.bench.worker --turns DIR:N): compiled beside the other workers of the
# phase, timed alone. Records go to $OUT_DIR/NAME.json, logs to $OUT_DIR/logs/NAME.log.
w() {  # w(turn gpus nodes preset recipe label [args...]); a failed worker still counts as ready
  # Needs OUT_DIR and W (worker options); LIMIT (seconds, default none) stops a stuck worker.
  local turn=$1 gpus=$2 nodes=$3 preset=$4 recipe=$5 label=$6; shift 6
  local n; n=$(tr , '\n' <<< "$gpus" | wc -l)
  local shape="${n}gpu"; [ "$nodes" = 2 ] && shape="$((n / 2))x2nodes"
  local name="$preset-$recipe${label:+-$label}-$shape" out log
  out="$OUT_DIR/$name.json"; log="$OUT_DIR/logs/$name.log"
  mkdir -p "$OUT_DIR/logs"
  local base=(-m diffscale.bench.worker --preset "$preset" --recipe "$recipe" $W --turns "$turn" --json "$out"
              ${label:+--label "$label"} "$@")
  export DIFFSCALE_BENCH_T0=$(date +%s.%N)
  if [ "$nodes" = 2 ]; then
    local per=$((n / 2)) port=$((29600 + RANDOM % 300)) a b
    a=$(cut -d, -f1-$per <<< "$gpus"); b=$(cut -d, -f$((per + 1))- <<< "$gpus")
    CUDA_VISIBLE_DEVICES=$a DIFFSCALE_BENCH_NODES=2 python3 -m torch.distributed.run --nnodes=2 --node_rank=0 \
      --nproc_per_node=$per --master_addr=127.0.0.1 --master_port=$port "${base[@]}" >> "$log" 2>&1 &
    CUDA_VISIBLE_DEVICES=$b DIFFSCALE_BENCH_NODES=2 python3 -m torch.distributed.run --nnodes=2 --node_rank=1 \
      --nproc_per_node=$per --master_addr=127.0.0.1 --master_port=$port "${base[@]}" >> "$log" 2>&1
    wait
  elif [ "$n" = 1 ]; then
    CUDA_VISIBLE_DEVICES=$gpus timeout "${LIMIT:-0}" python3 "${base[@]}" >> "$log" 2>&1
  else
    CUDA_VISIBLE_DEVICES=$gpus timeout "${LIMIT:-0}" python3 -m torch.distributed.run --standalone --nproc_per_node=$n "${base[@]}" >> "$log" 2>&1
  fi
  [ -f "$out" ] || { mkdir -p "${turn%:*}"; touch "${turn%:*}/ready-failed-$name"; }
}
