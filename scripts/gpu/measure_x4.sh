#!/usr/bin/env bash
# One 4-GPU host: fast vs plain on 1 GPU, channels_last on/off, and fast-recipe scaling at
# 1, 2, 4 GPUs and 2 nodes x 2 (torchrun --nnodes=2 on one host) for small, medium and xl.
# Workers of a phase compile side by side (--turns) and are timed one at a time, so no
# timed window shares the host with a compile or another measurement.
# Usage: [ONLY=scaling|presets|check|next|levers|defaults|ddp|compress|verify] [GPUS=0,1] bash scripts/gpu/measure_x4.sh OUT_DIR
#        then diffscale bench --collect --out OUT_DIR
set -uo pipefail
OUT_DIR="${1:-/tmp/diffscale-x4}"
mkdir -p "$OUT_DIR"
source scripts/gpu/env.sh
source scripts/gpu/worker.sh  # w(): one timed worker (1 GPU, torchrun, or 2 torchrun "nodes")
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
{ nvidia-smi -L; date -u; } > "$OUT_DIR/host.txt" 2>&1
W="--steps 30 --warmup 10 --peak ${EXTRA:-}"  # EXTRA shrinks it for a CPU dry run
S=${S:-small}; M=${M:-medium}; X=${X:-xl}
phase() { echo "$(date -u +%T) $*" >> "$OUT_DIR/host.txt"; }
CL="--set runtime.channels_last=on"
P=/tmp/turns-$$
if [ "${ONLY:-}" = scaling ]; then  # the short pass: 1 vs 4 GPUs and 2 x 2, small and xl
  phase "scaling: 1 and 4 GPUs, 2 nodes x 2"
  w $P-s:5 0 1 $S fast "" & w $P-s:5 1 1 $X fast "" &
  w $P-s:5 0,1,2,3 1 $S fast "" & w $P-s:5 0,1,2,3 1 $X fast "" --profile 3 &
  w $P-s:5 0,1,2,3 2 $S fast "" & wait
  phase end; exit 0
