#!/bin/bash
# Job script written by diffscale 0.1.0: regenerate it with `diffscale plan` rather than edit it.
# nyu-torch / h200: 1 node(s) x 2 GPUs per node = 2 ranks; diffscale train (preset xl)
# Submit it from the run directory (diffscale submit does): logs/ is relative to it.
#SBATCH --job-name=ds-it-s-a-weird-home-date-d-6f2ef2
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:2
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=04:00:00
#SBATCH --constraint=h200
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR2@120
#SBATCH --requeue

# No `set -e`: the script inspects the training's exit code itself.
set -uo pipefail
RUN_DIR='/scratch/it'"'"'s a "weird" $HOME `date` dir
line two'
cd "$RUN_DIR" || exit 2
echo "diffscale: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"

# For the command: diffscale's cache, where `diffscale plan` looked. Compiled kernels live in its
# kernels/GPU-KIND-torch-VERSION/GRAPH-KEY/: the next job on any node that mounts it starts warm.
export DIFFSCALE_CACHE_DIR='/home/it'"'"'s "me" $USER/.cache/diffscale'

# Rendezvous of every rank: the first host of the allocation, a port derived from the
# job id (diffscale, Lightning and torch env:// all read MASTER_ADDR/MASTER_PORT).
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))

# --signal=B:USR2 reaches only this shell; srun passes it on to every task so
# every rank checkpoints before the time limit.
step_pid=
got_signal=0
forward_signal() {
    got_signal=1
    echo "diffscale: got SIGUSR2 (time limit near): passing it to every rank"
    [ -n "$step_pid" ] && kill -USR2 "$step_pid" 2>/dev/null
}
trap forward_signal USR2
# One task per GPU, all started by srun (srun >= 22.05 needs --cpus-per-task again).
srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=2 --cpus-per-task=4 /opt/diffscale-venv/bin/python -m diffscale train '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two/config.yaml' --out '/scratch/it'"'"'s a "weird" $HOME `date` dir
line two' --resume auto &
step_pid=$!
wait "$step_pid"; rc=$?
while [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid"; rc=$?; done
if [ "$rc" -gt 128 ]; then wait "$step_pid" 2>/dev/null; _last=$?; [ "$_last" -ne 127 ] && rc=$_last; fi

# Exit 85: diffscale checkpointed on the warning signal and is not finished.
# Requeue this job (same id; SLURM_RESTART_COUNT counts the restarts) unless the
# max-restarts guard says the run keeps getting stopped without finishing.
if [ "$rc" -eq 85 ] || { [ "$got_signal" -eq 1 ] && [ "$rc" -ne 0 ]; }; then
    restarts="${SLURM_RESTART_COUNT:-0}"
    if [ "$restarts" -lt 20 ]; then
        echo "diffscale: checkpointed; requeueing job $SLURM_JOB_ID (restart $((restarts + 1)) of 20)"
        if scontrol requeue "$SLURM_JOB_ID"; then
            # a requeued job waits for a begin time in the future; start it as soon as nodes allow
            scontrol update JobId="$SLURM_JOB_ID" StartTime=now 2>/dev/null || true
            exit 0
        fi
        echo "diffscale: scontrol requeue failed; submit the run again to continue" >&2
    else
        echo "diffscale: checkpointed, but the job was already restarted $restarts times (max 20); submit again to continue" >&2
    fi
fi
echo "diffscale: command exited with $rc"
exit "$rc"
