#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# bu-scc / any-gpu: 1 node(s) x 2 GPUs per node = 2 ranks; user command: python train.py --name 'it'"'"'s $x'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#$ -N ds-it-s-a-weird-home-date-d-6f2ef2
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o logs/
#$ -pe omp 8
#$ -l h_rt=48:00:00
#$ -l gpus=2
#$ -l gpu_c=7.0
#$ -r y

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $JOB_ID on $(hostname) (restarted: ${RESTARTED:-0})"

# For the command: a job log is a file, which Python block-buffers; unbuffered, what it
# prints appears in the log as it happens.
export PYTHONUNBUFFERED=1


got_signal=0
pids=()

# One host: torchrun starts one process per GPU and picks a free rendezvous port.
/opt/diffscale-venv/bin/python -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=2 --no-python python train.py --name 'it'"'"'s $x' &
pids=($!)

# Wait for every launcher; the job fails when any fails.
rc=0
for pid in "${pids[@]}"; do
    wait "$pid"; one=$?
    while [ "$one" -gt 128 ] && kill -0 "$pid" 2>/dev/null; do wait "$pid"; one=$?; done
    if [ "$one" -gt 128 ]; then wait "$pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && one=$_last; fi
    if [ "$one" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$one; fi
done

echo "diffscale: command exited with $rc"
exit "$rc"