fi
ALL=${GPUS:-0,1,2,3}; NG=$(tr , '\n' <<< "$ALL" | wc -l)  # GPUS=0,1 on a 2-GPU host
comm_check() {  # all-reduce bus bandwidth at gradient sizes; the NCCL transport goes to host.txt
  phase "all-reduce bandwidth on $NG GPUs (NCCL log: logs-comm.log)"
  NCCL_DEBUG=INFO python3 -m torch.distributed.run --standalone --nproc_per_node=$NG -m diffscale.bench.comm \
    --json "$OUT_DIR/comm.json" > "$OUT_DIR/logs-comm.log" 2>&1
  grep -h "all-reduce\| via \|NCCL version" "$OUT_DIR/logs-comm.log" | sort | uniq -c | head -20 >> "$OUT_DIR/host.txt"
}
if [ "${ONLY:-}" = check ]; then  # the interconnect first, then 1 vs all GPUs per preset, xl with the graph split per bucket
  comm_check
  phase "check: 1 and $NG GPUs per preset"
  w $P-c:7 0 1 $S fast "" & w $P-c:7 1 1 $M fast "" & w $P-c:7 0 1 $X fast "" &  # 1-GPU baselines
  w $P-c:7 $ALL 1 $S fast "" & w $P-c:7 $ALL 1 $M fast "" --profile 3 &
  w $P-c:7 $ALL 1 $X fast "" --profile 3 & w $P-c:7 $ALL 1 $X fast split --set runtime.ddp_graph_split=on & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = next ]; then  # what docs/benchmarks.md 5 left: all GPUs with one-graph DDP, CUDA graphs
  comm_check
  RO="--set runtime.compile_mode=reduce-overhead"  # label graphs: the step replayed as CUDA graphs
  phase "next: fast / plain on 1 GPU, 1 vs $NG GPUs per preset, CUDA graphs for small and xl"
  w $P-n:10 0 1 $S fast "" & w $P-n:10 1 1 $S plain "" & w $P-n:10 0 1 $M fast "" & w $P-n:10 1 1 $X fast "" &
  w $P-n:10 $ALL 1 $S fast "" & w $P-n:10 $ALL 1 $M fast "" --profile 3 & w $P-n:10 $ALL 1 $X fast "" --profile 3 &
  w $P-n:10 0 1 $S fast graphs $RO --profile 3 & w $P-n:10 1 1 $X fast graphs $RO &
  w $P-n:10 $ALL 1 $X fast graphs $RO --profile 3 & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = defaults ]; then  # the defaults (CUDA graphs, FlexAttention where it won) in one call
  # Two phases, at most two workers per GPU in the first and four jobs sharing each GPU in the
  # second: twelve at once did not fit 80 GiB cards while compiling (docs/benchmarks.md 14).
  # sdpa: PyTorch's attention kernel, the default before FlexAttention (runtime.attention=auto).
  SDPA="--set runtime.attention=sdpa"
  phase "defaults 1: fast / plain on 1 GPU per preset; small and medium with PyTorch's SDPA kernel"
  w $P-d1:8 0 1 $S fast "" & w $P-d1:8 1 1 $S plain "" & w $P-d1:8 2 1 $M fast "" & w $P-d1:8 3 1 $M plain "" &
  w $P-d1:8 1 1 $X fast "" & w $P-d1:8 0 1 $X plain "" & w $P-d1:8 2 1 $S fast sdpa $SDPA &
  w $P-d1:8 3 1 $M fast sdpa $SDPA & wait
  # xl's profile says per rank how much of its all-reduce time is waiting (docs/benchmarks.md 2);
  # b500: one 500 MiB bucket, one all-reduce after the compiled backward instead of five.
  phase "defaults 2: fast on $NG GPUs per preset; xl with one bucket"
  w $P-d2:4 $ALL 1 $S fast "" --profile 3 & w $P-d2:4 $ALL 1 $M fast "" --profile 3 & w $P-d2:4 $ALL 1 $X fast "" --profile 3 &
  w $P-d2:4 $ALL 1 $X fast b500 --set runtime.ddp_bucket_mb=500 --profile 3 & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = ddp ]; then  # small and medium scaling with and without bf16 gradient compression
  # docs/benchmarks.md 1: small 96.8-97.0 %, medium 97.0-97.1 %; their gradients are small enough
  # that compressing them may cost more than it saves. At most four jobs per GPU per phase (80 GiB).
  # --profile 5 says per rank how long its GPU sat idle between kernels; --trace keeps the timeline.
  NC="--set runtime.ddp_bf16_compress=off" T="$OUT_DIR/traces"
  phase "ddp 1: small and medium on 1 GPU; small on $NG GPUs with and without compression"
  w $P-p1:4 0 1 $S fast "" --profile 5 --trace $T/$S-1 & w $P-p1:4 1 1 $M fast "" --profile 5 &
  w $P-p1:4 $ALL 1 $S fast "" --profile 5 --trace $T/$S-$NG & w $P-p1:4 $ALL 1 $S fast nocompress $NC --profile 5 & wait
  phase "ddp 2: medium on $NG GPUs with and without compression"
  w $P-p2:2 $ALL 1 $M fast "" --profile 5 --trace $T/$M-$NG & w $P-p2:2 $ALL 1 $M fast nocompress $NC --profile 5 & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = compress ]; then  # bf16 gradient compression on and off for xl; small and medium repeated
  # The ddp pass (docs/benchmarks.md 1, run G): small and medium scale better without it. xl's
  # gradients are 4.5 x medium's. At most four jobs per GPU per phase (80 GiB cards).
  ON="--set runtime.ddp_bf16_compress=on" OFF="--set runtime.ddp_bf16_compress=off"
  phase "compress 1: xl and small on 1 GPU; xl on $NG GPUs with and without compression, small without"
  w $P-c1:5 0 1 $X fast "" & w $P-c1:5 1 1 $S fast "" &
  w $P-c1:5 $ALL 1 $X fast compress $ON --profile 5 & w $P-c1:5 $ALL 1 $X fast nocompress $OFF --profile 5 &
  w $P-c1:5 $ALL 1 $S fast nocompress $OFF --profile 5 & wait
  phase "compress 2: medium on 1 GPU and on $NG without compression; small on $NG with it"
  w $P-c2:3 2 1 $M fast "" & w $P-c2:3 $ALL 1 $M fast nocompress $OFF --profile 5 &
  w $P-c2:3 $ALL 1 $S fast compress $ON --profile 5 & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = verify ]; then  # the defaults after runs G and H (no bf16 compression), every preset
  # Phase 1 also samples xl (DDIM, 50 steps) on GPU 3, which no 1-GPU worker uses: the default
  # and with the layout optimisation forced, against DDIMPipeline in the same process.
  phase "verify 1: every preset on 1 GPU; xl DDIM sampling on GPU 3"
  w $P-v1:3 0 1 $S fast "" & w $P-v1:3 1 1 $M fast "" & w $P-v1:3 2 1 $X fast "" &
  ( export CUDA_VISIBLE_DEVICES=3; mkdir -p "$OUT_DIR/logs"
    for v in "default" "layout-opt --set runtime.layout_opt=on"; do set -- $v
      timeout 240 python3 -m diffscale.bench.sampling --preset $X --batch ${SB:-16} --steps ${SS:-50} --repeats 3 \
        "${@:2}" --json "$OUT_DIR/sampling-$X-$1.json" >> "$OUT_DIR/logs/sampling.log" 2>&1
    done ) & wait
  phase "verify 2: every preset on $NG GPUs"
  w $P-v2:3 $ALL 1 $S fast "" --profile 5 & w $P-v2:3 $ALL 1 $M fast "" --profile 5 & w $P-v2:3 $ALL 1 $X fast "" --profile 5 & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = levers ]; then  # small's attention (23 ms of 76) and kernel tuning; 2 nodes x 2, one-graph DDP
  phase "levers: small with math attention (compiled by inductor) and coordinate-descent tuning; 2 x 2 nodes"
  w $P-l:10 0 1 $S fast "" & w $P-l:10 1 1 $S plain "" &
  w $P-l:10 2 1 $S fast math --set runtime.attention=math --profile 3 &
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 w $P-l:10 3 1 $S fast cdt &
  w $P-l:10 $ALL 2 $S fast "" & w $P-l:10 $ALL 2 $M fast "" & w $P-l:10 $ALL 2 $X fast "" &
  RO="--set runtime.compile_mode=reduce-overhead"
  w $P-l:10 $ALL 1 $S fast graphs $RO --profile 3 & w $P-l:10 0 1 $M fast graphs $RO & w $P-l:10 $ALL 1 $M fast graphs $RO & wait
  phase end; exit 0
