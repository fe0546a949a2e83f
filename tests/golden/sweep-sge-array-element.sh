#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# sge-two-host / gpu: 1 node(s) x 1 CPU process per node = 1 ranks; user command: python /opt/train.py --name '$(touch /tmp/pwned)' --seed=1 --out '/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003'
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#$ -N ds-003-928fb3
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o logs/
#$ -pe smp 4
#$ -l h_rt=01:00:00
#$ -q all.q
#$ -r y

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $JOB_ID on $(hostname) (restarted: ${RESTARTED:-0})"

# For the command: a job log is a file, which Python block-buffers; unbuffered, what it
# prints appears in the log as it happens.
export PYTHONUNBUFFERED=1

# Set-up: the cluster profile's lines, then --setup's (module load, conda activate, ...)
python_before="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
module load cuda/12.4
# The interpreter: the `python` the set-up lines above put on PATH if they changed it, else the
# one the job was planned with.
job_python=/opt/diffscale-venv/bin/python
python_now="$(command -v python 2>/dev/null || command -v python3 2>/dev/null || true)"
if [ -n "$python_now" ] && [ "$python_now" != "$python_before" ]; then
    job_python="$python_now"
fi
echo "diffscale: python $job_python"
# Variables from the cluster profile (NCCL settings)
export NCCL_SOCKET_IFNAME=eth0


got_signal=0
pids=()

# One host: torchrun starts one process per GPU and picks a free rendezvous port.
"$job_python" -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=1 --no-python python /opt/train.py --name '$(touch /tmp/pwned)' --seed=1 --out '/scratch/it'"'"'s a "weird" $HOME `date` sweep/runs/003' &
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