fi
if [ "${ONLY:-}" = presets ]; then  # every preset at 1, 2, 4 GPUs and 2 x 2, fast / plain on 1, xl DDP levers
  phase "presets A: small and medium: fast and plain on 1 GPU, fast on 2, 4 and 2 x 2"
  w $P-a:10 0 1 $S fast "" & w $P-a:10 1 1 $S plain "" & w $P-a:10 2 1 $M fast "" & w $P-a:10 3 1 $M plain "" &
  w $P-a:10 0,1 1 $S fast "" & w $P-a:10 0,1,2,3 1 $S fast "" --profile 3 & w $P-a:10 0,1,2,3 2 $S fast "" &
  w $P-a:10 2,3 1 $M fast "" & w $P-a:10 0,1,2,3 1 $M fast "" --profile 3 & w $P-a:10 0,1,2,3 2 $M fast "" & wait
  # xl's all-reduce was not hidden (docs/benchmarks.md 9): 25 MiB buckets start it earlier;
  # one 500 MiB bucket keeps the compiled graph whole (no split per bucket) but overlaps nothing.
  phase "presets B: xl: fast and plain on 1 GPU, fast on 2, 4 and 2 x 2, bucket sizes; small on GPU 3"
  w $P-b:8 0 1 $X fast "" & w $P-b:8 1 1 $X plain "" & w $P-b:8 3 1 $S fast g3 &
  w $P-b:8 2,3 1 $X fast "" & w $P-b:8 0,1,2,3 1 $X fast "" --profile 3 & w $P-b:8 0,1,2,3 2 $X fast "" &
  w $P-b:8 0,1,2,3 1 $X fast b25 --set runtime.ddp_bucket_mb=25 --profile 3 &
  w $P-b:8 0,1,2,3 1 $X fast b500 --set runtime.ddp_bucket_mb=500 & wait
  phase end; exit 0
fi
phase "1: one GPU: fast, fast with channels_last, plain"
w $P-1:9 0 1 $S fast "" & w $P-1:9 0 1 $S fast cl $CL & w $P-1:9 0 1 $X plain "" &
w $P-1:9 1 1 $M fast "" & w $P-1:9 1 1 $S plain "" &
w $P-1:9 2 1 $X fast "" & w $P-1:9 2 1 $X fast cl $CL &
w $P-1:9 3 1 $M plain "" & w $P-1:9 3 1 $M fast cl $CL & wait
phase "2: 2 GPUs, $X on 4"
w $P-2:4 0,1 1 $S fast "" & w $P-2:4 2,3 1 $M fast "" & w $P-2:4 2,3 1 $X fast "" &
w $P-2:4 0,1,2,3 1 $X fast "" --profile 3 & wait
phase "3: 4 GPUs, 2 nodes x 2"
w $P-3:5 0,1,2,3 1 $S fast "" --profile 3 & w $P-3:5 0,1,2,3 1 $M fast "" --profile 3 &
w $P-3:5 0,1,2,3 2 $S fast "" & w $P-3:5 0,1,2,3 2 $M fast "" & w $P-3:5 0,1,2,3 2 $X fast "" & wait
phase end
